//! `profiler agent --otlp-endpoint`: each window is POSTed as an OTLP profiles request to a
//! receiver in this test, which first answers 503 (the agent keeps the window spooled and
//! retries with backoff) and then 200. The bodies are decoded with the official generated
//! Python classes (the `opentelemetry-proto` package, installed by `cargo xtask setup
//! --tests` into target/otlp-venv) and checked: samples with their times, stacks, locations,
//! mappings with build ids, and the resource attributes of a fixture run in a cgroup named
//! like a Kubernetes container's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, Fixture, TempDir, cannot_run, exclusive, expect_success, require_bpf, tool,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const POD_UID: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
const CONTAINER_ID: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// One request the receiver got: request line, content type, body.
type Request = (String, String, Vec<u8>);

/// An OTLP/HTTP receiver on a free loopback port: answers the first request 503, the rest
/// 200 with an empty `ExportProfilesServiceResponse`, 300 ms late once `slow` is set.
fn receiver() -> (u16, Arc<Mutex<Vec<Request>>>, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got: Arc<Mutex<Vec<Request>>> = Arc::default();
    let seen = got.clone();
    let slow = Arc::new(AtomicBool::new(false));
    let late = slow.clone();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let (mut length, mut kind) = (0usize, String::new());
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap_or((h, ""));
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap(),
                    "content-type" => v.trim().clone_into(&mut kind),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            r.read_exact(&mut body).unwrap();
            if late.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(300));
            }
            let status = if n == 0 {
                "503 Service Unavailable"
            } else {
                "200 OK"
            };
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            );
            if n > 0 {
                seen.lock()
                    .unwrap()
                    .push((line.trim_end().to_owned(), kind, body));
            }
        }
    });
    (port, got, slow)
}

/// cgroup2 dirs named like a containerd container in a Kubernetes pod, removed on drop.
struct PodCgroup(Vec<PathBuf>);

impl PodCgroup {
    fn new() -> Option<Self> {
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(Path::new)
            .find(|r| r.join("cgroup.procs").exists() && r.join("cgroup.controllers").exists())?;
        let top = root.join(format!("profiler-test-{}.slice", std::process::id()));
        let pod = top.join(format!("pod{}.slice", POD_UID.replace('-', "_")));
        let ctr = pod.join(format!("cri-containerd-{CONTAINER_ID}.scope"));
        std::fs::create_dir_all(&ctr).ok()?;
        Some(Self(vec![ctr, pod, top]))
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

/// Starts `fx` (a copy of fx-chain named `comm`) in the pod's container cgroup and waits until
/// it has exec'd.
fn start_in_pod(cg: &PodCgroup, fx: &Path, comm: &str) -> Fixture {
    let procs = cg.0[0].join("cgroup.procs");
    let fixture = Fixture::from_child(
        Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {} && exec \"$0\" 120", procs.display()))
            .arg(fx)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the fixture in the test cgroup"),
    );
    let pid = fixture.pid();
    let start = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/comm")).map_or(true, |c| c.trim() != comm) {
        assert!(start.elapsed() < TIMEOUT, "the fixture did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    fixture
}

/// Runs the agent (2 s windows at 49 Hz, its log in `log`) pushing to `endpoint` until the
/// receiver accepted two requests, then stops it.
fn export_two_windows(
    data: &str,
    log: &str,
    endpoint: &str,
    got: &Mutex<Vec<Request>>,
    slow: &AtomicBool,
) {
    let mut agent = Agent::start_with(
        data,
        &["--window", "2s", "-F", "49", "--otlp-endpoint", endpoint],
        Stdio::from(std::fs::File::create(log).unwrap()),
    );
    let start = Instant::now();
    while got.lock().unwrap().len() < 2 {
        assert!(
            start.elapsed() < TIMEOUT,
            "fewer than 2 requests accepted; agent log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A server slow to answer: the agent's stop waits for its answers rather than cutting the
    // requests (once, that left a connection closed before its request line).
    slow.store(true, Ordering::SeqCst);
    assert!(agent.stop().success());
}

/// At stop the agent sent what was spooled, its last window included; the refused first
/// window was kept and retried, with the endpoint named in the log.
fn check_spool_sent_and_refusal_logged(data: &str, log: &str, endpoint: &str) {
    let spool: Vec<_> = std::fs::read_dir(Path::new(data).join("otlp"))
        .expect("reading the OTLP spool")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(spool.is_empty(), "windows left unsent at stop: {spool:?}");
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        text.contains(&format!(
            "push to {endpoint}/v1development/profiles failed: the server answered `HTTP/1.1 503 Service Unavailable`; "
        )),
        "{text}"
    );
}

/// Checks each request is a protobuf POST to the profiles path and decodes the bodies with the
/// opentelemetry-proto classes (tests/support/otlp_decode.py), one JSON object per request.
fn decode(python: &Path, dir: &TempDir, requests: &[Request]) -> serde_json::Value {
    let mut files = Vec::new();
    for (i, (line, kind, body)) in requests.iter().enumerate() {
        assert_eq!(
            line, "POST /v1development/profiles HTTP/1.1",
            "request {i}: an empty line is a connection closed before its request"
        );
        assert_eq!(kind, "application/x-protobuf");
        let f = dir.file(&format!("req{i}.pb"));
        std::fs::write(&f, body).unwrap();
        files.push(f);
    }
    let out = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/otlp_decode.py"
        ))
        .args(&files)
        .output()
        .unwrap();
    expect_success(&out, "decoding with the opentelemetry-proto classes");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The GNU build id of `binary`, as `readelf -n` prints it.
fn gnu_build_id(readelf: &Path, binary: &Path) -> String {
    let notes = Command::new(readelf)
        .arg("-n")
        .arg(binary)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout).into_owned();
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}: {notes}", binary.display()))
        .to_owned()
}

