//! `--push-url` and `--otlp-endpoint`: each window goes to a Pyroscope-compatible ingest
//! endpoint (`POST {url}/ingest?name=...&from=...&until=...&format=pprof`, pprof body) and/or
//! an OTLP/HTTP profiles endpoint (`POST {url}/v1development/profiles`, protobuf body,
//! `output::encode_otlp`). Windows are spooled on disk first (`<data-dir>/push/` and
//! `<data-dir>/otlp/`, at most `MAX_SPOOLED` files each) and sent oldest first; while the
//! server is down the sender retries with exponential backoff. A window that overflows the
//! spool is deleted and counted. At stop the sender finishes the push in flight and makes one
//! last pass over the spool (the agent's last window included) instead of being dropped
//! mid-request, which left servers a connection that closed before its request line.
//! Plain http:// only (a TLS proxy can front it).
use std::{
    cell::Cell,
    path::{Path, PathBuf},
    rc::Rc,
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::Notify,
};

use crate::profile::Profile;

/// Windows kept on disk while the server is unreachable (one hour of 10 s windows).
pub(crate) const MAX_SPOOLED: usize = 360;
/// Backoff between failed attempts: from 1 s, doubling, up to this.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Time one push may take.
pub(crate) const PUSH_TIMEOUT: Duration = Duration::from_secs(30);
/// Time the agent's stop waits for the senders' last pass: short, as a supervisor's stop
/// timeout is (Kubernetes gives 30 s in all); what is not sent by then stays spooled.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// What a pusher speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Pyroscope's `/ingest`, a gzipped pprof body.
    Pyroscope,
    /// OTLP/HTTP profiles (`v1development`), a protobuf body.
    Otlp,
}

impl Protocol {
    /// The spool's directory under the data dir.
    fn spool(self) -> &'static str {
        match self {
            Self::Pyroscope => "push",
            Self::Otlp => "otlp",
        }
    }

    /// The spooled files' suffix.
    fn suffix(self) -> &'static str {
        match self {
            Self::Pyroscope => ".pb.gz",
            Self::Otlp => ".otlp.pb",
        }
    }

    /// The endpoint's path after the URL's base.
    fn path(self) -> &'static str {
        match self {
            Self::Pyroscope => "/ingest",
            Self::Otlp => "/v1development/profiles",
        }
    }

    fn encode(self, p: &Profile) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Pyroscope => {
                let mut body = Vec::new();
                crate::output::write_pprof(p, &mut body)?;
                Ok(body)
            }
            Self::Otlp => Ok(crate::output::encode_otlp(p)),
        }
    }
}

/// Where a push goes: `http://HOST:PORT[/base]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PushUrl {
    /// `host:port`, as connected to and sent in `Host:`.
    pub authority: String,
    /// Path prefix without a trailing `/` ("" for none).
    pub base: String,
}

/// A push URL that is not `http://host[:port][/base]`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PushUrlError {
    #[error("push url `{0}` must start with http:// (https is not spoken; use a local proxy)")]
    NotHttp(String),
    #[error("push url `{0}` has no host")]
    NoHost(String),
}

