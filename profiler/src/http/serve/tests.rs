//! The server on real sockets: idle clients holding every slot, a health probe still
//! answered, the token required everywhere else.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    time::Duration,
};

use super::*;

/// Starts `serve` on a free loopback port in its own thread (left running: the test process
/// ends it); `/healthz` answers `ok`, anything else `data`.
fn start(token: Option<Token>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = TcpListener::from_std(listener).unwrap();
            serve(listener, token, |req: Request| async move {
                let body = if req.path == HEALTH_PATH {
                    "ok"
                } else {
                    "data"
                };
                Response::ok("text/plain", body.as_bytes().to_vec())
            })
            .await;
        });
    });
    port
}

/// (status, head, body) of one GET with optional extra header lines.
fn get(port: u16, path: &str, extra: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

#[test]
fn idle_clients_cannot_starve_the_health_probe() {
    let port = start(None);
    // 100 connections that never send a thing: more than one client's share and the pool.
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..10 {
        let (status, _, body) = get(port, "/healthz", "");
        assert_eq!((status, body.as_str()), (200, "ok"));
    }
    // Anything else from this client is refused at once, with a time to come back.
    let (status, head, _) = get(port, "/metrics", "");
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("Retry-After: 1"), "{head}");
    drop(idle);
}

#[test]
fn a_token_guards_everything_but_health() {
    let dir = tempfile::Builder::new()
        .prefix("serve-token-")
        .tempdir()
        .unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
    let port = start(Some(Token::from_file(Path::new(&file)).unwrap()));
    let (status, head, _) = get(port, "/metrics", "");
    assert_eq!(status, 401, "{head}");
    assert!(head.contains("WWW-Authenticate: Bearer"), "{head}");
    let wrong = "Authorization: Bearer 0123456789abcdef0124\r\n";
    assert_eq!(get(port, "/metrics", wrong).0, 401);
    let right = "Authorization: Bearer 0123456789abcdef0123\r\n";
    assert_eq!(get(port, "/metrics", right).2, "data");
    assert_eq!(get(port, "/healthz", "").2, "ok");
}
