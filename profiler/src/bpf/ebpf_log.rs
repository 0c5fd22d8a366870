//! aya-log for the kernel programs' debug diagnostics (a failed stack walk, a full ring
//! buffer), shown with `-vv`. Off otherwise: `AYA_LOG_LEVEL` is set to 0 at load, and as a
//! read-only global it lets the verifier drop every log call, so sampling pays nothing.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::Ebpf;

/// The aya-log-ebpf global the log macros test (aya-log-common's `Level`: 4 = debug).
pub(crate) const GLOBAL_LOG_LEVEL: &str = "AYA_LOG_LEVEL";

/// aya-log-common's `Level::Debug`, the most the programs log.
pub(crate) const MAX_LEVEL: u8 = 4;

/// The level the programs log at: debug when the user asked for debug output, else none.
pub(crate) fn level() -> u8 {
    if log::log_enabled!(log::Level::Debug) {
        MAX_LEVEL
    } else {
        0
    }
}

/// Passes the programs' log records to `log` from a thread of its own while it lives.
pub(crate) struct EbpfLog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EbpfLog {
    /// Starts reading when logging is on (`level() > 0`); None otherwise or without the map.
    pub(crate) fn start(ebpf: &mut Ebpf) -> Option<Self> {
        if level() == 0 {
            return None;
        }
        let mut logger = aya_log::EbpfLogger::init(ebpf)
            .map_err(|e| log::debug!("no eBPF log: {}", crate::util::chain(&e)))
            .ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            // Diagnostics, not data: a 200 ms delay is fine, and the last records are read
            // after the stop.
            while !stopped.load(Ordering::Relaxed) {
                logger.flush();
                std::thread::sleep(Duration::from_millis(200));
            }
            logger.flush();
        });
        Some(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EbpfLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
