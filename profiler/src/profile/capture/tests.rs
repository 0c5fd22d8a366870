//! Unit tests of the capture format: exact round trips, old versions, corrupt input.
use super::*;
use crate::profile::{Interner, NO_CPU};

/// A profile with one or more of everything the format holds, including the values each
/// version added: binaries and frame addresses, lifetimes, untimed ranges, named counters.
fn sample_profile() -> Profile {
    let mut i = Interner::new(sample_meta());
    let stacks = add_stacks(&mut i);
    add_samples(&mut i, stacks);
    add_process_and_cgroup(&mut i);
    add_lifetimes(&mut i);
    let mut p = i.finish();
    p.runq = Some(sample_runq());
    p
}

/// Waits on two CPUs and in one cgroup, of two threads.
fn sample_runq() -> crate::profile::runq::RunQueue {
    use crate::profile::runq::{CpuWaits, RunQueue, ThreadWaits};
    let mut h = vec![0; profiler_common::runq::BUCKETS];
    h[3] = 5;
    h[19] = 1;
    RunQueue {
        cpus: vec![
            CpuWaits {
                cpu: 0,
                histogram: h.clone(),
                delay_ns: 1_000_050_000,
            },
            CpuWaits {
                cpu: 1,
                histogram: h.clone(),
                delay_ns: 7,
            },
        ],
        cgroups: vec![(42, h)],
        threads: vec![
            ThreadWaits {
                tid: 11,
                pid: 10,
                comm: "ksoftirqd/1".into(),
                cgroup_id: 42,
                runtime_ns: 5_000,
                waits: 6,
                preempted: 2,
                delay_ns: 1_000_050_000,
                max_delay_ns: 1_000_000_000,
                max_end_ns: 1_500_000_000,
                max_cpu: 1,
            },
            ThreadWaits::default(),
        ],
        switches: 1_000,
        threads_lost: 1,
        cgroup_waits_lost: 2,
    }
}

/// 2 s at 99 Hz on two CPUs, with counters, an untimed range and two named counters.
fn sample_meta() -> Meta {
    Meta {
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 123_456,
        duration_ns: 2_000_000_000,
        frequency_hz: 99,
        event: "cpu-clock".into(),
        hostname: "host".into(),
        kernel_release: "6.18".into(),
        cpus: vec![0, 1],
        counters: Counters {
            recorded: 3,
            lost_ringbuf_full: 1,
            filtered: 7,
            kstack_failed: 0,
            ustack_failed: 2,
        },
        untimed: vec![(1_000_000_000, 1_500_000_000)],
        named_counters: vec![
            ("unwind_table_bytes".into(), 188_136),
            ("unwind_evicted".into(), 2),
        ],
    }
}

/// Three stacks over a user binary with a build id and the kernel: `main`, `main` then a
/// kernel frame, and `main` at another address then the same kernel frame.
fn add_stacks(i: &mut Interner) -> [u32; 3] {
    let (main, vm) = (i.string("main"), i.string("vmlinux"));
    let fx = i.binary(Binary {
        path: "/bin/fx".into(),
        build_id: "0123456789abcdef0123456789abcdef01234567".into(),
    });
    let kernel = i.binary(Binary {
        path: "[kernel.kallsyms]".into(),
        build_id: String::new(),
    });
    let f0 = i.frame(Frame {
        name: main,
        module: 0,
        kind: FrameKind::User,
        addr: 0x1139,
        binary: fx,
    });
    let syscall = i.string("do_syscall_64");
    let f1 = i.frame(Frame {
        name: syscall,
        module: vm,
        kind: FrameKind::Kernel,
        addr: 0xffff_ffff_8100_1234,
        binary: kernel,
    });
    // The same function at another address is another frame.
    let f2 = i.frame(Frame {
        name: main,
        kind: FrameKind::User,
        addr: 0x1140,
        binary: fx,
        ..Frame::default()
    });
    assert_ne!(f0, f2);
    [
        i.stack(vec![f0]),
        i.stack(vec![f0, f1]),
        i.stack(vec![f2, f1]),
    ]
}

/// Five samples of one thread, out of time order, one past the declared duration (within the
/// slack) and one untimed.
fn add_samples(i: &mut Interner, [s0, s1, s2]: [u32; 3]) {
    let comm = i.string("fx-chain");
    // The one at 1 s is a stored sample whose time is no longer known (`Meta::untimed`).
    for (t, stack) in [
        (5, s0),
        (3, s1),
        (7, s2),
        (1_000_000_000, s1),
        (10_000_000_000, s0),
    ] {
        i.sample(Sample {
            offset_ns: t,
            cpu: if t == 1_000_000_000 { NO_CPU } else { 1 },
            pid: 42,
            tid: 43,
            cgroup_id: 9,
            comm,
            stack,
        });
    }
}

