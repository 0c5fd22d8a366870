//! Python frames (issue 17), the user side: detect Python processes when first sampled and
//! register them with the sampler (`detect`, `thread`, off the drain on `registry`'s thread), name the (code object, instruction)
//! pairs the sampler appends to records while the process lives (`mem`, `linetable`), per
//! process generation until it exec'd or exited and was cut (`generations`), and
//! merge them into the native stack at the eval-loop frames when the profile is built
//! (`merge`). Collect -> here -> symbolize.
mod detect;
mod generations;
mod linetable;
pub(crate) mod mem;
pub(crate) mod merge;
mod registry;
mod thread;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, mpsc};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::python::{CHECK_SHIFT, INSTR_MASK, PyFrame, PyProc, STR_HASH, check_of};

use crate::process::{SpaceId, space_id, space_pid};
pub(crate) use detect::{CodeLayout, Lines};
pub(crate) use generations::PyKey;
use generations::{Generations, Use};
use mem::Mem;
use registry::{Detector, Registry};

/// The kernel-side facts the loader needs before loading the sampler.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelFacts {
    /// `task_struct.thread.fsbase` offset (BTF).
    pub fsbase_offset: u32,
    /// glibc's thread-specific data from the thread pointer.
    pub tsd_base: u32,
}

/// Why the Python walk cannot run on this host at all (one line).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    #[error("Python frames need the kernel's BTF (/sys/kernel/btf/vmlinux)")]
    Btf(#[source] std::io::Error),
    #[error("Python frames need glibc's thread-specific data layout")]
    Tsd(#[source] std::io::Error),
}

impl KernelFacts {
    pub(crate) fn find() -> Result<Self, SetupError> {
        Ok(Self {
            fsbase_offset: thread::fsbase_offset().map_err(SetupError::Btf)?,
            tsd_base: thread::tsd_base().map_err(SetupError::Tsd)?,
        })
    }
}

/// A named Python frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PyName {
    /// `co_qualname`.
    pub qualname: String,
    /// `co_filename` as the process has it.
    pub file: String,
    /// Line of the frame's current instruction; None when the line table has none.
    pub line: Option<i64>,
}

impl PyName {
    /// `qualname (file.py:LINE)`, with the file's last component.
    pub(crate) fn display(&self) -> String {
        let base = self.file.rsplit('/').next().unwrap_or(&self.file);
        match self.line {
            Some(l) => format!("{} ({base}:{l})", self.qualname),
            None => format!("{} ({base})", self.qualname),
        }
    }
}

/// A code object's naming facts, read once per (process generation, code pointer).
#[derive(Clone, Debug)]
struct Code {
    qualname: String,
    file: String,
    first_line: i64,
    linetable: Vec<u8>,
}

/// Python processes as the collector meets them: registered with the sampler (on the
/// `registry` thread), their frames named while they live, forgotten once they are gone and
/// every window that may need their names has taken them (`forget_gone`).
pub(crate) struct Tracker {
    registry: Arc<Mutex<Registry>>,
    /// Until the thread starts (at the first drain), detection runs here, for processes
    /// already running; then the thread owns it.
    detector: Option<Detector>,
    to_detect: Option<mpsc::Sender<u32>>,
    /// Names and code objects by process generation.
    gens: Generations,
    new_pids: Vec<u32>,
    /// Processes refused, counted by reason kind; the last message of each kind kept (as
    /// of the last `resolve_pending`).
    pub refused: BTreeMap<&'static str, (u64, String)>,
    /// Python processes registered with the sampler (as of the last `resolve_pending`).
    pub registered: u64,
}

impl Tracker {
    pub(crate) fn new(map: BpfHashMap<MapData, u32, PyProc>, facts: KernelFacts) -> Self {
        Self {
            registry: Arc::new(Mutex::new(Registry::new(map))),
            detector: Some(Detector::new(facts.tsd_base)),
            to_detect: None,
            gens: Generations::default(),
            new_pids: Vec::new(),
            refused: BTreeMap::new(),
            registered: 0,
        }
    }

