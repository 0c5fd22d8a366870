//! Deterministic mutation fuzzing of every parser of bytes we do not control (issue 15): the
//! capture reader, folded stacks, perf maps, the agent's TOML config, the HTTP request head,
//! and the /proc and /sys text we parse (cgroup, mountinfo, status NSpid, /proc/cgroups,
//! cgroup.stat-style key files, kallsyms). Each parser gets `CASES` inputs made from real-shaped
//! seeds by a fixed-seed PRNG: bit flips, truncations, splices, repeated chunks, huge numbers,
//! separators. Each case must not panic, must stay within a memory bound linear in its input
//! (a counting global allocator measures the peak), and an error must be one line.
//! Runs in plain `cargo test` (no nightly, no cargo-fuzz); a failure prints the case to replay.

mod fuzz_harness;

use std::io::Write as _;

use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use profiler::{
    profile::{self, BUDGET_FLOOR, MAX_EXPANSION},
    untrusted::{
        AgentConfig, FileConfig, KernelSymbols, cgroups, collect,
        output::{self, diff},
    },
};

use fuzz_harness::{fuzz, linear, measured, one_line};

// --- the parsers ---------------------------------------------------------------------------

/// A small, real-shaped profile: kernel and user frames, two processes, a cgroup.
fn seed_profile(samples: u64) -> profile::Profile {
    use profile::{Binary, Cgroup, Frame, FrameKind, Interner, Meta, Process, Sample};
    let mut i = Interner::new(Meta {
        start_unix_ns: 1_764_600_000_000_000_000,
        start_mono_ns: 5_000_000_000,
        duration_ns: 2_000_000_000,
        frequency_hz: 99,
        event: "cpu-clock".into(),
        hostname: "host".into(),
        kernel_release: "6.18.0".into(),
        cpus: vec![0, 1],
        ..Meta::default()
    });
    let bin = i.binary(Binary {
        path: "/usr/bin/app".into(),
        build_id: "0123456789abcdef".into(),
    });
    let names = [
        "main",
        "work",
        "do_syscall_64",
        "<impl Foo for Bar>::run",
        "[unknown]",
    ];
    let vm = i.string("vmlinux");
    let frames: Vec<u32> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let name = i.string(n);
            let kernel = *n == "do_syscall_64";
            i.frame(Frame {
                name,
                module: if kernel { vm } else { 0 },
                kind: if kernel {
                    FrameKind::Kernel
                } else {
                    FrameKind::User
                },
                addr: 0x1000 + k as u64 * 16,
                binary: if kernel { 0 } else { bin },
            })
        })
        .collect();
    let stacks = [
        i.stack(vec![frames[0], frames[1]]),
        i.stack(vec![frames[0], frames[3], frames[2]]),
        i.stack(vec![frames[4]]),
    ];
    let comms = [i.string("app"), i.string("swapper/0")];
    for k in 0..samples {
        i.sample(Sample {
            offset_ns: k * 10_000_000,
            cpu: (k % 2) as u32,
            pid: if k % 5 == 0 { 0 } else { 42 },
            tid: 43,
            cgroup_id: 7,
            comm: comms[usize::from(k % 5 == 0)],
            stack: stacks[k as usize % 3],
        });
    }
    i.process(Process {
        pid: 42,
        comm: "app".into(),
        exe: "/usr/bin/app".into(),
        cgroup: "/system.slice/app.service".into(),
        ..Process::default()
    });
    i.cgroup(Cgroup {
        id: 7,
        path: "/system.slice/app.service".into(),
    });
    i.finish()
}

