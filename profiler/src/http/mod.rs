//! A small HTTP/1.1 GET server for the agent's API (front end, beside the pipeline). Bounded
//! on purpose (`serve`): request heads over `MAX_REQUEST` bytes or slower than
//! `READ_TIMEOUT`, more than `MAX_PER_CLIENT` connections from one address or
//! `MAX_CONNECTIONS` in all are refused, yet `HEALTH_PATH` is still answered; one request per
//! connection (Connection: close). With a `Token`, every other path needs it.
mod serve;
mod token;

pub(crate) use serve::serve;
pub(crate) use token::{Token, TokenError};

/// A parsed GET request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Path without the query, e.g. `/metrics`.
    pub path: String,
    /// Query parameters in order, percent-decoded.
    pub query: Vec<(String, String)>,
    /// The `Authorization` header's value, if sent.
    pub authorization: Option<String>,
}

impl Request {
    /// The value of parameter `name`, if given.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
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
    /// Headers beyond Content-Type, Content-Length and Connection.
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub(crate) fn ok(content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            status: 200,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    /// A one-line plain-text message.
    pub(crate) fn text(status: u16, message: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: format!("{message}\n").into_bytes(),
        }
    }

    /// A 503 asking the client to come back in `seconds`.
    pub(crate) fn busy(message: &str, seconds: u32) -> Self {
        Self::text(503, message).with_header("Retry-After", seconds.to_string())
    }

    pub(crate) fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
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
    // Header names are case-insensitive; values are kept as sent.
    let authorization = text.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_owned())
    });
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
        authorization,
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
        assert_eq!(r.authorization, None);
        let r = parse_request(b"GET /x HTTP/1.1\r\nauthoRIZATION:  Bearer abc \r\n\r\n").unwrap();
        assert_eq!(r.authorization.as_deref(), Some("Bearer abc"));
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
