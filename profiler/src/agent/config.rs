//! The agent's settings: defaults, an optional TOML file with the same keys as the flags
//! (kebab-case or snake_case), then flags given on the command line, which win.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{
    unwind::{TablePolicy, UnwindMode},
    util::{InputError, check_hz, parse_bytes, parse_duration, parse_hz},
};

/// Everything the agent needs to run.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u32,
    /// Length of one stored window.
    pub window: Duration,
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// Windows older than this are deleted.
    pub retention: Duration,
    /// Windows older than this keep their counts but lose their sample times (a heat map
    /// of them says "no exact times").
    pub keep_times: Duration,
    /// The store is kept under this many bytes (oldest windows go first).
    pub max_size_bytes: u64,
    /// Address of the HTTP API.
    pub listen: SocketAddr,
    /// Pyroscope-compatible server to push each window to (base URL, `/ingest` is added).
    pub push_url: Option<String>,
    /// OTLP/HTTP endpoint to send each window to (base URL, `/v1development/profiles` is added).
    pub otlp_endpoint: Option<String>,
    /// Only threads with these comms; empty = all.
    pub comms: Vec<String>,
    /// File holding the bearer token every API request but /healthz must send.
    pub token_file: Option<PathBuf>,
    /// Serve a non-loopback `listen` address without a token (on purpose).
    pub insecure_listen: bool,
    /// How user stacks are walked (as `record --unwind`).
    pub unwind: UnwindMode,
    /// Kernel memory for unwind tables, bytes.
    pub unwind_memory: u64,
    /// Which binaries get unwind tables (as `record --unwind-tables`; default `reached`).
    pub unwind_tables: TablePolicy,
    /// Name Python frames in CPython processes.
    pub python: bool,
    /// Time every thread's run-queue waits (`/metrics` histograms per CPU).
    pub runq: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            frequency_hz: 19,
            window: Duration::from_secs(10),
            data_dir: PathBuf::from("/var/lib/profiler"),
            retention: Duration::from_secs(7 * 24 * 3600),
            // Times are most of a window's bytes (docs/agent.md): a day of them, a week of counts.
            keep_times: Duration::from_secs(24 * 3600),
            max_size_bytes: 1 << 30,
            // Loopback unless asked: profiles reveal what a host runs.
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            push_url: None,
            otlp_endpoint: None,
            comms: Vec::new(),
            token_file: None,
            insecure_listen: false,
            // As `record`: whole stacks through code without frame pointers, Python named.
            unwind: UnwindMode::Auto,
            unwind_memory: 64 << 20,
            // Every process of the host is sampled now and then: a table for each binary it
            // maps cost the agent CPU and memory for libraries no stack went through.
            unwind_tables: TablePolicy::Reached,
            python: true,
            // About 0.4 us a context switch (BENCHMARKS.md): more than the agent's budget on
            // a host that switches a lot, so asked for.
            runq: false,
        }
    }
}

/// Why the config file was refused; each names the file or the key, its cause follows.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {}: not UTF-8 text", path.display())]
    NotUtf8 { path: PathBuf },
    /// toml's own error spans several lines with a source excerpt: only its one-line
    /// message is kept, so it is not a `source()`.
    #[error("config {}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    /// A value whose message names its key already (frequency, window, listen, max size).
    #[error(transparent)]
    Value(#[from] InputError),
    /// A value whose message does not: the key says which.
    #[error("{key}")]
    Key {
        key: &'static str,
        #[source]
        source: InputError,
    },
    #[error("unwind must be auto, fp or dwarf, got `{0}`")]
    Unwind(String),
    #[error("unwind-tables must be all or reached, got `{0}`")]
    UnwindTables(String),
    #[error("{key} must be on or off, got `{value}`")]
    OnOff { key: &'static str, value: String },
}

/// A switch's value in the file: `on` or `off`.
fn on_off(key: &'static str, value: String) -> Result<bool, ConfigError> {
    match value.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(ConfigError::OnOff { key, value }),
    }
}

/// Largest config file read: the keys fit in a few hundred bytes.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The TOML file: every key optional, unknown keys rejected (serde names the key).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(alias = "frequency_hz")]
    pub frequency: Option<u32>,
    pub window: Option<String>,
    #[serde(alias = "data_dir")]
    pub data_dir: Option<PathBuf>,
    pub retention: Option<String>,
    #[serde(alias = "keep_times")]
    pub keep_times: Option<String>,
    #[serde(alias = "max_size")]
    pub max_size: Option<String>,
    pub listen: Option<String>,
    #[serde(alias = "push_url")]
    pub push_url: Option<String>,
    #[serde(alias = "otlp_endpoint")]
    pub otlp_endpoint: Option<String>,
    pub comm: Option<Vec<String>>,
    #[serde(alias = "token_file")]
    pub token_file: Option<PathBuf>,
    #[serde(alias = "insecure_listen")]
    pub insecure_listen: Option<bool>,
    /// `auto`, `fp` or `dwarf`.
    pub unwind: Option<String>,
    #[serde(alias = "unwind_memory")]
    pub unwind_memory: Option<String>,
    /// `all` or `reached`.
    #[serde(alias = "unwind_tables")]
    pub unwind_tables: Option<String>,
    /// `on` or `off`.
    pub python: Option<String>,
    /// `on` or `off`.
    pub runq: Option<String>,
}

