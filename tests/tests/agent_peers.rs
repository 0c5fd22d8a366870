//! Peer tests of the agent: a real Prometheus (Debian prometheus) scrapes it on loopback and a
//! PromQL query through Prometheus's HTTP API returns the fixture's per-process CPU series;
//! `go tool pprof -top` (Debian golang-go) reads the live /debug/pprof/profile endpoint. A
//! missing peer is a skip on a laptop and a failure under CI=true.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, TempDir, exclusive, free_port, get, head, require_bpf, spawn_fixture, tool,
};

/// Prometheus, killed on drop.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn prometheus_scrapes_the_agent() {
    if !require_bpf() {
        return;
    }
    let Some(prometheus) = tool("prometheus", "prometheus") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("agent-prometheus");
    let _fx = spawn_fixture(Path::new(env!("FIXTURE_FX_CHAIN")), 60);
    // Only the fixture: on a machine busy with other work (compilers, other test runs), the
    // agent's whole-machine windows took seconds each in the debug build and the live
    // profile missed go's timeout; what is tested here is the peer reading us.
    let agent = Agent::start(&dir.file("data"), &["--window", "2s", "--comm", "fx-chain"]);
    let config = dir.file("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: profiler\n    \
             static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            agent.port
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={config}"))
        .arg(format!("--storage.tsdb.path={}", dir.file("tsdb")))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Its log stays in the scratch dir, which a failing test keeps.
        .stderr(std::fs::File::create(dir.file("prometheus.log")).unwrap())
        .spawn()
        .expect("starting prometheus");
    let _prometheus = Prometheus(child);
    // profiler_process_cpu_seconds_total{comm="fx-chain"}, URL-encoded.
    let query = "/api/v1/query?query=profiler_process_cpu_seconds_total%7Bcomm%3D%22fx-chain%22%7D";
    let start = Instant::now();
    let last = loop {
        let answer = get(port, query).map(|(_, b)| String::from_utf8_lossy(&b).into_owned());
        if let Some(a) = &answer
            && a.contains("\"status\":\"success\"")
            && a.contains("\"comm\":\"fx-chain\"")
        {
            break a.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus never returned the fx-chain series; last answer: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(last.contains("\"job\":\"profiler\""), "{last}");
}

#[test]
fn go_tool_pprof_reads_the_live_endpoint() {
    if !require_bpf() {
        return;
    }
    let Some(go) = tool("go", "golang-go") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("agent-pprof");
    let _fx = spawn_fixture(Path::new(env!("FIXTURE_FX_CHAIN")), 60);
    // Only the fixture: on a machine busy with other work (compilers, other test runs), the
    // agent's whole-machine windows took seconds each in the debug build and the live
    // profile missed go's timeout; what is tested here is the peer reading us.
    let agent = Agent::start(&dir.file("data"), &["--window", "2s", "--comm", "fx-chain"]);
    let url = format!(
        "http://127.0.0.1:{}/debug/pprof/profile?seconds=3",
        agent.port
    );
    let out = Command::new(go)
        .args(["tool", "pprof", "-top", &url])
        // pprof keeps state under $HOME/pprof; keep it in the scratch directory.
        .env("PPROF_TMPDIR", dir.path())
        .env("HOME", dir.path())
        .output()
        .expect("running go tool pprof");
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for function in ["c", "b", "a", "main"] {
        assert!(
            top.lines()
                .any(|l| l.split_whitespace().last() == Some(function)),
            "go tool pprof -top of the live endpoint does not list {function}:\n{}",
            head(&top, 40)
        );
    }
}
