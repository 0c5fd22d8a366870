//! A hostile local user against the root profiler (issue 15): fx-jit runs as `nobody` in a
//! private mount namespace whose /tmp belongs to it (as in a container), runs code in
//! anonymous memory at a known address, and leaves its /tmp/perf-PID.map to the test, which
//! makes it a symlink to a root-only secret, a FIFO nobody writes, a link to /dev/zero, a
//! 1 GB sparse file, a 50 MB name, or an absolute symlink that means another file on the host.
//! `record` must stay safe: nothing leaked, no hang, bounded memory, names capped.

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::{PermissionsExt as _, lchown, symlink};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, TempDir, exclusive, expect_success, read_folded, require_bpf, samples,
};

/// `nobody` and `nogroup` on Debian.
const NOBODY: u32 = 65534;
/// Where fx-jit maps its code (MAP_FIXED_NOREPLACE), so the maps written here name it.
const JIT_ADDR: &str = "7f0000000000";
/// A recording may take this long before the test calls it hung (BPF loading on a busy,
/// cold machine included): it catches hangs, it is not a performance bound.
const HANG: Duration = Duration::from_secs(90);
/// Peak RSS the profiler may reach on hostile maps (issue 15: 2.1 GB on /dev/zero before).
const MAX_RSS_KB: i64 = 100 << 10;

/// fx-jit as `nobody` in a private mount namespace with a tmpfs /tmp owned by nobody (not
/// sticky: the container case, where no kernel protection of /tmp links applies). Killed on
/// drop. The fixture is opened before the tmpfs goes over /tmp: a checkout under /tmp (a CI
/// clone) would otherwise be hidden by it.
struct Hostile {
    child: Child,
}

