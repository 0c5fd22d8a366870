//! `profiler agent` and `profiler query`: the agent samples a fixture into its store in short
//! windows, serves its HTTP API, and stores the partial window on SIGTERM; bad input gives a
//! clear message. The BPF tests skip with a reason outside CI (see `require_bpf`).

use std::path::Path;
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, Fixture, TempDir, exclusive, expect_success, has_chain, head, read_folded, require_bpf,
    run_profiler, samples, spawn_fixture, svg_frames,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// fx-chain under a comm of its own (`fxa-<pid>`, a copy of the binary): the store keeps
/// every process of the machine, and other runs of fx-chain (short-lived ones, unsymbolized)
/// would otherwise be queried along with ours.
fn fixture(dir: &TempDir) -> (Fixture, String) {
    let comm = format!("fxa-{}", std::process::id());
    let path = dir.path().join(&comm);
    std::fs::copy(env!("FIXTURE_FX_CHAIN"), &path).expect("copying fx-chain");
    (spawn_fixture(&path, 120), comm)
}

/// `profiler query` of the last minute into folded stacks: most samples of `comm` show
/// main;a;b;c. Returns how many samples of `comm` the store holds.
fn assert_query_has_fixture(dir: &TempDir, data_dir: &str, comm: &str) -> u64 {
    let out = dir.file("q.folded");
    let q = run_profiler(
        &[
            "query",
            "--data-dir",
            data_dir,
            "--since",
            "5m",
            "--comm",
            comm,
            "-o",
            &out,
        ],
        TIMEOUT,
    );
    expect_success(&q, "profiler query");
    let (text, stacks) = read_folded(Path::new(&out));
    let total = samples(&stacks, |f| f[0] == comm);
    let chained = samples(&stacks, |f| {
        f[0] == comm && has_chain(f, &["main", "a", "b", "c"], |a, b| a == b)
    });
    assert!(
        total >= 10,
        "only {total} {comm} samples in the store; {}",
        head(&text, 20)
    );
    assert!(
        chained * 100 >= total * 80,
        "{chained} of {total} samples have main;a;b;c; {}",
        head(&text, 20)
    );
    total
}

#[test]
fn agent_windows_http_and_query() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent");
    let data = dir.file("data");
    let (_fx, comm) = fixture(&dir);
    // Only the fixture: whole-machine windows of a debug build took over 20 s each under a load
    // of 22 (builds running), too slow for three in TIMEOUT; what is tested is the windowing.
    let mut agent = Agent::start(&data, &["--window", "2s", "-F", "49", "--comm", &comm]);
    // Three windows or more.
    let start = Instant::now();
    loop {
        let (_, m) = agent.get("/metrics");
        let m = String::from_utf8_lossy(&m).into_owned();
        let stored = m
            .lines()
            .find_map(|l| l.strip_prefix("profiler_windows_total{outcome=\"stored\"} "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if stored >= 3 {
            assert!(
                m.contains(&format!(
                    "profiler_process_cpu_seconds_total{{comm=\"{comm}\"}}"
                )),
                "{m}"
            );
            assert!(m.contains("profiler_agent_resident_memory_bytes "), "{m}");
            assert!(
                m.contains("profiler_samples_lost_total{reason=\"ringbuf_full\"}"),
                "{m}"
            );
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "fewer than 3 windows stored:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(agent.get("/healthz").0, 200);
    for bad in [
        "/api/flamegraph?since=bogus",
        "/api/flamegraph?since=1m&until=2m",
        "/api/flamegraph?sinse=1m",
        "/api/heatmap?since=100d",
        "/debug/pprof/profile?seconds=0",
        "/debug/pprof/profile?seconds=61",
    ] {
        let (status, body) = agent.get(bad);
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
        assert_eq!(String::from_utf8_lossy(&body).trim().lines().count(), 1);
    }
    assert_eq!(agent.get("/nope").0, 404);
    let (status, svg) = agent.get(&format!("/api/flamegraph?since=5m&comm={comm}"));
    let svg = String::from_utf8_lossy(&svg);
    assert_eq!(status, 200, "{svg}");
    let frames = svg_frames(&svg)
        .unwrap_or_else(|e| panic!("/api/flamegraph is not an SVG: {e}; {}", head(&svg, 10)));
    for want in [comm.as_str(), "main", "a", "b", "c"] {
        assert!(
            frames.iter().any(|f| f == want),
            "no frame {want:?} in {frames:?}"
        );
    }
    let (status, html) = agent.get("/api/heatmap?since=5m");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&html).contains("<html"));
    let (status, pb) = agent.get("/debug/pprof/profile?seconds=1");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&pb));
    assert_eq!(&pb[..2], &[0x1f, 0x8b], "pprof is gzipped");
    assert!(agent.stop().success());
    assert_query_has_fixture(&dir, &data, &comm);
}