impl FileConfig {
    /// Reads and parses `path`; errors say which file and which key. Only a regular file of
    /// at most `MAX_CONFIG_BYTES` is read (a FIFO or /dev/zero would hang or exhaust the agent).
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let bytes = crate::util::read_regular(path, MAX_CONFIG_BYTES).map_err(|source| {
            ConfigError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|_| ConfigError::NotUtf8 {
            path: path.to_owned(),
        })?;
        Self::parse(&text, path)
    }

    /// Parses the TOML text of the file at `path` (named in errors).
    pub fn parse(text: &str, path: &std::path::Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.message().to_owned(),
        })
    }

    /// Applies the file's keys over `c`.
    pub fn apply(self, c: &mut AgentConfig) -> Result<(), ConfigError> {
        let Self {
            frequency,
            window,
            data_dir,
            retention,
            keep_times,
            max_size,
            listen,
            push_url,
            otlp_endpoint,
            comm,
            token_file,
            insecure_listen,
            unwind,
            unwind_memory,
            unwind_tables,
            python,
            runq,
        } = self;
        if let Some(hz) = frequency {
            c.frequency_hz = check_hz(hz, MAX_HZ)?;
        }
        if let Some(w) = window {
            c.window = parse_window(&w)?;
        }
        if let Some(d) = data_dir {
            c.data_dir = d;
        }
        if let Some(r) = retention {
            c.retention = parse_duration(&r).map_err(key("retention"))?;
        }
        if let Some(k) = keep_times {
            c.keep_times = parse_duration(&k).map_err(key("keep-times"))?;
        }
        if let Some(s) = max_size {
            c.max_size_bytes = parse_size(&s)?;
        }
        if let Some(l) = listen {
            c.listen = parse_listen(&l)?;
        }
        if push_url.is_some() {
            c.push_url = push_url;
        }
        if otlp_endpoint.is_some() {
            c.otlp_endpoint = otlp_endpoint;
        }
        if let Some(comm) = comm {
            c.comms = (comm.iter())
                .map(|n| crate::util::parse_comm(n))
                .collect::<Result<_, _>>()
                .map_err(key("comm"))?;
        }
        if token_file.is_some() {
            c.token_file = token_file;
        }
        if let Some(insecure) = insecure_listen {
            c.insecure_listen = insecure;
        }
        if let Some(u) = unwind {
            c.unwind = <UnwindMode as clap::ValueEnum>::from_str(&u, false)
                .map_err(|_| ConfigError::Unwind(u))?;
        }
        if let Some(t) = unwind_tables {
            c.unwind_tables = <TablePolicy as clap::ValueEnum>::from_str(&t, false)
                .map_err(|_| ConfigError::UnwindTables(t))?;
        }
        if let Some(m) = unwind_memory {
            c.unwind_memory = parse_bytes(&m).map_err(key("unwind-memory"))?;
        }
        if let Some(p) = python {
            c.python = on_off("python", p)?;
        }
        if let Some(r) = runq {
            c.runq = on_off("runq", r)?;
        }
        Ok(())
    }
}

/// `ConfigError::Key` for the value of `name`.
fn key(name: &'static str) -> impl Fn(InputError) -> ConfigError {
    move |source| ConfigError::Key { key: name, source }
}

/// The highest sampling frequency the agent takes, Hz: it is always on.
pub(crate) const MAX_HZ: u32 = 1000;

/// `--frequency` of the agent: a whole number of Hz in 1..=MAX_HZ.
pub(crate) fn parse_frequency(text: &str) -> Result<u32, InputError> {
    parse_hz(text, MAX_HZ)
}

/// A window length: 1 s to 1 h.
pub(crate) fn parse_window(text: &str) -> Result<Duration, InputError> {
    let d = parse_duration(text)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
        return Err(InputError::Window(text.to_owned()));
    }
    Ok(d)
}

/// `ADDR:PORT`, e.g. 127.0.0.1:7070 or [::1]:7070.
pub(crate) fn parse_listen(text: &str) -> Result<SocketAddr, InputError> {
    text.parse()
        .map_err(|_| InputError::Listen(text.to_owned()))
}

/// A non-loopback `listen` without a token or consent (`AgentConfig::check_exposure`).
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve the API on {listen} without a token: give --token-file FILE (clients send `Authorization: Bearer TOKEN`), or --insecure-listen to serve it to anyone who can reach it"
)]
pub(crate) struct ExposureError {
    listen: SocketAddr,
}

impl AgentConfig {
    /// What the store keeps (`Store::retain`).
    pub(crate) fn store_retention(&self) -> crate::store::Retention {
        crate::store::Retention {
            max_age_ns: self.retention.as_nanos() as u64,
            keep_times_ns: self.keep_times.as_nanos() as u64,
            max_bytes: self.max_size_bytes,
        }
    }

