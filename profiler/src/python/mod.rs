//! Python frames (issue 17), the user side: detect Python processes when first sampled and
//! register them with the sampler (`detect`, `thread`), name the (code object, instruction)
//! pairs the sampler appends to records while the process lives (`mem`, `linetable`), and
//! merge them into the native stack at the eval-loop frames when the profile is built
//! (`merge`). Collect -> here -> symbolize.
mod detect;
mod linetable;
pub mod mem;
pub mod merge;
mod thread;

use std::collections::{BTreeMap, HashMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::python::{ENTRY_BIT, PyFrame, PyProc};

pub use detect::{CodeLayout, Interp, Refused};
use mem::Mem;

/// The kernel-side facts the loader needs before loading the sampler.
#[derive(Clone, Copy, Debug)]
pub struct KernelFacts {
    /// `task_struct.thread.fsbase` offset (BTF).
    pub fsbase_offset: u32,
    /// glibc's thread-specific data from the thread pointer.
    pub tsd_base: u32,
}

/// Why the Python walk cannot run on this host at all (one line).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("Python frames need the kernel's BTF (/sys/kernel/btf/vmlinux)")]
    Btf(#[source] std::io::Error),
    #[error("Python frames need glibc's thread-specific data layout")]
    Tsd(#[source] std::io::Error),
}

impl KernelFacts {
    pub fn find() -> Result<Self, SetupError> {
        Ok(Self {
            fsbase_offset: thread::fsbase_offset().map_err(SetupError::Btf)?,
            tsd_base: thread::tsd_base().map_err(SetupError::Tsd)?,
        })
    }
}

/// A named Python frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyName {
    /// `co_qualname`.
    pub qualname: String,
    /// `co_filename` as the process has it.
    pub file: String,
    /// Line of the frame's current instruction; None when the line table has none.
    pub line: Option<i64>,
}

impl PyName {
    /// `qualname (file.py:LINE)`, with the file's last component.
    pub fn display(&self) -> String {
        let base = self.file.rsplit('/').next().unwrap_or(&self.file);
        match self.line {
            Some(l) => format!("{} ({base}:{l})", self.qualname),
            None => format!("{} ({base})", self.qualname),
        }
    }
}

/// A code object's naming facts, read once per (pid, code pointer).
#[derive(Clone, Debug)]
struct Code {
    qualname: String,
    file: String,
    first_line: i64,
    linetable: Vec<u8>,
}

/// Python processes as the collector meets them: registered with the sampler, their frames
/// named while they live.
pub struct Tracker {
    map: BpfHashMap<MapData, u32, PyProc>,
    tsd_base: u32,
    seen: HashSet<u32>,
    new_pids: Vec<u32>,
    interps: HashMap<u32, Interp>,
    elf_cache: HashMap<(u64, u64), detect::ElfFacts>,
    codes: HashMap<(u32, u64), Option<Code>>,
    /// Names by (pid, code, instruction); None: could not be read.
    pub names: HashMap<(u32, u64, u64), Option<PyName>>,
    unnamed: Vec<(u32, u64, u64)>,
    /// Processes refused, counted by reason kind; the last message of each kind kept.
    pub refused: BTreeMap<&'static str, (u64, String)>,
    /// Python processes registered with the sampler.
    pub registered: u64,
}

impl Tracker {
    pub fn new(map: BpfHashMap<MapData, u32, PyProc>, facts: KernelFacts) -> Self {
        Self {
            map,
            tsd_base: facts.tsd_base,
            seen: HashSet::new(),
            new_pids: Vec::new(),
            interps: HashMap::new(),
            elf_cache: HashMap::new(),
            codes: HashMap::new(),
            names: HashMap::new(),
            unnamed: Vec::new(),
            refused: BTreeMap::new(),
            registered: 0,
        }
    }

    /// Detects and registers processes that already run (`pids`, or every process when
    /// empty), so their first samples have Python frames too rather than waiting for the
    /// drain that follows their first sample.
    pub fn register_running(&mut self, pids: &[u32]) {
        let all: Vec<u32>;
        let pids = if pids.is_empty() {
            all = std::fs::read_dir("/proc")
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            &all
        } else {
            pids
        };
        let me = std::process::id();
        for &pid in pids {
            if pid != me && self.seen.insert(pid) {
                self.new_pids.push(pid);
            }
        }
        self.resolve_pending();
    }

    /// Notes a sample of `pid` and its Python frames (innermost first).
    pub fn saw(&mut self, pid: u32, frames: &[PyFrame]) {
        if pid != 0 && self.seen.insert(pid) {
            self.new_pids.push(pid);
        }
        for f in frames {
            let key = (pid, f.code, f.instr & !ENTRY_BIT);
            if let std::collections::hash_map::Entry::Vacant(slot) = self.names.entry(key) {
                slot.insert(None);
                self.unnamed.push(key);
            }
        }
    }

    /// Detects and registers the processes seen since the last call, and names the frames
    /// seen since: both need the process alive, so this runs at every drain.
    pub fn resolve_pending(&mut self) {
        for pid in std::mem::take(&mut self.new_pids) {
            match detect::detect(pid, self.tsd_base, &mut self.elf_cache) {
                Ok(None) => {}
                Ok(Some(interp)) => match self.map.insert(pid, interp.proc_, 0) {
                    Ok(()) => {
                        log::debug!(
                            "pid {pid}: Python {}.{}",
                            interp.version.0,
                            interp.version.1
                        );
                        self.registered += 1;
                        self.interps.insert(pid, interp);
                    }
                    Err(e) => self.refuse(pid, "sampler map full", crate::util::chain(&e)),
                },
                Err(e) => self.refuse(pid, e.kind(), crate::util::chain(&e)),
            }
        }
        for key in std::mem::take(&mut self.unnamed) {
            let name = self.name(key);
            self.names.insert(key, name);
        }
    }

    fn refuse(&mut self, pid: u32, kind: &'static str, message: String) {
        log::debug!("pid {pid}: no Python frames: {message}");
        let slot = self.refused.entry(kind).or_insert((0, String::new()));
        slot.0 += 1;
        slot.1 = message;
    }

    fn name(&mut self, (pid, code, instr): (u32, u64, u64)) -> Option<PyName> {
        let layout = self.interps.get(&pid)?.code;
        let c = self
            .codes
            .entry((pid, code))
            .or_insert_with(|| read_code(Mem { pid }, &layout, code))
            .as_ref()?;
        let start = code + layout.code_adaptive;
        let line = instr
            .checked_sub(start)
            .and_then(|off| linetable::line_at(&c.linetable, c.first_line, off / 2));
        Some(PyName {
            qualname: c.qualname.clone(),
            file: c.file.clone(),
            line,
        })
    }

    /// Forgets a process that exited (its pid may come back as another process).
    pub fn forget(&mut self, pid: u32) {
        self.seen.remove(&pid);
        self.interps.remove(&pid);
        self.codes.retain(|k, _| k.0 != pid);
        let _ = self.map.remove(&pid);
    }
}

/// Reads a code object, checking its type first: a frame pointing at anything else (a
/// stale pointer, a 3.13 frame whose executable is not code) is left unnamed.
fn read_code(mem: Mem, l: &CodeLayout, code: u64) -> Option<Code> {
    if mem.u64(code + 8).ok()? != l.code_type {
        return None;
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