/// Captures that decoded, to show how deep the mutations reach.
static DECODED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Decodes one capture and, when it decodes, renders what `report` would from it.
fn check_capture(bytes: &[u8]) -> usize {
    match profile::decode(&mut &bytes[..]) {
        Ok(p) => {
            DECODED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let lines = output::folded_lines(&p);
            assert!(lines.len() <= p.samples.len());
            let mut sink = Vec::new();
            output::write_perf_text(&p, &mut sink).unwrap();
            output::write_pprof(&p, &mut sink).unwrap();
            // The per-second tables of spans up to their bound (a day) take tens of MB each:
            // hostile_inputs covers those; here, the short ones, for time.
            if profile::Span::of(&p).cols <= 600 {
                let _ = output::heatmap_data(&p);
                let _ = profile::cpu_table(&p, &profile::Filter::default());
            }
        }
        Err(e) => one_line("capture", &e.to_string()),
    }
    // The documented bound: the budget, and the inflated body's buffer may double once.
    2 * (BUDGET_FLOOR + MAX_EXPANSION * bytes.len() as u64) as usize
}

#[test]
fn capture_file() {
    let seeds: Vec<Vec<u8>> = [3, 40]
        .into_iter()
        .map(|n| {
            let mut out = Vec::new();
            profile::encode(&seed_profile(n), &mut out).unwrap();
            out
        })
        .collect();
    let refs: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
    fuzz("capture (file bytes)", &refs, check_capture);
    let decoded = || DECODED.swap(0, std::sync::atomic::Ordering::Relaxed);
    eprintln!("capture (file bytes): {} decoded", decoded());
    // Mutating the compressed bytes mostly trips gzip's CRC: also mutate the inflated body
    // and compress it again, so the body's parser sees the mutations.
    let bodies: Vec<Vec<u8>> = seeds
        .iter()
        .map(|s| {
            let mut body = Vec::new();
            std::io::Read::read_to_end(&mut GzDecoder::new(&s[12..]), &mut body).unwrap();
            body
        })
        .collect();
    let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    fuzz("capture (body)", &refs, |body| {
        let mut file = seeds[0][..12].to_vec();
        // Stored blocks: compressing in a debug build would be most of the test's time.
        let mut gz = GzEncoder::new(&mut file, Compression::none());
        gz.write_all(body).unwrap();
        gz.finish().unwrap();
        check_capture(&file).max(linear(body, 64, 1 << 20))
    });
    eprintln!("capture (body): {} decoded", decoded());
}