/// Parses `http://host[:port][/base]`.
pub(crate) fn parse_push_url(text: &str) -> Result<PushUrl, PushUrlError> {
    let rest = text
        .strip_prefix("http://")
        .ok_or_else(|| PushUrlError::NotHttp(text.to_owned()))?;
    let (authority, base) = rest.split_once('/').map_or((rest, ""), |(a, b)| (a, b));
    if authority.is_empty() {
        return Err(PushUrlError::NoHost(text.to_owned()));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let base = base.trim_end_matches('/');
    Ok(PushUrl {
        authority,
        base: if base.is_empty() {
            String::new()
        } else {
            format!("/{base}")
        },
    })
}

/// The spool and its counters, shared by the window loop and the sender task.
pub(crate) struct Pusher {
    url: PushUrl,
    protocol: Protocol,
    dir: PathBuf,
    wake: Notify,
    /// Set by `stop`; `halt` cuts the sender's waits short.
    stopping: Cell<bool>,
    halt: Notify,
    /// Windows sent, and windows deleted because the spool was full.
    pub sent: Cell<u64>,
    pub dropped: Cell<u64>,
}

impl Pusher {
    /// Creates the spool dir under `data_dir`; windows left there by an earlier run are sent too.
    pub(crate) fn new(
        url: PushUrl,
        protocol: Protocol,
        data_dir: &Path,
    ) -> std::io::Result<Rc<Self>> {
        let dir = data_dir.join(protocol.spool());
        std::fs::create_dir_all(&dir)?;
        Ok(Rc::new(Self {
            url,
            protocol,
            dir,
            wake: Notify::new(),
            stopping: Cell::new(false),
            halt: Notify::new(),
            sent: Cell::new(0),
            dropped: Cell::new(0),
        }))
    }

    /// Spools one window (in the protocol's encoding) and wakes the sender.
    pub(crate) fn enqueue(&self, p: &Profile, hostname: &str) {
        let until = (p.meta.start_unix_ns + p.meta.duration_ns).div_ceil(1_000_000_000);
        let body = match self.protocol.encode(p) {
            Ok(body) => body,
            Err(e) => {
                log::error!("push: cannot encode a window: {e}");
                return;
            }
        };
        // The name sorts by time; the host is in it because a restart may reuse a second.
        let name = format!(
            "{:020}-{until}-{}{}",
            p.meta.start_unix_ns,
            sanitize(hostname),
            self.protocol.suffix()
        );
        if let Err(e) = std::fs::write(self.dir.join(name), body) {
            log::error!("push: cannot spool a window in {}: {e}", self.dir.display());
        }
        let mut files = self.spooled();
        while files.len() > MAX_SPOOLED {
            let _ = std::fs::remove_file(files.remove(0));
            self.dropped.set(self.dropped.get() + 1);
        }
        self.wake.notify_one();
    }

    /// Spooled windows, oldest first.
    fn spooled(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let suffix = self.protocol.suffix();
        files.retain(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(suffix))
        });
        files.sort();
        files
    }

    /// Sends spooled windows oldest first, backing off while the server fails, until `stop`;
    /// then one last pass without backoff, which a failure ends (the rest waits on disk for
    /// the next start).
    pub(crate) async fn run(self: Rc<Self>) {
        let mut backoff = Duration::from_secs(1);
        while !self.stopping.get() {
            let files = self.spooled();
            if files.is_empty() {
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = self.halt.notified() => {}
                }
                continue;
            }
            for file in files {
                // Not cancelled by `stop`: a push is finished, not cut off mid-request.
                if let Err(e) = self.send(&file).await {
                    self.failed(&e, &format!("retrying in {backoff:?}"));
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.halt.notified() => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    break;
                }
                self.delivered(&file);
                backoff = Duration::from_secs(1);
            }
        }
        for file in self.spooled() {
            if let Err(e) = self.send(&file).await {
                self.failed(&e, "sent at the next start");
                return;
            }
            self.delivered(&file);
        }
    }

    /// Ends `run` after the push in flight and a last pass over the spool.
    pub(crate) fn stop(&self) {
        self.stopping.set(true);
        self.halt.notify_one();
    }

    fn delivered(&self, file: &Path) {
        let _ = std::fs::remove_file(file);
        self.sent.set(self.sent.get() + 1);
    }

    fn failed(&self, e: &SendError, next: &str) {
        log::error!(
            "push to http://{}{}{} failed: {}; {} windows kept on disk, {next}",
            self.url.authority,
            self.url.base,
            self.protocol.path(),
            crate::util::chain(e),
            self.spooled().len()
        );
    }

    async fn send(&self, file: &Path) -> Result<(), SendError> {
        let body = std::fs::read(file).map_err(|source| SendError::Read {
            path: file.to_owned(),
            source,
        })?;
        let stem = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let mut parts = stem.trim_end_matches(self.protocol.suffix()).splitn(3, '-');
        let from = parts
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            / 1_000_000_000;
        let until = parts
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(from + 1);
        let host = parts.next().unwrap_or("");
        let (target, content_type) = match self.protocol {
            Protocol::Pyroscope => {
                // name = profiler.cpu{host="..."}, percent-encoded.
                let name = format!("profiler.cpu%7Bhost%3D{host}%7D");
                (
                    format!(
                        "{}/ingest?name={name}&from={from}&until={until}&format=pprof&spyName=profiler",
                        self.url.base
                    ),
                    "application/octet-stream",
                )
            }
            Protocol::Otlp => (
                format!("{}{}", self.url.base, Protocol::Otlp.path()),
                "application/x-protobuf",
            ),
        };
        let head = format!(
            "POST {target} HTTP/1.1\r\nHost: {}\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.url.authority,
            body.len()
        );
        let io = async {
            let mut s = TcpStream::connect(&self.url.authority).await?;
            s.write_all(head.as_bytes()).await?;
            s.write_all(&body).await?;
            let mut answer = Vec::new();
            // The status line is enough; the rest is bounded anyway.
            (&mut s).take(64 * 1024).read_to_end(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        let answer = tokio::time::timeout(PUSH_TIMEOUT, io)
            .await
            .map_err(|_| SendError::TimedOut)??;
        let line = String::from_utf8_lossy(&answer);
        let status = line.split(' ').nth(1).unwrap_or("");
        if status.starts_with('2') {
            Ok(())
        } else {
            Err(SendError::Refused(
                line.lines().next().unwrap_or("nothing").to_owned(),
            ))
        }
    }
}

/// Why one spooled window was not delivered (it stays on disk for the next try).
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("timed out")]
    TimedOut,
    /// Connecting, sending or reading the answer: the OS error says which.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the server answered `{0}`")]
    Refused(String),
}

