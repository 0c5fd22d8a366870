//! Registration of Python processes, on a thread of its own: detection parses the
//! interpreter's ELF symbols (milliseconds, once per binary) and reads the process's memory,
//! and the reader that drains the ring buffer must never wait for it (as with the unwind
//! tables, unwind/background.rs). The collector queues each new pid here; once detected, the
//! process goes into the sampler's map and its `Interp` is shared back for naming, with its
//! memory pinned to the image detected (an exec or a reused pid never names its frames).
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, mpsc},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::python::PyProc;

use super::{
    detect::{self, ElfFacts, Interp, Refused},
    mem::Mem,
};

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

/// A registered process: its interpreter, and its memory as it was when detection began.
pub(super) struct Registration {
    pub interp: Interp,
    /// /proc/PID/mem opened before detection (`Mem::pinned`): names are read from this
    /// image only, never from one the pid exec'd later.
    pub mem: Mem,
    /// CLOCK_MONOTONIC ns when `mem` was opened: the kernel's records say which generation
    /// of the pid ran then (`Tracker` checks it before naming with it).
    pub opened_ns: u64,
}

/// What the thread and the collector share: the sampler's map and what was registered.
pub(super) struct Registry {
    map: BpfHashMap<MapData, u32, PyProc>,
    /// Registered processes (the sampler walks them), by pid: the sampler's map has one
    /// entry per pid, for the image it runs now.
    pub procs: HashMap<u32, Registration>,
    /// When each pid last exec'd or exited (while it may still be detected): a detection
    /// that began before it described the image that ended and is dropped.
    ended: HashMap<u32, u64>,
    /// Processes refused, counted by reason kind; the last message of each kind kept.
    pub refused: BTreeMap<&'static str, (u64, String)>,
    /// Python processes registered with the sampler.
    pub registered: u64,
}

impl Registry {
    pub(super) fn new(map: BpfHashMap<MapData, u32, PyProc>) -> Self {
        Self {
            map,
            procs: HashMap::new(),
            ended: HashMap::new(),
            refused: BTreeMap::new(),
            registered: 0,
        }
    }

    /// Registers `pid` with the sampler after its detection, or counts why not. `opened`:
    /// its memory handle and when it was opened, before detection began.
    pub(super) fn record(
        &mut self,
        pid: u32,
        detected: Result<Option<Interp>, Refused>,
        opened: Option<(Mem, u64)>,
    ) {
        match (detected, opened) {
            (Ok(None), _) => {}
            (Ok(Some(interp)), Some((mem, opened_ns))) => {
                // The image detected is gone (an exec or exit read since): the next
                // generation's first sample asks again.
                if self.ended.get(&pid).is_some_and(|&t| t >= opened_ns) {
                    return;
                }
                // Known before the sampler walks it: its first frames find their layout.
                let proc_ = interp.proc_;
                let version = interp.version;
                self.procs.insert(
                    pid,
                    Registration {
                        interp,
                        mem,
                        opened_ns,
                    },
                );
                match self.map.insert(pid, proc_, 0) {
                    Ok(()) => {
                        log::debug!("pid {pid}: Python {}.{}", version.0, version.1);
                        self.registered += 1;
                    }
                    Err(e) => {
                        self.procs.remove(&pid);
                        self.refuse(pid, "sampler map full", e.to_string());
                    }
                }
            }
            // Gone between its first sample and now: nothing to walk, nothing refused.
            (Ok(Some(_)), None) => {}
            (Err(e), _) => self.refuse(pid, e.kind(), e.to_string()),
        }
    }

    fn refuse(&mut self, pid: u32, kind: &'static str, message: String) {
        log::debug!("pid {pid}: no Python frames: {message}");
        let slot = self.refused.entry(kind).or_insert((0, String::new()));
        slot.0 += 1;
        slot.1 = message;
    }

    /// `pid` exec'd or exited at `time_ns`: a registration of the image that ended goes, from
    /// the sampler's map too (it must not walk the next image with this one's addresses).
    pub(super) fn ended(&mut self, pid: u32, time_ns: u64) {
        let slot = self.ended.entry(pid).or_insert(time_ns);
        *slot = (*slot).max(time_ns);
        if self.procs.get(&pid).is_some_and(|r| r.opened_ns < time_ns) {
            self.forget(pid);
        }
    }

    /// Forgets a process that is gone (its pid may come back as another process).
    pub(super) fn forget(&mut self, pid: u32) {
        if self.procs.remove(&pid).is_some() {
            let _ = self.map.remove(&pid);
        }
    }

    /// Forgets every pid `gone` says is gone, registered or only remembered as ended.
    pub(super) fn forget_gone(&mut self, gone: &mut impl FnMut(u32) -> bool) {
        let dead: Vec<u32> = self.procs.keys().copied().filter(|&p| gone(p)).collect();
        for pid in dead {
            self.forget(pid);
        }
        self.ended.retain(|&p, _| !gone(p));
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
                let (detected, opened) = detect_pinned(&mut detector, pid);
                let Ok(mut r) = registry.lock() else { break };
                r.record(pid, detected, opened);
            }
        })?;
    Ok(tx)
}

/// A detection's outcome, and the memory it pinned with when it was opened (CLOCK_MONOTONIC
/// ns).
pub(super) type Pinned = (Result<Option<Interp>, Refused>, Option<(Mem, u64)>);

/// Detects `pid` with its memory pinned first; the handle and when it was opened come back
/// only if the image detected is the pinned one (None: it was gone before the end).
pub(super) fn detect_pinned(detector: &mut Detector, pid: u32) -> Pinned {
    let opened_ns = crate::util::monotonic_ns();
    let mem = Mem::pinned(pid).ok();
    let detected = detector.detect(pid);
    // The pinned image still reads: it is the one detection read (an exec in between would
    // have ended it, and a pinned handle never reads the next image).
    let opened = match (&detected, mem) {
        (Ok(Some(i)), Some(mem)) if mem.u32(i.proc_.tss_key_addr).is_ok() => Some((mem, opened_ns)),
        _ => None,
    };
    (detected, opened)
}