/// A gzip bomb: 1 MB that inflates to 1 GB of zeros (this took 1.1 GB before the budget).
/// Built from one sync-flushed deflate block of 1 MiB of zeros, repeated: each copy starts
/// afresh (a literal then distance-1 matches), so the repetition is a valid stream.
#[test]
fn gzip_bomb_stays_within_the_budget() {
    let mut deflate = flate2::Compress::new(Compression::best(), false);
    let mut block = Vec::with_capacity(4 << 10);
    deflate
        .compress_vec(&vec![0u8; 1 << 20], &mut block, flate2::FlushCompress::Sync)
        .unwrap();
    let mut bomb = profile::MAGIC.to_vec();
    bomb.extend(profile::CAPTURE_VERSION.to_le_bytes());
    bomb.extend([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    while bomb.len() < 1_000_000 {
        bomb.extend(&block);
    }
    let copies = (bomb.len() - 22) / block.len();
    // A final empty block, then a trailer (never reached: the budget stops the reader first).
    bomb.extend([0x03, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]);
    let (result, peak) = measured(|| profile::decode(&mut bomb.as_slice()));
    let e = result.expect_err("a bomb is not a capture");
    assert!(
        matches!(e, profile::CaptureError::TooLarge),
        "{copies} MiB of zeros in {} bytes: {e}",
        bomb.len()
    );
    let budget = BUDGET_FLOOR + MAX_EXPANSION * bomb.len() as u64;
    eprintln!(
        "a {} byte bomb of {copies} MiB: refused after {} MB allocated (budget {} MB)",
        bomb.len(),
        peak >> 20,
        budget >> 20
    );
    assert!(peak as u64 <= 2 * budget, "peak {peak} bytes");
}

#[test]
fn folded_stacks() {
    fuzz(
        "folded",
        &[
            b"app;main;work 10\napp;main;do_syscall_64_[k] 3\n",
            b"swapper/0;cpu_startup_entry;do_idle 990\n# comment\n\nx;<impl A for B>::f 1\n",
            b"a;b 18446744073709551615\n",
        ],
        |bytes| {
            let text = String::from_utf8_lossy(bytes);
            let mut bound = linear(bytes, 48, 64 << 10);
            match diff::parse_folded(&text) {
                Ok(f) => {
                    assert!(f.len() <= text.lines().count());
                    let t = diff::top_changes(&f, &f, 3);
                    assert!(t.self_share.is_empty(), "a profile moved against itself");
                    // inferno's differential flame graph, against a small profile (counts near
                    // 2^63 overflowed its signed differences); on a quarter of the small inputs,
                    // for time.
                    if bytes.len() <= 1024 && bytes.len() % 4 == 0 {
                        let other = diff::parse_folded("app;main;work 3\n").unwrap();
                        let mut svg = Vec::new();
                        diff::write_diff_svg(&other, &f, &mut svg).unwrap();
                        diff::write_diff_svg(&f, &other, &mut svg).unwrap();
                        // A box of SVG per frame: the output's size, not the parser's.
                        bound = linear(bytes, 4096, 1 << 20);
                    }
                }
                Err(e) => one_line("folded", &e.to_string()),
            }
            bound
        },
    );
}

#[test]
fn perf_map() {
    fuzz(
        "perf map",
        &[
            b"7f0000001000 40 LazyCompile:~main /app.js:1\n7f0000001040 20 Builtin:Foo\n",
            b"0x3000 10 [jit] a\n3010 0 zero size\n2ff0 100 overlapping name\n",
        ],
        |bytes| {
            let map = collect::PerfMap::parse_from(bytes);
            for addr in [0, 0x3005, 0x7f00_0000_1010, u64::MAX] {
                let _ = map.lookup(addr);
            }
            linear(bytes, 48, 4 << 10)
        },
    );
}

/// The file handling of `FileConfig::load` (regular files only, size cap) has its own unit
/// test; writing 10,000 files would be most of this test's time.
#[test]
fn agent_config_file() {
    let path = std::path::Path::new("/etc/profiler/agent.toml");
    fuzz(
        "agent config",
        &[
            b"frequency = 19\nwindow = \"10s\"\ndata-dir = \"/var/lib/profiler\"\n",
            b"retention = \"3d\"\nmax-size = \"500MiB\"\nlisten = \"127.0.0.1:7070\"\ncomm = [\"a\", \"b\"]\n",
            b"push_url = \"http://127.0.0.1:4040\"\nmax_size = \"2GiB\"\n",
        ],
        |bytes| {
            match std::str::from_utf8(bytes).map(|text| FileConfig::parse(text, path)) {
                Ok(Ok(file)) => {
                    // The line the CLI prints: the error and its causes (`{:#}`).
                    if let Err(e) = file.apply(&mut AgentConfig::default()) {
                        one_line("config apply", &format!("{:#}", anyhow::Error::from(e)));
                    }
                }
                Ok(Err(e)) => one_line("config", &format!("{:#}", anyhow::Error::from(e))),
                Err(_) => {} // `load` refuses non-UTF-8 before parsing
            }
            linear(bytes, 256, 1 << 20)
        },
    );
}

#[test]
fn http_request_head() {
    fuzz(
        "http head",
        &[
            b"GET /api/heatmap?since=1h&until=now&comm=fx%2Dchain+x HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /healthz HTTP/1.0\r\n\r\n",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
        ],
        |bytes| {
            match profiler::untrusted::parse_request(bytes) {
                // Invalid UTF-8 becomes U+FFFD: 3 bytes for 1.
                Ok(r) => assert!(r.path.len() <= 3 * bytes.len() && r.query.len() <= bytes.len()),
                Err(resp) => {
                    assert!((400..500).contains(&resp.status), "{}", resp.status);
                    one_line("http", &String::from_utf8_lossy(&resp.body));
                }
            }
            // Per `&k=v` (2+ bytes) a 48-byte pair in a vector that may double once.
            linear(bytes, 64, 4 << 10)
        },
    );
}

#[test]
fn proc_pid_cgroup() {
    fuzz(
        "/proc/PID/cgroup",
        &[
            b"12:memory:/kubepods/pod1/abc\n11:cpu,cpuacct:/kubepods/pod1/abc\n0::/kubepods.slice/x\n",
            b"0::/system.slice/app.service\n",
        ],
        |bytes| {
            let _ = cgroups::parse_proc_cgroup(&String::from_utf8_lossy(bytes));
            linear(bytes, 8, 4 << 10)
        },
    );
}

const MOUNTINFO: &[u8] = b"22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
";

#[test]
fn mountinfo() {
    fuzz("mountinfo", &[MOUNTINFO], |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let mounts = cgroups::parse_mountinfo(&text);
        let _ = cgroups::mount_of(&mounts, "memory");
        let _ = cgroups::v2_mount(&mounts);
        linear(bytes, 64, 4 << 10)
    });
}

#[test]
fn proc_pid_status() {
    fuzz(
        "/proc/PID/status",
        &[
            b"Name:\tnode\nTgid:\t4242\nPid:\t4242\nPPid:\t1\nNSpid:\t4242\t17\nVmRSS:\t1024 kB\n",
            b"Name:\tbash\nNSpid:\t9\n",
        ],
        |bytes| {
            let _ = collect::ns_pid(&String::from_utf8_lossy(bytes));
            linear(bytes, 4, 4 << 10)
        },
    );
}

#[test]
fn proc_cgroups_and_key_value_files() {
    fuzz(
        "/proc/cgroups, cgroup.stat, meminfo, slabinfo",
        &[
            b"#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\nmemory\t4\t812\t1\n",
            b"nr_descendants 3\nnr_dying_descendants 500\n",
            b"MemTotal:       24683584 kB\nSlab:             500000 kB\n",
            b"slabinfo - version: 2.1\nkmalloc-64  123 456 64 64 1 : tunables 0 0 0\n",
        ],
        |bytes| {
            let text = String::from_utf8_lossy(bytes);
            let _ = cgroups::parse_proc_cgroups(&text);
            let _ = cgroups::stat_value(&text, "nr_dying_descendants");
            let _ = cgroups::meminfo_kb(&text, "Slab");
            let _ = cgroups::slab_active_objects(&text, "kmalloc-64");
            linear(bytes, 64, 4 << 10)
        },
    );
}

#[test]
fn kallsyms() {
    fuzz(
        "/proc/kallsyms",
        &[
            b"ffffffff81000000 T _text\nffffffff81003000 T __x64_sys_read\nffffffffc0001000 t e1000_clean\t[e1000]\n",
            b"0000000000000000 T hidden\n0000000000000000 t also_hidden\n",
        ],
        |bytes| {
            let syms = KernelSymbols::parse(&String::from_utf8_lossy(bytes));
            for addr in [0, 0xffff_ffff_8100_3010, 0xffff_ffff_c000_1010, u64::MAX] {
                let _ = syms.lookup(addr);
            }
            // Per symbol a 16-byte entry and its name, in vectors that may double once; and,
            // whatever the input, the deflate compressor the names go through (its state
            // is about 300 KB: measured 319,816 bytes of peak for a 98-byte input).
            linear(bytes, 96, 512 << 10)
        },
    );
}

/// The unwind-table compiler reads `.eh_frame` of every binary a profiled process maps: any
/// user can hand it one (their own program). Mutated `.eh_frame` bytes are put back into a
/// real ELF (coreutils' `true`, in every Debian system) at the section's place, so the
/// ELF reader accepts the file and gimli's CFI parser and our row conversion get the
/// mutations; the whole mutated bytes are also parsed as a file.
#[test]
fn unwind_tables_from_eh_frame() {
    use object::{Object as _, ObjectSection as _};
    let elf = std::fs::read("/usr/bin/true").expect("read /usr/bin/true (coreutils)");
    let (offset, size) = {
        let file = object::File::parse(elf.as_slice()).expect("parse /usr/bin/true");
        let section = file
            .section_by_name(".eh_frame")
            .expect("/usr/bin/true has .eh_frame");
        let (offset, size) = section.file_range().expect(".eh_frame is in the file");
        (offset as usize, size as usize)
    };
    let seed = elf[offset..offset + size].to_vec();
    let reference = profiler::untrusted::unwind::compile(&elf).expect("the seed compiles");
    assert!(
        reference.rows.len() > 50,
        "too few rows to mutate: {}",
        reference.rows.len()
    );
    let mut patched = elf.clone();
    fuzz("unwind table (.eh_frame)", &[&seed], |bytes| {
        // The section keeps its size: a shorter input leaves zeros, which end the CIE list.
        let n = bytes.len().min(size);
        patched[offset..offset + size].fill(0);
        patched[offset..offset + n].copy_from_slice(&bytes[..n]);
        if let Ok(table) = profiler::untrusted::unwind::compile(&patched) {
            for pc in [0, 0x1000, 0x4000, u64::MAX] {
                let _ = table.lookup(pc);
            }
        }
        let _ = profiler::untrusted::unwind::compile(&bytes);
        let _ = profiler::untrusted::unwind::mapping_bias(bytes, 0x5555_0000_0000, 0);
        // Rows and spans grow with CFI instructions, so with the bytes; gimli's context is fixed.
        linear(bytes, 64, 256 << 10)
    });
}

/// The unwind-table cache (`unwind::cache`) reads files from a directory on disk: a damaged
/// or crafted file must be refused, never panic or hand the kernel unsorted rows. Mutations
/// are tried as they are and with their checksum made right again (what a crafted file
/// would do), so the row checks behind the checksum get them too.
#[test]
fn unwind_table_cache_files() {
    use profiler::untrusted::unwind as table;
    use profiler::untrusted::unwind as cache;
    let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("Debian's libc");
    let mut small = table::compile(&libc).expect("libc compiles");
    small.rows.truncate(300);
    let end = small.rows[299].pc;
    small.padding.retain(|pc| *pc < end);
    assert!(
        !small.padding.is_empty(),
        "the seed has padding gaps to mutate"
    );
    let id = [3u8; 20];
    let seed = cache::encode(&small, &id);
    assert!(cache::decode(&seed, &id).is_ok());
    fuzz("unwind table cache file", &[&seed], |bytes| {
        let mut resealed = bytes.to_vec();
        if resealed.len() >= 56 {
            let mut crc = flate2::Crc::new();
            crc.update(&resealed[..52]);
            crc.update(&resealed[56..]);
            resealed[52..56].copy_from_slice(&crc.sum().to_le_bytes());
        }
        for input in [bytes, &resealed[..]] {
            match cache::decode(input, &id) {
                Ok(t) => {
                    assert!(
                        t.rows.windows(2).all(|w| w[0].pc < w[1].pc),
                        "unsorted rows"
                    );
                    // Header, rows, padding count and pcs.
                    assert_eq!(56 + t.rows.len() * 8 + 4 + t.padding.len() * 4, input.len());
                    // Padding names gap rows only, never the last (whose range has no end).
                    for pc in &t.padding {
                        let at = t.rows.partition_point(|r| r.pc < *pc);
                        assert!(
                            at + 1 < t.rows.len() && t.rows[at].pc == *pc,
                            "padding {pc:#x}"
                        );
                        assert_eq!(t.rows[at].kind, profiler_common::unwind::kind::NONE);
                    }
                }
                Err(e) => one_line("unwind cache", &e.to_string()),
            }
        }
        // The rows and the resealed copy: a few times the input.
        linear(bytes, 8, 64 << 10)
    });
}
