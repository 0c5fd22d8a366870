//! `profiler agent`, the always-on front end: the sampler stays attached (`sampler`), every
//! window becomes a profile that goes to the store (`crate::store`), the metrics, and the
//! push target; the HTTP API (`api`) serves all of it. One thread: a tokio `LocalSet`.
mod api;
pub mod config;
pub mod metrics;
pub mod push;
pub mod sampler;

use std::{cell::RefCell, collections::VecDeque, rc::Rc, time::Duration};

pub use config::AgentConfig;
use metrics::Metrics;
pub use sampler::Recorder;

use crate::{
    bpf::Event,
    profile::Profile,
    record::RecordError,
    store::{Store, StoreError},
};

/// Windows kept in memory while the store fails, at most (then the oldest are dropped and
/// counted in `profiler_windows_total{outcome="dropped"}`).
pub const MAX_PENDING: usize = 60;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("cannot use the push spool in the data dir")]
    Spool(#[source] std::io::Error),
    #[error("{0}")]
    PushUrl(String),
    #[error("cannot start the runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Token(#[from] crate::http::TokenError),
    #[error("{0}")]
    Exposure(String),
}

/// What the HTTP API shares with the sampling loop.
pub(crate) struct State {
    pub config: AgentConfig,
    pub metrics: RefCell<Metrics>,
    /// A /debug/pprof/profile recording is running (one at a time).
    pub pprof_busy: std::cell::Cell<bool>,
    /// Store reads running now (`api::MAX_HEAVY` at most).
    pub heavy: std::cell::Cell<usize>,
    /// Why the store fails, while it does (/healthz says it).
    pub store_problem: RefCell<Option<String>>,
}

/// Runs the agent until SIGTERM or SIGINT, then stores the current window and returns.
pub fn run(config: AgentConfig) -> Result<(), AgentError> {
    // Every check before loading BPF, so a bad data dir, port or token fails fast and clearly.
    config.check_exposure().map_err(AgentError::Exposure)?;
    let token = config
        .token_file
        .as_deref()
        .map(crate::http::Token::from_file)
        .transpose()?;
    let mut store = Store::open(&config.data_dir)?;
    let listener = std::net::TcpListener::bind(config.listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| AgentError::Listen {
            addr: config.listen,
            source,
        })?;
    let push_url = config
        .push_url
        .as_deref()
        .map(push::parse_push_url)
        .transpose()
        .map_err(AgentError::PushUrl)?;
    let pusher = match push_url {
        Some(url) => Some(push::Pusher::new(url, &config.data_dir).map_err(AgentError::Spool)?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|source| AgentError::Listen {
                addr: config.listen,
                source,
            })?;
        let mut recorder =
            Recorder::start(Event::CpuClock, config.frequency_hz, config.comms.clone())?;
        let state = Rc::new(State {
            config: config.clone(),
            metrics: RefCell::new(Metrics::default()),
            pprof_busy: std::cell::Cell::new(false),
            heavy: std::cell::Cell::new(0),
            store_problem: RefCell::new(None),
        });
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        tokio::task::spawn_local(async move {
            // Forever, in practice: only a signal ends it.
            crate::record::stop_signal(Duration::from_secs(u64::from(u32::MAX))).await;
            let _ = stop_tx.send(true);
        });
        if let Some(p) = &pusher {
            tokio::task::spawn_local(p.clone().run());
        }
        let api_state = state.clone();
        tokio::task::spawn_local(crate::http::serve(listener, token, move |req| {
            api::handle(api_state.clone(), req)
        }));
        eprintln!(
            "agent: sampling every CPU at {} Hz, {:?} windows into {}, API on http://{}",
            config.frequency_hz,
            config.window,
            config.data_dir.display(),
            config.listen
        );
        let mut pending: VecDeque<Profile> = VecDeque::new();
        let mut failing = false;
        let mut retention_failing = false;
        loop {
            let deadline = tokio::time::Instant::now() + config.window;
            let stop = async {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    _ = stop_rx.changed() => {}
                }
            };
            let profile = recorder.window(stop).await?;
            let stopping = *stop_rx.borrow();
            state.metrics.borrow_mut().add_window(&profile);
            if let Some(p) = &pusher {
                p.enqueue(&profile, &profile.meta.hostname);
                let mut m = state.metrics.borrow_mut();
                m.push_sent = p.sent.get();
                m.push_dropped = p.dropped.get();
            }
            pending.push_back(profile);
            failing = store_pending(&mut store, &mut pending, &state, failing);
            let now = unix_now_ns();
            let retained = store.retain(
                now,
                config.retention.as_nanos() as u64,
                config.max_size_bytes,
            );
            // Once per failing spell, like writes: on a full disk it fails every window.
            match retained {
                Err(e) if !retention_failing => {
                    log::error!("store retention failed: {}", crate::util::chain(&e));
                    retention_failing = true;
                }
                Err(_) => {}
                Ok(_) => retention_failing = false,
            }
            if stopping {
                if pending.is_empty() {
                    eprintln!("agent: stopped; the last window is stored");
                } else {
                    log::error!(
                        "agent: stopped; {} windows could not be stored and are lost",
                        pending.len()
                    );
                }
                return Ok(());
            }
        }
    })
}

/// Writes the pending windows, oldest first; on failure keeps them (bounded) for the next
/// try. Returns whether the store is failing, to log a failure once rather than per window.
fn store_pending(
    store: &mut Store,
    pending: &mut VecDeque<Profile>,
    state: &State,
    failing: bool,
) -> bool {
    while let Some(p) = pending.front() {
        match store.write_window(p) {
            Ok(()) => {
                pending.pop_front();
                state.metrics.borrow_mut().windows_stored += 1;
            }
            Err(e) => {
                *state.store_problem.borrow_mut() = Some(format!(
                    "cannot write to the store: {}; {} windows wait in memory",
                    crate::util::chain(&e),
                    pending.len().min(MAX_PENDING)
                ));
                if !failing {
                    log::error!(
                        "cannot write to the store: {}; sampling goes on, keeping up to {MAX_PENDING} windows in memory",
                        crate::util::chain(&e)
                    );
                }
                while pending.len() > MAX_PENDING {
                    pending.pop_front();
                    state.metrics.borrow_mut().windows_dropped += 1;
                }
                return true;
            }
        }
    }
    if failing {
        log::warn!("the store works again; every kept window is written");
    }
    *state.store_problem.borrow_mut() = None;
    false
}

/// Wall-clock now, ns since the Unix epoch.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A time given as `now` or as a duration ago (`1h`, `30m`, `90s`), in ns since the epoch.
pub fn time_ago(text: &str, now_unix_ns: u64) -> Result<u64, String> {
    if text == "now" {
        return Ok(now_unix_ns);
    }
    let d = crate::util::parse_duration(text)
        .map_err(|e| format!("{e} (a time is `now` or a duration ago such as 1h, 30m)"))?;
    Ok(now_unix_ns.saturating_sub(d.as_nanos() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_ago() {
        let now = 10_000 * 1_000_000_000;
        assert_eq!(time_ago("now", now), Ok(now));
        assert_eq!(time_ago("1h", now), Ok(now - 3600 * 1_000_000_000));
        assert!(time_ago("yesterday", now).is_err());
    }
}