/// The fixture being checked: its pid, comm and build id.
struct Expected<'a> {
    pid: u32,
    comm: &'a str,
    build_id: &'a str,
}

/// Checks every decoded request: the tables' zero values, every resource's host attributes,
/// and the fixture's resources (see `check_fixture_resource`). Returns the fixture's samples,
/// and how many of them have its c;b;a;main chain.
fn check_requests(decoded: &serde_json::Value, want: &Expected) -> (usize, usize) {
    let (host, kernel) = (
        read_trimmed("/proc/sys/kernel/hostname"),
        read_trimmed("/proc/sys/kernel/osrelease"),
    );
    let (mut total, mut chained) = (0, 0);
    for req in decoded.as_array().unwrap() {
        for (table, zero) in req["zero"].as_object().unwrap() {
            assert_eq!(zero, true, "{table}_table[0] is not the zero value");
        }
        for res in req["resources"].as_array().unwrap() {
            let a = &res["attributes"];
            assert_eq!(a["host.name"], host.as_str());
            assert_eq!(
                (&a["os.type"], &a["os.version"]),
                (&"linux".into(), &kernel.as_str().into())
            );
            if a["process.pid"] != i64::from(want.pid) {
                continue;
            }
            let (n, c) = check_fixture_resource(res, want);
            total += n;
            chained += c;
        }
    }
    (total, chained)
}

/// The fixture's resource: its process and Kubernetes attributes, and per sample the profile's
/// types and period, exact times inside the window, and the c;b;a;main frames in the fixture
/// with its build id. Returns its samples and how many of them have that chain.
fn check_fixture_resource(res: &serde_json::Value, want: &Expected) -> (usize, usize) {
    let a = &res["attributes"];
    assert_eq!(a["process.executable.name"], want.comm, "{a}");
    assert_eq!(a["container.id"], CONTAINER_ID, "{a}");
    assert_eq!(a["k8s.pod.uid"], POD_UID, "{a}");
    let (mut total, mut chained) = (0, 0);
    for s in res["samples"].as_array().unwrap() {
        let p = &s["profile"];
        assert_eq!(p["sample_type"], serde_json::json!(["samples", "count"]));
        assert_eq!(p["period_type"], serde_json::json!(["cpu", "nanoseconds"]));
        assert_eq!(p["period"], 1_000_000_000 / 49);
        assert_eq!(s["attrs"]["thread.name"], want.comm);
        // Exact times, one per sample, inside the window (plus the drain's slack).
        let t0 = p["time_unix_nano"].as_u64().unwrap();
        let end = t0 + p["duration_nano"].as_u64().unwrap() + 2_000_000_000;
        let times = s["timestamps"].as_array().unwrap();
        assert!(!times.is_empty() && s["values"].as_array().unwrap().is_empty());
        assert!(
            times
                .iter()
                .all(|t| (t0..end).contains(&t.as_u64().unwrap())),
            "{s}"
        );
        total += times.len();
        // Leaf first: c, b, a, main, each in the fixture with its build id.
        let frames = s["frames"].as_array().unwrap();
        let names: Vec<&str> = frames.iter().map(|f| f["name"].as_str().unwrap()).collect();
        let at = names.windows(4).position(|w| w == ["c", "b", "a", "main"]);
        if let Some(at) = at {
            chained += times.len();
            for f in &frames[at..at + 4] {
                assert!(f["mapping"].as_str().unwrap().ends_with(want.comm), "{f}");
                assert_eq!(
                    f["mapping_attrs"]["process.executable.build_id.gnu"], want.build_id,
                    "{f}"
                );
                assert!(f["address"].as_u64().unwrap() > 0, "{f}");
            }
        }
    }
    (total, chained)
}

#[test]
fn otlp_export_decodes_with_the_official_classes() {
    if !require_bpf() {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/otlp-venv/bin/python");
    if !python.is_file() {
        cannot_run(&format!(
            "{} is missing (run `cargo xtask setup --tests`)",
            python.display()
        ));
        return;
    }
    let Some(readelf) = tool("readelf", "binutils") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("agent-otlp");
    let comm = format!("fxo-{}", std::process::id());
    let fx = dir.path().join(&comm);
    std::fs::copy(env!("FIXTURE_FX_CHAIN"), &fx).expect("copying fx-chain");
    let Some(cg) = PodCgroup::new() else {
        cannot_run("no cgroup2 hierarchy where a test cgroup could be made");
        return;
    };
    let fixture = start_in_pod(&cg, &fx, &comm);
    let pid = fixture.pid();

    let (port, got, slow) = receiver();
    let (data, log) = (dir.file("data"), dir.file("agent.log"));
    let endpoint = format!("http://127.0.0.1:{port}");
    export_two_windows(&data, &log, &endpoint, &got, &slow);
    drop(fixture);
    check_spool_sent_and_refusal_logged(&data, &log, &endpoint);

    let requests = got.lock().unwrap().clone();
    let decoded = decode(&python, &dir, &requests);
    let build_id = gnu_build_id(&readelf, &fx);
    let want = Expected {
        pid,
        comm: &comm,
        build_id: &build_id,
    };
    let (total, chained) = check_requests(&decoded, &want);
    assert!(
        total >= 20,
        "only {total} samples of the fixture in {decoded}"
    );
    assert!(
        chained * 100 >= total * 80,
        "{chained} of {total} samples have c;b;a;main"
    );
}
