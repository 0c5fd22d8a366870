//! A small HTTP/1.1 GET server for the agent's API (front end, beside the pipeline). Bounded
//! on purpose: requests over `MAX_REQUEST` bytes, slower than `READ_TIMEOUT`, or more than
//! `MAX_CONNECTIONS` at once are refused; one request per connection (Connection: close).
use std::{future::Future, rc::Rc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Bytes of request head read at most.
pub const MAX_REQUEST: usize = 8192;
/// Time a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to write a response (large flame graphs on slow links).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// A parsed GET request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Path without the query, e.g. `/metrics`.
    pub path: String,
    /// Query parameters in order, percent-decoded.
    pub query: Vec<(String, String)>,
}

impl Request {
    /// The value of parameter `name`, if given.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A response; errors are one line of text.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn ok(content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            status: 200,
            content_type,
            body,
        }
    }

    /// A one-line plain-text message.
    pub fn text(status: u16, message: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }
}

/// Serves `listener` forever on the current `LocalSet`, calling `handler` per request.
pub async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request) -> Fut + 'static,
    Fut: Future<Output = Response> + 'static,
{
    let handler = Rc::new(handler);
    // One thread: a plain counter of open connections is enough.
    let open = Rc::new(std::cell::Cell::new(0usize));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                log::warn!("http: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if open.get() >= MAX_CONNECTIONS {
            log::warn!("http: too many connections; refusing {peer}");
            continue; // dropping the stream closes it
        }
        open.set(open.get() + 1);
        let open = open.clone();
        let handler = handler.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = one(stream, &*handler).await {
                log::debug!("http {peer}: {e}");
            }
            open.set(open.get() - 1);
        });
    }
}

async fn one<F, Fut>(mut stream: TcpStream, handler: &F) -> std::io::Result<()>
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
        Ok(req) => handler(req).await,
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
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    let io = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&r.body).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, io)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "write timeout"))?
}

/// The request line of `head`: only GET (and HEAD-less) requests are served.
pub fn parse_request(head: &[u8]) -> Result<Request, Response> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(Response::text(400, "malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Response::text(400, "only HTTP/1.x is served"));
    }
    if method != "GET" {
        return Err(Response::text(405, "only GET is served"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    Ok(Request {
        path: decode(path),
        query,
    })
}

/// Percent-decoding (`+` is a space in queries); invalid escapes are kept as written.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_get_with_query() {
        let r = parse_request(
            b"GET /api/flamegraph?since=1h&comm=fx%2Dchain+x HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.path, "/api/flamegraph");
        assert_eq!(r.param("since"), Some("1h"));
        assert_eq!(r.param("comm"), Some("fx-chain x"));
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%4"), "%4");
    }

    #[test]
    fn rejects_other_methods() {
        assert_eq!(
            parse_request(b"POST / HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status,
            405
        );
        assert_eq!(parse_request(b"garbage\r\n\r\n").unwrap_err().status, 400);
    }
}
