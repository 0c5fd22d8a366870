//! The agent as one pipeline (issue 12 items 2-3, issue 10 item 6, issue 17 item 4):
//! /debug/pprof/profile cuts its profiles from the running sampler (concurrent requests
//! share it, no request loads a BPF program of its own, go's pprof reads each), a slow store
//! makes the agent drop windows it counts rather than lose samples silently, and the agent's
//! defaults walk whole stacks through code without frame pointers and name Python frames.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, TempDir, exclusive, go_tool_pprof, head, pprof_weighted_traces, read_folded,
    require_bpf, run_profiler, samples, spawn_fixture, spawn_fixture_args, tool,
};

const TIMEOUT: Duration = Duration::from_secs(120);

/// The ids of the BPF programs `pid` holds, from its fds' fdinfo.
fn bpf_programs(pid: u32) -> BTreeSet<u32> {
    let dir = format!("/proc/{pid}/fdinfo");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// The value of the series `name` (with its labels) in a /metrics text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}")) as u64
}

/// The agent's profile of the next `secs` seconds, as `go tool pprof -traces` shows it (each
/// distinct stack's function names, leaf first, with its samples), and `-raw`'s period line.
fn live_traces(
    go: &Path,
    dir: &TempDir,
    agent: &Agent,
    secs: u32,
) -> (Vec<(u64, Vec<String>)>, String) {
    let (status, body) = agent.get(&format!("/debug/pprof/profile?seconds={secs}"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let file = dir.file("live.pb.gz");
    std::fs::write(&file, body).unwrap();
    let traces = pprof_weighted_traces(&go_tool_pprof(go, dir.path(), &["-traces", &file]));
    let raw = go_tool_pprof(go, dir.path(), &["-raw", &file]);
    let period = raw
        .lines()
        .find(|l| l.starts_with("Period:"))
        .unwrap_or("")
        .to_owned();
    let ns: f64 = period
        .trim_start_matches("Period:")
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no period in -raw: {}", head(&raw, 5)));
    let traces = traces
        .into_iter()
        .map(|(value, names)| ((value / ns).round() as u64, names))
        .collect();
    (traces, period)
}

/// Samples whose stack passes `pred`, and all samples.
fn share(traces: &[(u64, Vec<String>)], pred: impl Fn(&[String]) -> bool) -> (u64, u64) {
    let total = traces.iter().map(|(n, _)| n).sum();
    let matching = traces.iter().filter(|(_, t)| pred(t)).map(|(n, _)| n).sum();
    (matching, total)
}

#[test]
fn pprof_requests_share_the_running_sampler() {
    if !require_bpf() {
        return;
    }
    let Some(go) = tool("go", "golang-go") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("agent-pprof-shared");
    let _fx = spawn_fixture(Path::new(env!("FIXTURE_FX_CHAIN")), 120);
    // Only the fixture: the debug build symbolizes a busy machine's windows slowly, and
    // what is tested here is where the requests' samples come from.
    let agent = Agent::start(
        &dir.file("data"),
        &["--window", "2s", "-F", "49", "--comm", "fx-chain"],
    );
    let before = bpf_programs(agent.pid());
    assert!(!before.is_empty(), "the agent holds no BPF program");
    let url = format!(
        "http://127.0.0.1:{}/debug/pprof/profile?seconds=3",
        agent.port
    );
    let requests: Vec<_> = (0..3)
        .map(|i| {
            let (go, url) = (go.clone(), url.clone());
            let scratch = dir.path().join(format!("go-{i}"));
            std::fs::create_dir_all(&scratch).unwrap();
            std::thread::spawn(move || {
                Command::new(go)
                    .args(["tool", "pprof", "-top", &url])
                    .env("PPROF_TMPDIR", &scratch)
                    .env("HOME", &scratch)
                    .output()
                    .expect("running go tool pprof")
            })
        })
        .collect();
    // While the three are being sampled: no program more, none less.
    std::thread::sleep(Duration::from_millis(1500));
    let during = bpf_programs(agent.pid());
    for (i, r) in requests.into_iter().enumerate() {
        let out = r.join().unwrap();
        let top = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "request {i}: go tool pprof failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for function in ["c", "b", "a", "main"] {
            assert!(
                top.lines()
                    .any(|l| l.split_whitespace().last() == Some(function)),
                "request {i}: go tool pprof -top does not list {function}:\n{}",
                head(&top, 40)
            );
        }
    }
    assert_eq!(before, during, "BPF programs changed during the requests");
    assert_eq!(before, bpf_programs(agent.pid()), "BPF programs changed");
    // At the agent's rate: a sample stands for 1/49 s.
    let (_, period) = live_traces(&go, &dir, &agent, 1);
    assert_eq!(period, format!("Period: {}", 1_000_000_000 / 49));
}

#[test]
fn a_slow_store_drops_windows_it_counts() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent-slow-store");
    let data = dir.file("data");
    let _fx = spawn_fixture(Path::new(env!("FIXTURE_FX_CHAIN")), 120);
    // Each write takes 2.5 s and a window comes every second: the store's queue fills.
    let mut agent = Agent::start_env(
        &data,
        &["--window", "1s", "-F", "49", "--comm", "fx-chain"],
        &[("PROFILER_TEST_STORE_DELAY_MS", "2500")],
        Stdio::inherit(),
    );
    let start = Instant::now();
    let stored = loop {
        let (_, m) = agent.get("/metrics");
        let m = String::from_utf8_lossy(&m).into_owned();
        let stage = |s: &str| {
            metric(
                &m,
                &format!("profiler_pipeline_samples_total{{stage=\"{s}\"}}"),
            )
        };
        let (cut, stored) = (stage("cut"), stage("stored"));
        let dropped = stage("dropped_symbolize_queue")
            + stage("dropped_store_queue")
            + stage("dropped_store_failing");
        let in_flight = metric(&m, "profiler_pipeline_samples_in_flight");
        // Every sample cut is somewhere, in every scrape.
        assert_eq!(
            cut,
            stored + dropped + in_flight,
            "samples unaccounted for:\n{m}"
        );
        assert_eq!(
            cut,
            metric(&m, "profiler_samples_total{outcome=\"recorded\"}"),
            "{m}"
        );
        if stage("dropped_store_queue") > 0 && stored > 0 {
            break stored;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "no window dropped at the slow store's queue, or none stored:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(agent.stop().success());
    // The windows counted stored are in the store (more: those queued at the stop).
    let out = dir.file("q.folded");
    let q = run_profiler(
        &["query", "--data-dir", &data, "--since", "10m", "-o", &out],
        TIMEOUT,
    );
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let (text, stacks) = read_folded(Path::new(&out));
    let in_store = samples(&stacks, |_| true);
    assert!(
        in_store >= stored,
        "{stored} samples counted stored, {in_store} in the store: {}",
        head(&text, 10)
    );
}

#[test]
fn agent_defaults_walk_whole_stacks() {
    if !require_bpf() {
        return;
    }
    let Some(go) = tool("go", "golang-go") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("agent-unwind");
    // Built without frame pointers, sorting in Debian's libc (none either): only a table
    // walk reaches _start (tests/tests/unwind.rs has the fp negative control).
    // Under a comm of its own: other fx-unwind runs on the machine are not sampled.
    let comm = format!("fxu-{}", std::process::id());
    let copy = dir.path().join(&comm);
    std::fs::copy(env!("FIXTURE_FX_UNWIND"), &copy).expect("copying fx-unwind");
    let _fx = spawn_fixture_args(&copy, &["60", "qsort"]);
    let whole = |extra: &[&str]| {
        let mut args = vec!["--window", "2s", "-F", "49", "--comm", &comm];
        args.extend_from_slice(extra);
        let agent = Agent::start(&dir.file("data"), &args);
        // The tables load at the process's first samples; its stacks from then on are whole.
        std::thread::sleep(Duration::from_secs(3));
        let (traces, _) = live_traces(&go, &dir, &agent, 5);
        let (whole, total) = share(&traces, |t| {
            t.last().is_some_and(|root| root == "_start")
                && t.windows(3).any(|w| w == ["b", "a", "main"])
        });
        let metrics = String::from_utf8_lossy(&agent.get("/metrics").1).into_owned();
        (whole, total, traces, metrics)
    };
    // The tables' kernel memory, from /metrics (windows were cut during the 8 s above).
    let table_bytes = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("profiler_unwind_table_bytes "))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (n, total, traces, metrics) = whole(&[]);
    assert!(
        total >= 20 && n * 100 >= total * 80,
        "{n} of {total} samples reach _start -> main -> a -> b; {:?}",
        traces.iter().take(5).collect::<Vec<_>>()
    );
    assert!(
        table_bytes(&metrics).is_some_and(|b| b > 0),
        "no profiler_unwind_table_bytes > 0 in /metrics:\n{metrics}"
    );
    // Negative control: the agent's --unwind fp loses them.
    let (n, total, _, metrics) = whole(&["--unwind", "fp"]);
    assert!(
        total >= 20 && n * 100 < total * 80,
        "{n} of {total} samples whole by frame pointers: the fixture must lack them"
    );
    assert_eq!(
        table_bytes(&metrics),
        None,
        "tables reported under --unwind fp"
    );
}

#[test]
fn agent_defaults_name_python_frames() {
    if !require_bpf() {
        return;
    }
    let Some(go) = tool("go", "golang-go") else {
        return;
    };
    // Debian's, installed by `cargo xtask setup --tests` (python.rs covers every version).
    let python = "/usr/bin/python3.11";
    if !Path::new(python).exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{python} is missing and CI=true"
        );
        eprintln!("skipped: {python} is not installed");
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent-python");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/python/chain.py");
    // A comm of its own (exec through a symlink names the process after the link): other
    // Python processes on the machine are not sampled.
    let comm = format!("pyfx-{}", std::process::id());
    let link = dir.path().join(&comm);
    std::os::unix::fs::symlink(python, &link).unwrap();
    let mut child = Command::new(&link)
        .args([script, "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting python");
    let agent = Agent::start(
        &dir.file("data"),
        &["--window", "2s", "-F", "49", "--comm", &comm],
    );
    std::thread::sleep(Duration::from_secs(2));
    let (traces, _) = live_traces(&go, &dir, &agent, 5);
    let _ = child.kill();
    let _ = child.wait();
    // Leaf first: c, then b, then a. (go's pprof shows `<module> (...)` as an empty name,
    // taking `<module>` for C++ template arguments, so the chain ends at a here.)
    let (good, total) = share(&traces, |t| {
        let at = |f: &str| t.iter().position(|n| n.starts_with(f));
        matches!(
            (at("c (chain.py:"), at("b (chain.py:"), at("a (chain.py:")),
            (Some(c), Some(b), Some(a)) if c < b && b < a
        )
    });
    assert!(
        total >= 20 && good * 100 >= total * 80,
        "{good} of {total} samples show a -> b -> c named with their files and lines; {:?}",
        traces.iter().take(5).collect::<Vec<_>>()
    );
}
