//! Child processes: the profiler binary (always with a timeout, so a hang fails the test
//! instead of stalling the suite) and fixtures (killed when the test is done with them).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Upper bound for one profiler run in the tests: recording is 3-4 s, the rest is BPF loading
/// and symbolization. Catches hangs; it is not a performance assertion.
const PROFILER_TIMEOUT: Duration = Duration::from_secs(120);

/// The profiler binary: env PROFILER_BIN, else `profiler` in the target directory these tests
/// were built into, else `<workspace>/target/debug/profiler`. Panics if none exists.
pub fn profiler_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("PROFILER_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "PROFILER_BIN={} does not exist",
            path.display()
        );
        return path;
    }
    // Test executables live in <target>/<profile>/deps/; this follows CARGO_TARGET_DIR.
    let beside_tests = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("profiler")));
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/profiler");
    let candidates: Vec<PathBuf> = beside_tests.into_iter().chain([workspace]).collect();
    if let Some(found) = candidates.iter().find(|path| path.is_file()) {
        return found.clone();
    }
    panic!(
        "profiler binary not found (looked at {candidates:?}); build it with \
         `cargo build -p profiler` or run `cargo xtask test`, or set PROFILER_BIN"
    );
}

/// Runs the profiler with `args` as given, waiting at most `timeout`.
pub fn run_profiler(args: &[&str], timeout: Duration) -> Output {
    run_program(&profiler_bin(), args, timeout)
}

/// Runs the profiler with `args` and these environment variables set (test hooks).
pub fn run_profiler_env(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Output {
    run_program_env(&profiler_bin(), args, env, timeout)
}

/// Runs `program` (the profiler, or `profiler-lab` from env `CARGO_BIN_EXE_profiler-lab`)
/// with `args`, waiting at most `timeout`.
pub fn run_program(program: &Path, args: &[&str], timeout: Duration) -> Output {
    run_program_env(program, args, &[], timeout)
}

fn run_program_env(
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Output {
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name} {args:?}: {e}"));
    // Drain both pipes while waiting, so a chatty child cannot block on a full pipe.
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let status = wait_timeout(&mut child, timeout);
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    let Some(status) = status else {
        panic!(
            "{name} {args:?} did not exit within {timeout:?}; stderr:\n{}",
            String::from_utf8_lossy(&stderr)
        );
    };
    Output {
        status,
        stdout,
        stderr,
    }
}

/// `profiler record <args>`.
pub fn record(args: &[&str]) -> Output {
    run_profiler(&[&["record"], args].concat(), PROFILER_TIMEOUT)
}

/// `profiler report <args>`.
pub fn report(args: &[&str]) -> Output {
    run_profiler(&[&["report"], args].concat(), PROFILER_TIMEOUT)
}

/// `profiler doctor --json`'s findings, once it is checked that the doctor ran to its
/// verdict and that its exit status says that verdict (docs/doctor.md: 0 healthy, 3 a
/// warning, 4 an alarm).
pub fn doctor_findings(output: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let v: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}); {}; stderr:\n{stderr}",
            output.status
        )
    });
    let want = match v["verdict"].as_str() {
        Some("healthy") => 0,
        Some("warning") => 3,
        Some("alarm") => 4,
        other => panic!("no verdict in the doctor's JSON: {other:?}"),
    };
    assert_eq!(
        output.status.code(),
        Some(want),
        "verdict {} but {}; stderr:\n{stderr}",
        v["verdict"],
        output.status
    );
    v
}

/// The doctor's problem that starts with `prefix`; panics, listing them, if there is none.
pub fn doctor_problem<'a>(v: &'a serde_json::Value, prefix: &str) -> &'a str {
    v["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .find(|p| p.starts_with(prefix))
        .unwrap_or_else(|| panic!("no problem `{prefix}...` in {}", v["problems"]))
}

/// Panics unless the run succeeded, showing its status and stderr.
pub fn expect_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed with {}; stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Waits for `child` up to `timeout`; on timeout kills it (and reaps it) and returns None.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for child") {
            return Some(status);
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A running fixture process, killed and reaped on drop (its own deadline is the backstop).
pub struct Fixture {
    child: Child,
}

impl Fixture {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A process started by the caller (killed and reaped on drop like the others).
    pub fn from_child(child: Child) -> Self {
        Fixture { child }
    }

    /// The fixture's stdout, when it was started with a pipe there.
    pub fn stdout(&mut self) -> Option<&mut std::process::ChildStdout> {
        self.child.stdout.as_mut()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the fixture at `path` to run for `secs` seconds, and returns once it has exec'd
/// (its comm is the file name), so a `--comm` or `--pid` recording started next sees it.
pub fn spawn_fixture(path: &Path, secs: u64) -> Fixture {
    spawn_fixture_args(path, &[&secs.to_string()])
}

/// `spawn_fixture` with the fixture's arguments given in full.
pub fn spawn_fixture_args(path: &Path, args: &[&str]) -> Fixture {
    let child = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting fixture {}: {e}", path.display()));
    let fixture = Fixture { child };
    // The kernel keeps the first 15 bytes of the file name as comm.
    let name = path.file_name().unwrap().to_string_lossy();
    let comm: String = name.chars().take(15).collect();
    let comm_file = format!("/proc/{}/comm", fixture.pid());
    let start = Instant::now();
    loop {
        match std::fs::read_to_string(&comm_file) {
            Ok(seen) if seen.trim_end() == comm => return fixture,
            Ok(_) | Err(_) if start.elapsed() < Duration::from_secs(5) => {
                thread::sleep(Duration::from_millis(10));
            }
            seen => panic!(
                "fixture {} did not start as {comm:?}: {seen:?}",
                path.display()
            ),
        }
    }
}

/// A `profiler record` (or other long-running profiler command) whose stderr the test reads
/// line by line, to act at a known moment: once the sampler loads, once sampling started.
pub struct Running {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every stderr line read so far.
    pub stderr: Vec<String>,
}

impl Running {
    /// Starts the profiler with `args`, stdout discarded, stderr read by the test.
    pub fn start(args: &[&str]) -> Running {
        let mut child = Command::new(profiler_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting profiler {args:?}: {e}"));
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            stderr: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads stderr until a line starting with `prefix`; panics (with what was read) if the
    /// profiler ends or says nothing of the kind within PROFILER_TIMEOUT.
    pub fn wait_for(&mut self, prefix: &str) {
        let deadline = Instant::now() + PROFILER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.starts_with(prefix);
                    self.stderr.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => panic!(
                    "no stderr line starting with {prefix:?} ({e}); stderr so far:\n{}",
                    self.stderr.join("\n")
                ),
            }
        }
    }

    /// Sends `signal` (a name for kill(1): INT, TERM) to the profiler.
    pub fn signal(&self, signal: &str) {
        // kill(1): the helper library has no libc dependency (only the tests do).
        let sent = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill -s {signal} {} failed", self.pid());
    }

    /// Waits for the exit (at most PROFILER_TIMEOUT: a hang fails, this is no timing
    /// assertion) and returns the status with all of stderr.
    pub fn finish(mut self) -> (ExitStatus, String) {
        let status = wait_timeout(&mut self.child, PROFILER_TIMEOUT);
        // The reader ends at EOF once the profiler is gone.
        self.stderr.extend(self.lines.iter());
        let stderr = self.stderr.join("\n");
        let status = status.unwrap_or_else(|| {
            panic!("profiler did not exit within {PROFILER_TIMEOUT:?}:\n{stderr}")
        });
        (status, stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