/// Host names in file names and URLs: letters, digits, `.` and `_` only.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    #[test]
    fn urls() {
        let u = parse_push_url("http://pyro:4040/").unwrap();
        assert_eq!((u.authority.as_str(), u.base.as_str()), ("pyro:4040", ""));
        let u = parse_push_url("http://pyro/base").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.base.as_str()),
            ("pyro:80", "/base")
        );
        assert!(parse_push_url("https://pyro").is_err());
        assert!(parse_push_url("pyro:4040").is_err());
    }

    #[test]
    fn spool_is_bounded_and_counts_what_overflows() {
        let dir = tempfile::Builder::new()
            .prefix("push-spool-")
            .tempdir()
            .unwrap();
        let url = parse_push_url("http://127.0.0.1:1").unwrap();
        let pusher = Pusher::new(url, Protocol::Pyroscope, dir.path()).unwrap();
        let mut p = Profile::default();
        for k in 0..(MAX_SPOOLED as u64 + 5) {
            p.meta.start_unix_ns = (1_000 + k * 10) * 1_000_000_000;
            p.meta.duration_ns = 10_000_000_000;
            pusher.enqueue(&p, "host-1");
        }
        let files = pusher.spooled();
        assert_eq!(files.len(), MAX_SPOOLED);
        assert_eq!(pusher.dropped.get(), 5);
        // The oldest went first.
        let first = files[0].file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            first.starts_with(&format!("{:020}", 1_050 * 1_000_000_000u64)),
            "{first}"
        );
    }

    /// A loopback server reading whole requests (head, then `Content-Length` bytes of body):
    /// answers 503 until `ok` is set, then 200. Each connection is recorded as its request
    /// line and body length, or as `cut after N bytes` when it closed before the request
    /// was whole.
    fn server(ok: Arc<AtomicBool>) -> (PushUrl, Arc<Mutex<Vec<String>>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = parse_push_url(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let got: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = got.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut conn = conn.unwrap();
                let mut bytes = Vec::new();
                let mut buf = [0; 4096];
                let whole = loop {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    if let Some((head, _)) = text.split_once("\r\n\r\n") {
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        if bytes.len() >= head.len() + 4 + length {
                            break Some(format!(
                                "{} ({length} bytes)",
                                head.lines().next().unwrap()
                            ));
                        }
                    }
                    match std::io::Read::read(&mut conn, &mut buf) {
                        Ok(0) | Err(_) => break None,
                        Ok(n) => bytes.extend_from_slice(&buf[..n]),
                    }
                };
                let Some(request) = whole else {
                    seen.lock()
                        .unwrap()
                        .push(format!("cut after {} bytes", bytes.len()));
                    continue;
                };
                let status = if ok.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Busy"
                };
                let _ = std::io::Write::write_all(
                    &mut conn,
                    format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
                );
                seen.lock().unwrap().push(request);
            }
        });
        (url, got)
    }

    #[test]
    fn stop_sends_what_is_spooled_and_cuts_no_request() {
        let dir = tempfile::Builder::new()
            .prefix("push-stop-")
            .tempdir()
            .unwrap();
        let ok = Arc::new(AtomicBool::new(false));
        let (url, got) = server(ok.clone());
        let pusher = Pusher::new(url, Protocol::Otlp, dir.path()).unwrap();
        let mut p = Profile::default();
        for k in 0..3 {
            p.meta.start_unix_ns = (1_000 + k * 10) * 1_000_000_000;
            p.meta.duration_ns = 10_000_000_000;
            pusher.enqueue(&p, "host-1");
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async {
            let sender = tokio::task::spawn_local(pusher.clone().run());
            // Refused once: the sender now waits out its backoff, which `stop` cuts short.
            while got.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            ok.store(true, Ordering::SeqCst);
            pusher.stop();
            // Without the last pass the sender would go on forever: bounded, not timed.
            tokio::time::timeout(Duration::from_secs(60), sender)
                .await
                .expect("the sender did not return after stop")
                .unwrap();
        });
        let got = got.lock().unwrap().clone();
        let line = "POST /v1development/profiles HTTP/1.1";
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got.iter().all(|r| r.starts_with(line)), "{got:?}");
        assert_eq!((pusher.spooled().len(), pusher.sent.get()), (0, 3));
    }

    #[test]
    fn a_failure_ends_the_last_pass_and_keeps_the_windows() {
        let dir = tempfile::Builder::new()
            .prefix("push-stop-down-")
            .tempdir()
            .unwrap();
        let (url, got) = server(Arc::new(AtomicBool::new(false)));
        let pusher = Pusher::new(url, Protocol::Otlp, dir.path()).unwrap();
        let mut p = Profile::default();
        for k in 0..3 {
            p.meta.start_unix_ns = (1_000 + k * 10) * 1_000_000_000;
            pusher.enqueue(&p, "host-1");
        }
        pusher.stop();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, pusher.clone().run());
        // One attempt, refused: nothing sent, nothing lost.
        assert_eq!(got.lock().unwrap().len(), 1);
        assert_eq!((pusher.spooled().len(), pusher.sent.get()), (3, 0));
    }
}