    /// Detects and registers processes that already run (`pids`, or every process when
    /// empty), here and now, before sampling starts: their first samples have Python frames
    /// too rather than waiting for the drain that follows their first sample. Before any
    /// kernel record, each is in its first generation.
    pub(crate) fn register_running(&mut self, pids: &[u32]) {
        let all: Vec<u32>;
        let pids = if pids.is_empty() {
            all = crate::util::proc_pids()
                .map(Iterator::collect)
                .unwrap_or_default();
            &all
        } else {
            pids
        };
        let me = std::process::id();
        for &pid in pids {
            if pid == me || !self.gens.note(space_id(pid, 0)) {
                continue;
            }
            match &mut self.detector {
                Some(d) => {
                    let (detected, opened) = registry::detect_pinned(d, pid);
                    if let Ok(mut r) = self.registry.lock() {
                        r.record(pid, detected, opened);
                    }
                }
                None => self.new_pids.push(pid),
            }
        }
        self.sync_counts();
    }

    /// Notes a sample of process generation `space` and its Python frames (innermost first).
    /// `maybe_python` false: the kernel's records hold all of its mappings and none is an
    /// interpreter (`process::interpreter_named`), so a new generation is not detected (no
    /// /proc read for a `/bin/true`) unless it maps one later (`mapped_interpreter`).
    /// (Asked only of a new generation.)
    pub(crate) fn saw(
        &mut self,
        space: SpaceId,
        frames: &[PyFrame],
        maybe_python: impl FnOnce() -> bool,
    ) {
        let pid = space_pid(space);
        if pid != 0 && self.gens.saw(space, frames) {
            if !frames.is_empty() || maybe_python() {
                self.new_pids.push(pid);
            } else {
                self.gens.defer(space);
            }
        }
    }

    /// Generation `space` mapped a file named like an interpreter: detected now if its
    /// first sample was deferred.
    pub(crate) fn mapped_interpreter(&mut self, space: SpaceId) {
        if self.gens.mapped_interpreter(space) {
            self.new_pids.push(space_pid(space));
        }
    }

    /// Names by `PyKey`; None: not read (yet) or could not be read.
    pub(crate) fn names(&self) -> &HashMap<PyKey, Option<PyName>> {
        &self.gens.names
    }

    /// `pid` exec'd or exited at `time_ns`, ending generation `space`: its registration goes
    /// now (the sampler's map entry too); its names stay until `forget_gone`.
    pub(crate) fn ended(&mut self, pid: u32, space: SpaceId, time_ns: u64) {
        self.gens.end(space);
        if let Ok(mut r) = self.registry.lock() {
            r.ended(pid, time_ns);
        }
    }

    /// Queues the processes seen since the last call for detection (on the registry
    /// thread), and names the frames seen since (the process must be alive): this runs at
    /// every drain. `space_at` gives the generation a pid ran at a time, from the kernel's
    /// records read at or after `records_read_ns` (CLOCK_MONOTONIC).
    pub(crate) fn resolve_pending(
        &mut self,
        space_at: impl Fn(u32, u64) -> SpaceId,
        records_read_ns: u64,
    ) {
        if self.to_detect.is_none()
            && let Some(d) = self.detector.take()
        {
            match registry::spawn(d, Arc::clone(&self.registry)) {
                Ok(tx) => self.to_detect = Some(tx),
                Err(e) => log::warn!("cannot start the Python detection thread: {e}"),
            }
        }
        if let Some(tx) = &self.to_detect {
            for pid in self.new_pids.drain(..) {
                let _ = tx.send(pid);
            }
        }
        let mut later = Vec::new();
        for key in std::mem::take(&mut self.gens.unnamed) {
            match self.name(key, &space_at, records_read_ns) {
                Naming::Done(name) => {
                    self.gens.names.insert(key, name);
                }
                Naming::Later => later.push(key),
            }
        }
        self.gens.unnamed = later;
        self.sync_counts();
    }

    fn sync_counts(&mut self) {
        if let Ok(r) = self.registry.lock() {
            self.registered = r.registered;
            self.refused.clone_from(&r.refused);
        }
    }

