//! Registration of Python processes, on a thread of its own: detection parses the
//! interpreter's ELF symbols (milliseconds, once per binary) and reads the process's memory,
//! and the reader that drains the ring buffer must never wait for it (as with the unwind
//! tables, unwind/background.rs). The collector queues each new pid here; once detected, the
//! process goes into the sampler's map and its `Interp` is shared back for naming.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, mpsc},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::python::PyProc;

use super::detect::{self, ElfFacts, Interp, Refused};

/// Detection state: the interpreters' symbols by (device, inode), so a fleet of one
/// interpreter reads its binary once.
pub(super) struct Detector {
    tsd_base: u32,
    elf_cache: HashMap<(u64, u64), ElfFacts>,
}

impl Detector {
    pub(super) fn new(tsd_base: u32) -> Self {
        Self {
            tsd_base,
            elf_cache: HashMap::new(),
        }
    }

    pub(super) fn detect(&mut self, pid: u32) -> Result<Option<Interp>, Refused> {
        detect::detect(pid, self.tsd_base, &mut self.elf_cache)
    }
}

/// What the thread and the collector share: the sampler's map and what was registered.
pub(super) struct Registry {
    map: BpfHashMap<MapData, u32, PyProc>,
    /// Registered processes (the sampler walks them).
    pub interps: HashMap<u32, Interp>,
    /// Processes refused, counted by reason kind; the last message of each kind kept.
    pub refused: BTreeMap<&'static str, (u64, String)>,
    /// Python processes registered with the sampler.
    pub registered: u64,
}

impl Registry {
    pub(super) fn new(map: BpfHashMap<MapData, u32, PyProc>) -> Self {
        Self {
            map,
            interps: HashMap::new(),
            refused: BTreeMap::new(),
            registered: 0,
        }
    }

    /// Registers `pid` with the sampler after its detection, or counts why not.
    pub(super) fn record(&mut self, pid: u32, detected: Result<Option<Interp>, Refused>) {
        match detected {
            Ok(None) => {}
            Ok(Some(interp)) => {
                // Known before the sampler walks it: its first frames find their layout.
                let proc_ = interp.proc_;
                let version = interp.version;
                self.interps.insert(pid, interp);
                match self.map.insert(pid, proc_, 0) {
                    Ok(()) => {
                        log::debug!("pid {pid}: Python {}.{}", version.0, version.1);
                        self.registered += 1;
                    }
                    Err(e) => {
                        self.interps.remove(&pid);
                        self.refuse(pid, "sampler map full", e.to_string());
                    }
                }
            }
            Err(e) => self.refuse(pid, e.kind(), e.to_string()),
        }
    }

    fn refuse(&mut self, pid: u32, kind: &'static str, message: String) {
        log::debug!("pid {pid}: no Python frames: {message}");
        let slot = self.refused.entry(kind).or_insert((0, String::new()));
        slot.0 += 1;
        slot.1 = message;
    }

    /// Forgets a process that exited (its pid may come back as another process).
    pub(super) fn forget(&mut self, pid: u32) {
        self.interps.remove(&pid);
        let _ = self.map.remove(&pid);
    }
}

/// The registration thread: pids in, registrations into the shared `Registry`. It ends when
/// the sender is dropped (the recording ends), after the pid in hand.
pub(super) fn spawn(
    mut detector: Detector,
    registry: Arc<Mutex<Registry>>,
) -> std::io::Result<mpsc::Sender<u32>> {
    let (tx, rx) = mpsc::channel::<u32>();
    std::thread::Builder::new()
        .name("python-detect".into())
        .spawn(move || {
            while let Ok(pid) = rx.recv() {
                // Detection (the slow part) outside the lock: naming on the collector's
                // thread takes it too.
                let detected = detector.detect(pid);
                let Ok(mut r) = registry.lock() else { break };
                r.record(pid, detected);
            }
        })?;
    Ok(tx)
}