impl Hostile {
    fn start() -> Self {
        let script = format!(
            "exec 3<\"$0\" && \
             mount -t tmpfs -o mode=0755,uid={NOBODY},gid={NOBODY} none /tmp && \
             cat <&3 >/tmp/fx-jit && exec 3<&- && chmod 0755 /tmp/fx-jit && \
             exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups /tmp/fx-jit 30 - {JIT_ADDR}"
        );
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .arg(env!("FIXTURE_FX_JIT"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start unshare (util-linux)");
        let hostile = Self { child };
        let start = Instant::now();
        let comm = format!("/proc/{}/comm", hostile.pid());
        while fs::read_to_string(&comm).map_or(true, |c| c.trim_end() != "fx-jit") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "fx-jit did not start as nobody in its mount namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = fs::read_to_string(format!("/proc/{}/status", hostile.pid())).unwrap();
        assert!(
            status.contains(&format!("Uid:\t{NOBODY}\t{NOBODY}")),
            "fx-jit does not run as nobody"
        );
        hostile
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `name` in the fixture's own /tmp, as the host's root sees it.
    fn tmp(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/tmp/{name}", self.pid()))
    }

    /// Its perf map's path.
    fn map(&self) -> PathBuf {
        self.tmp(&format!("perf-{}.map", self.pid()))
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a recording left: the folded text and the decompressed pprof, plus its peak RSS.
struct Recorded {
    _dir: TempDir,
    folded: String,
    stacks: Vec<profiler_tests::Stack>,
    pprof: Vec<u8>,
    max_rss_kb: i64,
}

/// `record --comm fx-jit -F 999 --unwind fp -d 3s` into .folded and .pb.gz, run as a child whose
/// peak RSS is taken from wait4 (this child's alone). 999 Hz: under a load of 22 on 2 CPUs fx-jit
/// got 25-44 samples in 3 s at the default rate, fewer than `jit_samples` needs. `--unwind fp`:
/// the table walk's row array (64 MiB, mapped into record) would count in the peak RSS and
/// leave no room under MAX_RSS_KB for what is tested here, the perf map's reading. Its address space is capped at 2 GiB (record needs
/// less than 1 GiB) so a build that reads /dev/zero to the end fails this test instead of
/// exhausting the machine.
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which also gives its rusage"
)]
fn record_hostile(label: &str) -> Recorded {
    let dir = TempDir::new(label);
    let (folded, pprof) = (dir.file("out.folded"), dir.file("out.pb.gz"));
    let args = [
        "record", "--comm", "fx-jit", "-F", "999", "--unwind", "fp", "-d", "3s", "-o", &folded,
        "-o", &pprof,
    ];
    let mut cmd = Command::new(profiler_tests::profiler_bin());
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null());
    cmd.stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the forked child.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 2 << 30,
                rlim_max: 2 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &raw const lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("start profiler record");
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let pid = child.id() as i32;
    let start = Instant::now();
    let (status, rusage) = loop {
        // SAFETY: rusage is plain integers (all zero is valid); wait4 writes the status and
        // rusage we pass, for our own child.
        let (mut status, mut rusage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
        let got = unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut rusage) };
        if got == pid {
            break (status, rusage);
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "record did not finish within {HANG:?} (hung on the perf map?); stderr:\n{}",
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = stderr.join().unwrap();
    let output = std::process::Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout: Vec::new(),
        stderr: stderr.into_bytes(),
    };
    expect_success(&output, "record");
    let (text, stacks) = read_folded(Path::new(&folded));
    let gz = Command::new("gzip")
        .args(["-dc", &pprof])
        .output()
        .expect("gzip");
    assert!(gz.status.success(), "{pprof} is not gzip");
    Recorded {
        _dir: dir,
        folded: text,
        stacks,
        pprof: gz.stdout,
        max_rss_kb: rusage.ru_maxrss,
    }
}

/// fx-jit was sampled enough for its map to matter; returns (its samples, those whose leaf
/// is `leaf`).
fn jit_samples(r: &Recorded, leaf: impl Fn(&str) -> bool) -> (u64, u64) {
    let total = samples(&r.stacks, |f| f[0] == "fx-jit");
    let hit = samples(&r.stacks, |f| {
        f[0] == "fx-jit" && f.last().is_some_and(|l| leaf(l))
    });
    eprintln!("fx-jit: {hit} of {total} samples with the expected leaf");
    assert!(total >= 50, "only {total} samples; {}", short(&r.folded));
    (total, hit)
}

/// Most fx-jit samples end in `[unknown]`: the map was not used.
fn check_unnamed(r: &Recorded) {
    let (total, unknown) = jit_samples(r, |l| l == "[unknown]");
    assert!(
        unknown * 100 >= total * 80,
        "only {unknown} of {total} fx-jit samples end in [unknown]; {}",
        short(&r.folded)
    );
}

/// The first lines of folded output, each cut short: a hostile name may be megabytes long.
fn short(folded: &str) -> String {
    let lines: Vec<String> = folded
        .lines()
        .take(20)
        .map(|l| l.chars().take(300).collect())
        .collect();
    format!("first stacks:\n{}", lines.join("\n"))
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Runs `body` if this host can load BPF and run fx-jit (x86-64), one test at a time.
fn privileged(body: impl FnOnce()) {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: fx-jit carries x86-64 machine code");
        return;
    }
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    body();
}

#[test]
fn perf_map_symlink_to_a_root_only_file_leaks_nothing() {
    privileged(|| {
        // Outside the fixture's /tmp, so the link reaches it from inside its root too.
        let secret = PathBuf::from(format!("/var/tmp/profiler-secret-{}", std::process::id()));
        fs::write(&secret, format!("{JIT_ADDR} 1000 SECRET_TOKEN_abc\n")).unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        let fx = Hostile::start();
        symlink(&secret, fx.map()).unwrap();
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        let r = record_hostile("secret");
        let _ = fs::remove_file(&secret);
        assert!(
            !r.folded.contains("SECRET_TOKEN"),
            "the secret is in .folded"
        );
        assert!(
            !contains(&r.pprof, "SECRET_TOKEN"),
            "the secret is in .pb.gz"
        );
        check_unnamed(&r);
    });
}

#[test]
fn absolute_symlink_resolves_inside_the_process_root() {
    privileged(|| {
        let name = format!("profiler-hostile-{}-inner.map", std::process::id());
        let host = Path::new("/tmp").join(&name);
        fs::write(&host, format!("{JIT_ADDR} 1000 name_on_the_host\n")).unwrap();
        lchown(&host, Some(NOBODY), Some(NOBODY)).unwrap();
        let fx = Hostile::start();
        fs::write(fx.tmp(&name), format!("{JIT_ADDR} 1000 name_in_its_root\n")).unwrap();
        lchown(fx.tmp(&name), Some(NOBODY), Some(NOBODY)).unwrap();
        symlink(&host, fx.map()).unwrap();
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        let r = record_hostile("inroot");
        let _ = fs::remove_file(&host);
        assert!(
            !r.folded.contains("name_on_the_host"),
            "the link was resolved against the host's root"
        );
        let (total, named) = jit_samples(&r, |l| l == "name_in_its_root");
        assert!(
            named * 100 >= total * 80,
            "only {named} of {total} fx-jit samples named from its own root; {}",
            short(&r.folded)
        );
    });
}

#[test]
fn perf_map_fifo_does_not_hang_record() {
    privileged(|| {
        let fx = Hostile::start();
        let fifo = std::ffi::CString::new(fx.map().to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        // record_hostile fails the test if record does not finish: nobody ever writes.
        let r = record_hostile("fifo");
        check_unnamed(&r);
    });
}

#[test]
fn perf_map_to_dev_zero_or_a_sparse_gigabyte_keeps_memory_bounded() {
    privileged(|| {
        let fx = Hostile::start();
        symlink("/dev/zero", fx.map()).unwrap();
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        let zero = record_hostile("zero");
        drop(fx);
        let fx = Hostile::start();
        let sparse = fs::File::create(fx.map()).unwrap();
        sparse.set_len(1 << 30).unwrap();
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        let sparse = record_hostile("sparse");
        for (what, r) in [("/dev/zero", &zero), ("1 GB sparse file", &sparse)] {
            eprintln!("{what}: record peak RSS {} KiB", r.max_rss_kb);
            check_unnamed(r);
            assert!(
                r.max_rss_kb < MAX_RSS_KB,
                "{what} as perf map: record peaked at {} KiB RSS",
                r.max_rss_kb
            );
        }
    });
}

#[test]
fn a_50_mb_name_is_capped() {
    privileged(|| {
        let fx = Hostile::start();
        let mut map = format!("{JIT_ADDR} 1000 ").into_bytes();
        map.resize(map.len() + (50 << 20), b'N');
        map.push(b'\n');
        fs::write(fx.map(), &map).unwrap();
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        drop(map);
        let r = record_hostile("longname");
        let (total, capped) = jit_samples(&r, |l| {
            l.starts_with("NNNN") && l.ends_with("[...]") && l.len() == 1024 + 5
        });
        assert!(
            capped * 100 >= total * 80,
            "only {capped} of {total} fx-jit samples end in the capped name; {}",
            short(&r.folded)
        );
        eprintln!(
            "outputs: {} bytes folded, {} bytes pprof, peak RSS {} KiB",
            r.folded.len(),
            r.pprof.len(),
            r.max_rss_kb
        );
        assert!(r.folded.len() < 1 << 20, "{} bytes folded", r.folded.len());
        assert!(r.pprof.len() < 1 << 20, "{} bytes pprof", r.pprof.len());
    });
}

/// The agent serves HTTP on the thread that drains samples: a FIFO as perf map must not
/// freeze it. /healthz and /metrics answer throughout, and windows keep being stored.
#[test]
fn agent_keeps_answering_with_a_fifo_perf_map() {
    privileged(|| {
        let fx = Hostile::start();
        let fifo = std::ffi::CString::new(fx.map().to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        lchown(fx.map(), Some(NOBODY), Some(NOBODY)).unwrap();
        let dir = TempDir::new("agent-fifo");
        let data = dir.file("data");
        let mut agent = Agent::start(&data, &["--window", "1s", "--comm", "fx-jit"]);
        let start = Instant::now();
        // Every window reads the map again (its JIT code stays unnamed): three of them.
        loop {
            let (status, _) = agent.get("/healthz");
            assert_eq!(status, 200, "/healthz");
            let (_, m) = agent.get("/metrics");
            let stored = String::from_utf8_lossy(&m)
                .lines()
                .find_map(|l| l.strip_prefix("profiler_windows_total{outcome=\"stored\"} "))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            if stored >= 3 {
                break;
            }
            assert!(start.elapsed() < HANG, "only {stored} windows stored");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(agent.stop().success(), "the agent did not stop cleanly");
    });
}