    fn name(
        &mut self,
        (space, code, instr): PyKey,
        space_at: impl Fn(u32, u64) -> SpaceId,
        records_read_ns: u64,
    ) -> Naming {
        let pid = space_pid(space);
        let ended = self.gens.ended(space);
        let (layout, check_at, name_at, mem) = {
            let Ok(r) = self.registry.lock() else {
                return Naming::Done(None);
            };
            let p = r.procs.get(&pid);
            let reg = p.map(|p| (p.opened_ns, space_at(pid, p.opened_ns)));
            match (generations::usable(space, ended, reg, records_read_ns), p) {
                (Use::Read, Some(p)) => (
                    p.interp.code,
                    u64::from(p.interp.proc_.code_check),
                    u64::from(p.interp.proc_.name_check),
                    p.mem.clone(),
                ),
                (Use::Later, _) => return Naming::Later,
                _ => return Naming::Done(None),
            }
        };
        let check = instr >> CHECK_SHIFT;
        let instr = instr & INSTR_MASK;
        let Some(c) = self
            .gens
            .codes
            .entry((space, code, check))
            .or_insert_with(|| read_code(&mem, &layout, code, (check_at, name_at), check))
            .as_ref()
        else {
            return Naming::Done(None);
        };
        // 3.8-3.10: f_lasti (-1 before the first instruction), in bytes or code units.
        let lasti = || u64::try_from(((instr >> 1) as u32).cast_signed().max(0)).unwrap_or(0);
        let line = match layout.lines {
            Lines::Lnotab => Some(linetable::line_lnotab(&c.linetable, c.first_line, lasti())),
            Lines::Linetable310 => linetable::line_310(&c.linetable, c.first_line, 2 * lasti()),
            Lines::Locations => instr
                .checked_sub(layout.code_adaptive)
                .and_then(|off| linetable::line_at(&c.linetable, c.first_line, off / 2)),
        };
        Naming::Done(Some(PyName {
            qualname: c.qualname.clone(),
            file: c.file.clone(),
            line,
        }))
    }

    /// Forgets every generation that ended, and every one whose pid `gone` says is gone (its
    /// exit record may have been lost): names, code objects, registrations. Call it only
    /// once every window that may hold their samples has taken their names
    /// (`Collection::cut`); `record` never does, so its final profile names everything.
    pub(crate) fn forget_gone(&mut self, mut gone: impl FnMut(u32) -> bool) {
        self.gens.forget_gone(&mut gone);
        if let Ok(mut r) = self.registry.lock() {
            r.forget_gone(&mut gone);
        }
    }

    /// Process generations whose Python frames the tracker holds names for (the agent's
    /// `profiler_python_processes`): it follows the live Python processes, not the churn.
    pub(crate) fn python_processes(&self) -> usize {
        self.gens.python_processes()
    }
}

/// Whether a frame could be named now.
enum Naming {
    /// Named, or never will be (None).
    Done(Option<PyName>),
    /// Its generation's registration is not there yet: try at the next drain.
    Later,
}

/// Reads a code object, checking its type and its checksum first: a frame pointing at
/// anything else (a stale pointer, a 3.13 frame whose executable is not code, a code object
/// freed since the sample and another put in its place) is left unnamed.
/// `check_at` is `PyProc`'s (`code_check`, `name_check`).
fn read_code(
    mem: &Mem,
    l: &CodeLayout,
    code: u64,
    check_at: (u64, u64),
    check: u64,
) -> Option<Code> {
    if mem.u64(code + 8).ok()? != l.code_type {
        return None;
    }
    let (word_at, name_at) = check_at;
    if word_at != 0 {
        // As the sampler does: an unreadable name counts as hash 0.
        let hash = if name_at == 0 {
            0
        } else {
            mem.u64(code + name_at)
                .and_then(|name| mem.u64(name.wrapping_add(STR_HASH)))
                .unwrap_or(0)
        };
        if check_of(mem.u64(code + word_at).ok()? ^ hash) != check {
            return None;
        }
    }
    let s = |off: u64| {
        let obj = mem.u64(code + off).ok()?;
        mem.py_str(obj, l.ascii_size, l.compact_size).ok()
    };
    let qualname = s(l.qualname).or_else(|| s(l.name))?;
    let file = s(l.filename).unwrap_or_default();
    let first_line = i64::from(mem.u32(code + l.firstlineno).ok()? as i32);
    let linetable = mem
        .py_bytes(mem.u64(code + l.linetable).ok()?)
        .unwrap_or_default();
    Some(Code {
        qualname,
        file,
        first_line,
        linetable,
    })
}