    /// Refuses a non-loopback `listen` without a token unless `insecure_listen` says so:
    /// profiles show what every process on the host runs, and the API can be made to work.
    pub(crate) fn check_exposure(&self) -> Result<(), ExposureError> {
        if self.listen.ip().is_loopback() || self.token_file.is_some() || self.insecure_listen {
            return Ok(());
        }
        Err(ExposureError {
            listen: self.listen,
        })
    }
}

/// `max-size` of the store: a size (`util::parse_bytes`) of 1 MiB or more.
pub(crate) fn parse_size(text: &str) -> Result<u64, InputError> {
    let bytes = parse_bytes(text)?;
    if bytes < 1 << 20 {
        return Err(InputError::SizeBelowMiB(text.to_owned()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("500MiB"), Ok(500 << 20));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("10").is_err());
    }

    #[test]
    fn unknown_key_is_named() {
        let e = toml::from_str::<FileConfig>("frequency = 19\nwindoww = \"10s\"\n").unwrap_err();
        assert!(e.message().contains("windoww"), "{}", e.message());
        let ok: FileConfig = toml::from_str("data-dir = \"/tmp/x\"\nmax_size = \"2GiB\"").unwrap();
        let mut c = AgentConfig::default();
        ok.apply(&mut c).unwrap();
        assert_eq!(c.max_size_bytes, 2 << 30);
    }

    #[test]
    fn unwind_and_python_keys() {
        let f: FileConfig =
            toml::from_str("unwind = \"dwarf\"\nunwind-memory = \"16M\"\npython = \"off\"\nunwind-tables = \"all\"")
                .unwrap();
        let mut c = AgentConfig::default();
        assert_eq!(
            (c.unwind, c.python, c.unwind_tables),
            (UnwindMode::Auto, true, TablePolicy::Reached)
        );
        f.apply(&mut c).unwrap();
        assert_eq!(
            (c.unwind, c.unwind_memory, c.python, c.unwind_tables),
            (UnwindMode::Dwarf, 16 << 20, false, TablePolicy::All)
        );
        for (text, want) in [
            (
                "unwind = \"frames\"",
                "unwind must be auto, fp or dwarf, got `frames`",
            ),
            ("python = \"yes\"", "python must be on or off, got `yes`"),
            ("runq = \"1\"", "runq must be on or off, got `1`"),
            (
                "unwind-tables = \"some\"",
                "unwind-tables must be all or reached, got `some`",
            ),
            (
                "unwind-memory = \"lots\"",
                "unwind-memory: `lots` is not a size",
            ),
        ] {
            let f: FileConfig = toml::from_str(text).unwrap();
            let e = crate::util::chain(&f.apply(&mut AgentConfig::default()).unwrap_err());
            assert!(e.starts_with(want), "{text}: {e}");
        }
    }

    /// A config path pointing at a device, a FIFO nobody writes or a huge file is one error,
    /// at once: not a hang, not memory exhaustion.
    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::Builder::new()
            .prefix("profiler-config-")
            .tempdir()
            .unwrap();
        let fifo = dir.path().join("fifo.toml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path we pass.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let big = dir.path().join("big.toml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_CONFIG_BYTES + 1)
            .unwrap();
        for (path, says) in [
            (std::path::Path::new("/dev/zero"), "not a regular file"),
            (&fifo, "not a regular file"),
            (dir.path(), "a directory"),
            (&big, "larger than 1 MiB"),
        ] {
            let e = crate::util::chain(&FileConfig::load(path).unwrap_err());
            assert!(
                e.contains(says) && !e.contains('\n'),
                "{}: {e}",
                path.display()
            );
        }
    }

    /// The example in docs/agent.md is what users copy into /etc/profiler/agent.toml.
    #[test]
    fn the_documented_example_applies() {
        let doc = include_str!("../../../docs/agent.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/agent.md has a toml example");
        let file: FileConfig = toml::from_str(example).unwrap();
        let mut c = AgentConfig::default();
        file.apply(&mut c).unwrap();
        assert_eq!(c.retention, std::time::Duration::from_secs(3 * 86400));
        assert_eq!(c.max_size_bytes, 500 << 20);
    }

    #[test]
    fn non_loopback_needs_a_token_or_consent() {
        let mut c = AgentConfig::default();
        assert!(c.check_exposure().is_ok());
        c.listen = parse_listen("0.0.0.0:7070").unwrap();
        let e = c.check_exposure().unwrap_err().to_string();
        assert!(
            e.contains("--token-file") && e.contains("--insecure-listen"),
            "{e}"
        );
        let file: FileConfig = toml::from_str("token-file = \"/run/t\"").unwrap();
        file.apply(&mut c).unwrap();
        assert!(c.check_exposure().is_ok());
        let mut c = AgentConfig {
            listen: parse_listen("[::]:7070").unwrap(),
            ..AgentConfig::default()
        };
        assert!(c.check_exposure().is_err());
        let file: FileConfig = toml::from_str("insecure_listen = true").unwrap();
        file.apply(&mut c).unwrap();
        assert!(c.check_exposure().is_ok());
    }
}
