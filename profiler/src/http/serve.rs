//! The accept loop and one connection's life. The limits are per client address and in all;
//! a connection past them is not served but still read briefly in a small overflow lane, so
//! a health probe is answered while idle clients hold every slot. Refusals are logged at
//! most once a minute, with how many there were.
use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::Future,
    net::{IpAddr, SocketAddr},
    rc::Rc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use super::{Request, Response, Token, parse_request};

/// Bytes of request head read at most.
pub(crate) const MAX_REQUEST: usize = 8192;
/// Time a client has to send its request head: short, as an idle connection holds a slot.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// Time to write a response (large flame graphs on slow links).
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once, in all.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one client address.
pub(crate) const MAX_PER_CLIENT: usize = 8;
/// Connections past those limits read at once (to answer `HEALTH_PATH`); beyond, closed.
pub(crate) const MAX_OVERFLOW: usize = 128;
/// Time a connection in the overflow lane has to send its request head.
const OVERFLOW_TIMEOUT: Duration = Duration::from_secs(1);
/// Refusals are logged at most this often.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// The path answered without a token and even past the connection limits: health probes
/// must work while the API is busy or attacked, and it tells nothing about the profiles.
pub(crate) const HEALTH_PATH: &str = "/healthz";

/// What the accept loop counts (one thread: plain cells).
#[derive(Default)]
struct Counts {
    open: Cell<usize>,
    overflow: Cell<usize>,
    per_client: RefCell<HashMap<IpAddr, usize>>,
    refused: Cell<u64>,
    last_log: Cell<Option<Instant>>,
}

impl Counts {
    fn client(&self, ip: IpAddr) -> usize {
        self.per_client.borrow().get(&ip).copied().unwrap_or(0)
    }

    fn add(&self, ip: IpAddr) {
        self.open.set(self.open.get() + 1);
        *self.per_client.borrow_mut().entry(ip).or_default() += 1;
    }

    fn remove(&self, ip: IpAddr) {
        self.open.set(self.open.get() - 1);
        let mut map = self.per_client.borrow_mut();
        if let Some(n) = map.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }

    /// Counts a refusal; logs the count at most once a minute (the first one at once).
    fn refuse(&self, peer: SocketAddr) {
        self.refused.set(self.refused.get() + 1);
        let due = self
            .last_log
            .get()
            .is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY);
        if due {
            log::warn!(
                "http: refused {} connection(s) since the last such line (limits: {MAX_PER_CLIENT} per client, {MAX_CONNECTIONS} in all); the last from {peer}",
                self.refused.get()
            );
            self.refused.set(0);
            self.last_log.set(Some(Instant::now()));
        }
    }
}

/// Serves `listener` forever on the current `LocalSet`, calling `handler` per request. With
/// a `token`, every path but `HEALTH_PATH` needs `Authorization: Bearer TOKEN` (else 401).
pub(crate) async fn serve<F, Fut>(listener: TcpListener, token: Option<Token>, handler: F)
where
    F: Fn(Request) -> Fut + 'static,
    Fut: Future<Output = Response> + 'static,
{
    let handler = Rc::new(handler);
    let token = Rc::new(token);
    let counts = Rc::new(Counts::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                log::warn!("http: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ip = peer.ip();
        let handler = handler.clone();
        let counts = counts.clone();
        if counts.open.get() < MAX_CONNECTIONS && counts.client(ip) < MAX_PER_CLIENT {
            counts.add(ip);
            let token = token.clone();
            tokio::task::spawn_local(async move {
                if let Err(e) = one(stream, &*handler, (*token).as_ref()).await {
                    log::debug!("http {peer}: {e}");
                }
                counts.remove(ip);
            });
        } else if counts.overflow.get() < MAX_OVERFLOW {
            counts.overflow.set(counts.overflow.get() + 1);
            tokio::task::spawn_local(async move {
                if let Err(e) = overflow(stream, &*handler, &counts, peer).await {
                    log::debug!("http {peer}: {e}");
                }
                counts.overflow.set(counts.overflow.get() - 1);
            });
        } else {
            counts.refuse(peer);
            // Dropping the stream closes it.
        }
    }
}

/// A connection past the limits: `HEALTH_PATH` is answered, anything else is a 503.
async fn overflow<F, Fut>(
    mut stream: TcpStream,
    handler: &F,
    counts: &Counts,
    peer: SocketAddr,
) -> std::io::Result<()>
where
    F: Fn(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let head = tokio::time::timeout(OVERFLOW_TIMEOUT, read_head(&mut stream)).await;
    if let Ok(Ok(Some(head))) = head
        && let Ok(req) = parse_request(&head)
        && req.path == HEALTH_PATH
    {
        return write(&mut stream, &handler(req).await).await;
    }
    counts.refuse(peer);
    let busy = Response::busy(
        "too many connections (from this client or in all); try again later",
        1,
    );
    write(&mut stream, &busy).await
}

async fn one<F, Fut>(
    mut stream: TcpStream,
    handler: &F,
    token: Option<&Token>,
) -> std::io::Result<()>
where
    F: Fn(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => return write(&mut stream, &Response::text(431, "request too large")).await,
        Ok(Err(e)) => return Err(e),
        Err(_) => return write(&mut stream, &Response::text(408, "request timeout")).await,
    };
    let response = match parse_request(&head) {
        Ok(req) if req.path == HEALTH_PATH => handler(req).await,
        Ok(req) => match token {
            Some(t) if !t.authorizes(req.authorization.as_deref()) => {
                Response::text(401, "this API needs `Authorization: Bearer TOKEN`")
                    .with_header("WWW-Authenticate", "Bearer".to_owned())
            }
            _ => handler(req).await,
        },
        Err(resp) => resp,
    };
    write(&mut stream, &response).await
}

/// Reads up to the blank line ending the head; None if it exceeds `MAX_REQUEST`.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Some(buf)); // the client closed: parse what came
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(buf));
        }
        if buf.len() > MAX_REQUEST {
            return Ok(None);
        }
    }
}

async fn write(stream: &mut TcpStream, r: &Response) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    for (name, value) in &r.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let io = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&r.body).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, io)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "write timeout"))?
}

#[cfg(test)]
mod tests;