fn add_process_and_cgroup(i: &mut Interner) {
    i.process(Process {
        pid: 42,
        comm: "fx-chain".into(),
        exe: "/bin/fx".into(),
        cgroup: "/system.slice/fx.service".into(),
        memory_cgroup: "/lab/a".into(),
        cpu_cgroup: String::new(),
    });
    i.cgroup(Cgroup {
        id: 9,
        path: "/system.slice/fx.service".into(),
    });
}

/// One of each: started and killed, started and exited 3, running before and after.
fn add_lifetimes(i: &mut Interner) {
    for (pid, fork_ns, exec_ns, exit_ns, exit_status) in [
        (42, Some(0), Some(1_000), Some(9_000), Some(9)),
        (50, Some(10), None, Some(20), Some(3 << 8)),
        (51, None, None, None, None),
    ] {
        i.lifetime(Lifetime {
            pid,
            ppid: 1,
            comm: "fx-chain".into(),
            exe: "/bin/fx".into(),
            fork_ns,
            exec_ns,
            exit_ns,
            exit_status,
        });
    }
}

#[test]
fn round_trip_is_exact() {
    let p = sample_profile();
    let mut bytes = Vec::new();
    encode(&p, &mut bytes).unwrap();
    assert_eq!(decode(&mut bytes.as_slice()).unwrap(), p);
}

#[test]
fn rejects_other_files_and_newer_versions() {
    assert!(matches!(
        decode(&mut &b"hello world, not a capture"[..]),
        Err(CaptureError::NotCapture)
    ));
    let mut bytes = Vec::new();
    encode(&sample_profile(), &mut bytes).unwrap();
    bytes[8] = 99;
    assert!(matches!(
        decode(&mut bytes.as_slice()),
        Err(CaptureError::NewerVersion(99))
    ));
}

/// Version 1 had no binaries and no frame addresses: it reads with both unknown.
#[test]
fn reads_version_1() {
    let p = sample_profile();
    let mut body = Writer(GzEncoder::new(Vec::new(), Compression::new(6)));
    let m = &p.meta;
    for v in [m.start_unix_ns, m.start_mono_ns, m.duration_ns, 99] {
        body.u(v).unwrap();
    }
    for text in [&m.event, &m.hostname, &m.kernel_release] {
        body.s(text).unwrap();
    }
    body.u(0).unwrap(); // no cpus
    for _ in 0..5 {
        body.u(0).unwrap(); // counters
    }
    body.u(p.strings.len() as u64).unwrap();
    for text in &p.strings {
        body.s(text).unwrap();
    }
    body.u(1).unwrap(); // one frame: main, user
    for v in [1, 0, 1] {
        body.u(v).unwrap();
    }
    for v in [1, 1, 0, 0, 0, 0] {
        body.u(v).unwrap(); // one stack of that frame; no processes, cgroups, samples
    }
    let mut bytes = MAGIC.to_vec();
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(body.0.finish().unwrap());
    let old = decode(&mut bytes.as_slice()).unwrap();
    assert_eq!(old.binaries, [Binary::default()]);
    assert_eq!(old.str(old.frames[0].name), "main");
    assert_eq!((old.frames[0].addr, old.frames[0].binary), (0, 0));
}

/// Version 2 ended with the samples: it reads with no lifetimes; version 3 ended with the
/// lifetimes: it reads with no untimed ranges; version 4 with the named counters: it reads
/// with no run-queue waits.
#[test]
fn reads_versions_2_to_4() {
    let mut p = sample_profile();
    p.runq = None;
    p.meta.untimed.clear();
    p.meta.named_counters.clear();
    for version in [4u32, 3, 2] {
        if version == 2 {
            p.lifetimes.clear();
        }
        let mut bytes = Vec::new();
        encode(&p, &mut bytes).unwrap();
        let mut body = Vec::new();
        GzDecoder::new(&bytes[12..]).read_to_end(&mut body).unwrap();
        for list in [
            "run-queue waits",
            "named counters",
            "untimed ranges",
            "lifetimes",
        ]
        .iter()
        // Version 4 added two sections, 5 one.
        .take(match version {
            4 => 1,
            3 => 3,
            _ => 4,
        }) {
            assert_eq!(body.pop(), Some(0), "the body ends with empty {list}");
        }
        let mut old = MAGIC.to_vec();
        old.extend(version.to_le_bytes());
        let mut gz = GzEncoder::new(old, Compression::new(6));
        gz.write_all(&body).unwrap();
        let old = decode(&mut gz.finish().unwrap().as_slice()).unwrap();
        assert_eq!(old, p, "version {version}");
    }
}