#[test]
fn sigterm_stores_the_partial_window() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent-term");
    let data = dir.file("data");
    let (_fx, comm) = fixture(&dir);
    // A window far longer than the run: only the flush on SIGTERM can store anything.
    let mut agent = Agent::start(&data, &["--window", "10m", "-F", "49"]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(agent.stop().success());
    let first = assert_query_has_fixture(&dir, &data, &comm);
    // A restart continues with the same store: the second run's window is added to the
    // first's (the fixture is sampled at 49 Hz all along, ~100 samples in 2 s of a busy CPU).
    let mut again = Agent::start(&data, &["--window", "10m", "-F", "49"]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(again.stop().success());
    let both = assert_query_has_fixture(&dir, &data, &comm);
    assert!(
        both > first,
        "the restarted agent stored no {comm} samples: {first} before, {both} after"
    );
}

/// One line on stderr, failing, containing `want`.
fn assert_clear_error(args: &[&str], want: &str) {
    let out = run_profiler(args, TIMEOUT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(
        err.contains(want),
        "{args:?}: stderr lacks {want:?}:\n{err}"
    );
    assert_eq!(
        err.trim().lines().count(),
        1,
        "{args:?}: more than one line:\n{err}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = TempDir::new("agent-bad");
    let config = dir.file("agent.toml");
    std::fs::write(&config, "frequency = 19\nwindoww = \"10s\"\n").unwrap();
    assert_clear_error(&["agent", "--config", &config], "windoww");
    let data = dir.file("data");
    assert_clear_error(
        &[
            "query",
            "--data-dir",
            &data,
            "--since",
            "yesterday",
            "-o",
            &dir.file("x.svg"),
        ],
        "--since",
    );
    assert_clear_error(
        &[
            "query",
            "--data-dir",
            &data,
            "--since",
            "1h",
            "-o",
            &dir.file("x.svg"),
        ],
        "no store",
    );
    // A regular file where the data dir should be: not writable even for root.
    let file = dir.file("plain");
    std::fs::write(&file, "").unwrap();
    assert_clear_error(
        &["agent", "--data-dir", &format!("{file}/data")],
        "cannot use data dir",
    );
    assert_clear_error(&["agent", "--listen", "localhost"], "listen");
    assert_clear_error(
        &["agent", "--data-dir", &data, "--push-url", "ftp://x"],
        "must start with http://",
    );
    assert_clear_error(&["agent", "--max-size", "12 parsecs"], "parsecs");
}

/// A small tmpfs, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Waits until the file at `log` contains `want`.
fn wait_log(log: &str, want: &str) {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(want) {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "no {want:?} in the agent's log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn full_disk_is_logged_and_sampling_goes_on() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent-full");
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&mnt)
        .status()
        .expect("running mount");
    assert!(
        mounted.success(),
        "cannot mount a tmpfs at {}",
        mnt.display()
    );
    let _tmpfs = Tmpfs(mnt.clone());
    let log = dir.file("agent.log");
    let stderr = std::process::Stdio::from(std::fs::File::create(&log).unwrap());
    let data = mnt.join("data").to_str().unwrap().to_owned();
    let mut agent = Agent::start_with(&data, &["--window", "1s"], stderr);
    // Fill the disk: the write fails once the tmpfs is full, which is the point.
    let filler = mnt.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 32 << 20]);
    wait_log(&log, "cannot write to the store");
    // /healthz says 503 while the store fails (agent_hostile.rs checks it); the API answers.
    assert_eq!(agent.get("/metrics").0, 200, "the agent must keep running");
    std::fs::remove_file(&filler).unwrap();
    wait_log(&log, "the store works again");
    assert!(agent.stop().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("the last window is stored"), "{text}");
}
