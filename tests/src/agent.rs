//! A running `profiler agent` for the agent tests: started on a free loopback port, reached
//! with a minimal HTTP client, stopped with SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{profiler_bin, wait_timeout};

/// Longest wait for the agent to answer or stop.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A running agent, stopped with SIGTERM (or killed) on drop.
pub struct Agent {
    child: Child,
    /// Its HTTP API port on 127.0.0.1.
    pub port: u16,
}

impl Agent {
    /// Starts `profiler agent` on a free loopback port and waits until /healthz answers.
    pub fn start(data_dir: &str, extra: &[&str]) -> Agent {
        Self::start_with(data_dir, extra, Stdio::inherit())
    }

    /// Like `start`, with the agent's stderr (its log) going to `stderr`.
    pub fn start_with(data_dir: &str, extra: &[&str], stderr: Stdio) -> Agent {
        Self::start_env(data_dir, extra, &[], stderr)
    }

    /// Like `start_with`, with these environment variables set (test hooks).
    pub fn start_env(data_dir: &str, extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Agent {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(profiler_bin())
            .args(["agent", "--data-dir", data_dir, "--listen", &listen])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting profiler agent");
        let mut agent = Agent { child, port };
        let start = Instant::now();
        while get(port, "/healthz").is_none() {
            if let Some(status) = agent.child.try_wait().unwrap() {
                panic!("the agent exited early with {status}");
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "the agent did not answer /healthz"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    /// The agent's process id (its memory is read from /proc by the hostile tests).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn get(&self, path: &str) -> (u16, Vec<u8>) {
        get(self.port, path).unwrap_or_else(|| panic!("GET {path}: no answer"))
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // kill(1): the helper library has no libc dependency (only the tests do).
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill -TERM failed");
        wait_timeout(&mut self.child, TIMEOUT).expect("the agent did not stop on SIGTERM")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A plain HTTP/1.1 GET: (status, body), or None if nothing listens.
pub fn get(port: u16, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, raw[split + 4..].to_vec()))
}

/// The value of a series (`name` with its labels, as written) in Prometheus text.
pub fn metric_series(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