#[test]
fn exit_status_reads_as_code_or_signal() {
    let p = sample_profile();
    let l = &p.lifetimes;
    assert_eq!((l[0].exit_code(), l[0].exit_signal()), (None, Some(9)));
    assert_eq!((l[1].exit_code(), l[1].exit_signal()), (Some(3), None));
    assert_eq!((l[2].exit_code(), l[2].exit_signal()), (None, None));
    assert!(l[0].started() && l[1].started() && !l[2].started());
}

#[test]
fn corrupt_binary_ids_are_rejected() {
    let mut p = sample_profile();
    p.frames[0].binary = 99;
    let mut bytes = Vec::new();
    encode(&p, &mut bytes).unwrap();
    assert!(matches!(
        decode(&mut bytes.as_slice()),
        Err(CaptureError::Corrupt(_))
    ));
}

#[test]
fn truncation_is_reported_not_panicked() {
    let mut bytes = Vec::new();
    encode(&sample_profile(), &mut bytes).unwrap();
    for cut in [13, bytes.len() / 2, bytes.len() - 1] {
        assert!(decode(&mut &bytes[..cut]).is_err(), "cut at {cut} decoded");
    }
}

fn decode_err(p: &Profile) -> String {
    let mut bytes = Vec::new();
    encode(p, &mut bytes).unwrap();
    let e = decode(&mut bytes.as_slice()).unwrap_err();
    assert!(matches!(e, CaptureError::Corrupt(_)), "{e}");
    e.to_string()
}

/// Two samples 10^18 ns apart in a 2 s capture: the per-second tables would need 10^9
/// columns (this aborted `report` with a 72 GB allocation). The reader refuses it.
#[test]
fn samples_past_the_declared_end_are_rejected() {
    let mut p = sample_profile();
    p.samples[3].offset_ns = 1_000_000_000_000_000_000;
    let e = decode_err(&p);
    assert!(e.contains("past the capture's end (2.0 s)"), "{e}");
    // Within the slack (samples drained after the clock was read) is fine.
    p.samples[3].offset_ns = p.meta.duration_ns + END_SLACK_NS;
    let mut bytes = Vec::new();
    encode(&p, &mut bytes).unwrap();
    assert_eq!(decode(&mut bytes.as_slice()).unwrap(), p);
}

/// `start + offset` must not wrap in any output (perf text, --cpus clock, --from/--to).
#[test]
fn a_span_past_64_bit_time_is_rejected() {
    let mut p = sample_profile();
    p.meta.start_unix_ns = u64::MAX - 1_000;
    assert!(decode_err(&p).contains("overflows 64-bit nanoseconds"));
}

#[test]
fn deep_stacks_and_long_strings_are_rejected() {
    let mut p = sample_profile();
    p.stacks[0].frames = vec![0; MAX_STACK_DEPTH + 1];
    assert!(decode_err(&p).contains("a stack of 4097 frames"));
    let mut p = sample_profile();
    p.strings[1] = "x".repeat(MAX_STRING_BYTES + 1);
    assert!(decode_err(&p).contains("a string of 65537 bytes"));
}

/// Millions of empty strings: one byte of body each but 24 bytes of `String`, from a file of a
/// few KB. Charged to the budget, the table is refused before it is built.
#[test]
fn decoded_tables_are_charged_to_the_budget() {
    let mut body = Writer(Vec::new());
    for v in [0, 0, 1, 99] {
        body.u(v).unwrap();
    }
    for _ in 0..3 {
        body.s("").unwrap();
    }
    body.u(0).unwrap(); // cpus
    for _ in 0..5 {
        body.u(0).unwrap();
    }
    // Enough empty strings that their `String`s pass the floor (64 MiB / 24 bytes).
    let n = (BUDGET_FLOOR / 24) + 1;
    body.u(n).unwrap();
    for _ in 0..n {
        body.s("").unwrap();
    }
    let mut bytes = MAGIC.to_vec();
    bytes.extend(CAPTURE_VERSION.to_le_bytes());
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&body.0).unwrap();
    let gz = gz.finish().unwrap();
    assert!(
        (gz.len() as u64) < BUDGET_FLOOR / 24 / MAX_EXPANSION,
        "{}",
        gz.len()
    );
    bytes.extend(gz);
    let e = decode(&mut bytes.as_slice()).unwrap_err();
    assert!(matches!(e, CaptureError::TooLarge), "{e}");
}
