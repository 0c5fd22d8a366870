//! The API's bearer token: read once at start from a file (a Kubernetes Secret mounts as
//! one), compared in constant time with what each request sends.
use std::{io::Read, os::unix::fs::OpenOptionsExt, path::Path};

/// Bytes a token file may hold at most (a token is a line; this is not a place for data).
const MAX_FILE: u64 = 4096;
/// Characters a token needs at least: shorter ones can be guessed over the network.
pub(super) const MIN_TOKEN: usize = 16;

/// A secret that requests must present as `Authorization: Bearer TOKEN`.
#[derive(Clone)]
pub(crate) struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)") // never print the secret
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("cannot read token file {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "token file {path} {problem}; write one line of at least {MIN_TOKEN} printable characters, e.g. `head -c 32 /dev/urandom | base64 > {path}`"
    )]
    Bad { path: String, problem: &'static str },
}

impl Token {
    /// Reads the token: the file's content without surrounding whitespace. Only a regular
    /// file of at most 4 KiB holding one line of printable ASCII, 16 characters or more.
    pub(crate) fn from_file(path: &Path) -> Result<Self, TokenError> {
        let shown = path.display().to_string();
        let read = |source| TokenError::Read {
            path: shown.clone(),
            source,
        };
        let bad = |problem| TokenError::Bad {
            path: shown.clone(),
            problem,
        };
        // Non-blocking: a FIFO put there must not hang the start.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(read)?;
        if !file.metadata().map_err(read)?.is_file() {
            return Err(bad("is not a regular file"));
        }
        let mut bytes = Vec::new();
        file.take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(bad("is larger than 4 KiB"));
        }
        let token = bytes.trim_ascii();
        if !token.iter().all(u8::is_ascii_graphic) {
            return Err(bad("holds more than one printable word"));
        }
        if token.len() < MIN_TOKEN {
            return Err(bad("holds a token that is too short"));
        }
        Ok(Self(token.to_vec()))
    }

    /// True if `authorization` (the header's value) is `Bearer TOKEN`. The comparison takes
    /// the same time wherever the first difference is, so timing reveals no prefix.
    pub(crate) fn authorizes(&self, authorization: Option<&str>) -> bool {
        let Some(sent) = authorization.and_then(|a| {
            let (scheme, rest) = a.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        }) else {
            return false;
        };
        constant_time_eq(sent.as_bytes(), &self.0)
    }
}

/// Equal in time independent of where `a` and `b` differ (the length is not secret: it is
/// compared, but the loop runs over the expected token's length whatever was sent).
fn constant_time_eq(a: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ e;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let dir = tempfile::Builder::new()
            .prefix("token-test-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  s3cret-s3cret-s3cret\n").unwrap();
        let t = Token::from_file(&file).unwrap();
        assert!(t.authorizes(Some("Bearer s3cret-s3cret-s3cret")));
        assert!(t.authorizes(Some("bearer s3cret-s3cret-s3cret")));
        for wrong in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer s3cret-s3cret-s3cre"),
            Some("Bearer s3cret-s3cret-s3crett"),
            Some("Basic s3cret-s3cret-s3cret"),
            Some("Bearer S3cret-s3cret-s3cret"),
        ] {
            assert!(!t.authorizes(wrong), "{wrong:?}");
        }
        assert!(
            format!("{t:?}").contains(".."),
            "the secret is never printed"
        );
        for (text, want) in [
            ("short\n", "too short"),
            ("two words here, long enough\n", "more than one"),
            ("", "too short"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = Token::from_file(&file).unwrap_err().to_string();
            assert!(e.contains(want) && e.lines().count() == 1, "{text:?}: {e}");
        }
        let e = Token::from_file(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("regular file") || e.contains("cannot read"),
            "{e}"
        );
        assert!(Token::from_file(&dir.path().join("missing")).is_err());
    }
}
