//! Detection, when a process is first sampled: is it a CPython we can walk? Finds the
//! interpreter (the exe or a libpython in its mappings), its version, `_PyRuntime`, and the
//! offsets the sampler (`PyProc`) and the namer (`CodeLayout`) need: `_Py_DebugOffsets` on
//! 3.13, built-in tables for 3.8-3.12 with the code-object offsets read from the target's
//! own `PyCode_Type` member table, and the 3.8-3.10 frame offsets checked against its
//! `PyFrame_Type` one.
use std::{collections::HashMap, io, path::Path};

use object::{Object, ObjectSegment, ObjectSymbol};
use profiler_common::python::{CODE_SPAN, PyProc, entry};

use super::mem::Mem;
use crate::process::{interpreter_named, untrusted::Root};

/// Largest interpreter binary read (a libpython with DWARF is ~30 MB).
const MAX_ELF_BYTES: u64 = 512 << 20;

/// Why a process's Python frames cannot be shown: one line each, counted by kind.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("Python {0}.{1} is not supported (3.8 to 3.13 are)")]
    Version(u8, u8),
    #[error("free-threaded Python (3.13t) is not supported")]
    FreeThreaded,
    #[error("{0}: no _PyRuntime symbol (is the interpreter stripped of its dynamic symbols?)")]
    NoRuntime(String),
    #[error("cannot read the interpreter {0}")]
    File(String, #[source] io::Error),
    #[error("cannot read the process's maps or memory (is it gone, or are we not root?)")]
    Memory(#[source] io::Error),
    #[error("unexpected interpreter layout: {0}")]
    Layout(&'static str),
    #[error("unexpected interpreter layout: PyFrame_Type.{0} is at {1}, not {2}")]
    FrameMember(&'static str, u64, u32),
}

impl Refused {
    /// The reason's kind, for counting.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Refused::Version(..) => "unsupported version",
            Refused::FreeThreaded => "free-threaded",
            Refused::NoRuntime(_) => "no _PyRuntime symbol",
            Refused::File(..) => "unreadable interpreter",
            Refused::Memory(_) => "unreadable memory",
            Refused::Layout(_) | Refused::FrameMember(..) => "unexpected layout",
        }
    }
}

/// How a version maps a frame's instruction to its line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Lines {
    /// 3.8, 3.9: `co_lnotab`, `f_lasti` in bytes.
    Lnotab,
    /// 3.10: `co_linetable` (PEP 626 pairs), `f_lasti` in 2-byte code units.
    Linetable310,
    /// 3.11+: the location table, the frame's instruction pointer.
    #[default]
    Locations,
}

/// Where things are in a code object and in str objects, for naming frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CodeLayout {
    pub code_type: u64,
    pub filename: u64,
    pub name: u64,
    /// `co_qualname` (3.11+); `co_name` before, which had no qualified name.
    pub qualname: u64,
    /// The line table `lines` reads (`co_lnotab` or `co_linetable`).
    pub linetable: u64,
    pub lines: Lines,
    pub firstlineno: u64,
    /// Start of the instructions (`co_code_adaptive`, 3.11+).
    pub code_adaptive: u64,
    /// Header sizes of compact ASCII and compact non-ASCII str objects.
    pub ascii_size: u64,
    pub compact_size: u64,
}

/// A Python process the sampler can walk.
#[derive(Clone, Debug)]
pub(crate) struct Interp {
    pub version: (u8, u8),
    pub proc_: PyProc,
    pub code: CodeLayout,
}

/// Symbols of one interpreter binary, by file address.
#[derive(Clone, Debug, Default)]
pub(super) struct ElfFacts {
    runtime: Option<u64>,
    py_version: Option<u64>,
    code_type: Option<u64>,
    frame_type: Option<u64>,
    /// File address of the first loadable segment (the mapping at file offset 0 maps it).
    first_load: u64,
}

/// What the maps say about the interpreter: its path and load address.
struct Candidate {
    path: String,
    start: u64,
}

/// Finds the interpreter in `/proc/PID/maps`: a libpython wins over the exe (the exe then
/// only calls into it). Only files mapped executable count: a profiler (ours too) maps
/// libpython read-only to symbolize it. None: not Python.
/// Whether `pid`'s command line starts with a Python interpreter (`python3 x.py`,
/// `/usr/bin/python3.11 -m x`): what can be known of a process whose maps cannot be read.
fn named_python(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        interpreter_named(&String::from_utf8_lossy(argv0))
    })
}

fn candidate(pid: u32) -> io::Result<Option<Candidate>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut firsts: Vec<Candidate> = Vec::new();
    let mut executable: Vec<&str> = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode), Some(path)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        if !interpreter_named(path) {
            continue;
        }
        if perms.contains('x') {
            executable.push(path);
        }
        // The first mapping of the file (offset 0) gives its load address.
        if offset.trim_start_matches('0').is_empty() && firsts.iter().all(|c| c.path != path) {
            let start = u64::from_str_radix(range.split('-').next().unwrap_or(""), 16).unwrap_or(0);
            firsts.push(Candidate {
                path: path.to_owned(),
                start,
            });
        }
    }
    firsts.retain(|c| executable.contains(&c.path.as_str()));
    let lib = firsts.iter().position(|c| {
        c.path
            .rsplit('/')
            .next()
            .is_some_and(|b| b.starts_with("libpython"))
    });
    Ok(match lib {
        Some(i) => Some(firsts.swap_remove(i)),
        None => firsts.into_iter().next(),
    })
}

/// Detects the interpreter of `pid`. Ok(None): not a Python process. `elf_cache` holds each
/// binary's symbols by (device, inode), so a fleet of one interpreter reads it once.
pub(super) fn detect(
    pid: u32,
    tsd_base: u32,
    elf_cache: &mut HashMap<(u64, u64), ElfFacts>,
) -> Result<Option<Interp>, Refused> {
    let c = match candidate(pid) {
        Ok(Some(c)) => c,
        // Gone already (short-lived): nothing to walk, nothing to report.
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Ok(None);
        }
        // Maps we may not read (a sandbox's init, another user namespace's process): refused
        // only if its command line says it is a Python, else it is none of our business.
        Err(e) if !named_python(pid) => {
            log::debug!("pid {pid}: not a Python by its command line; its maps: {e}");
            return Ok(None);
        }
        Err(e) => return Err(Refused::Memory(e)),
    };
    let file = Root::of_process(pid)
        .and_then(|root| root.open(Path::new(&c.path)).map_err(io::Error::other))
        .map_err(|e| Refused::File(c.path.clone(), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Refused::File(c.path.clone(), e))?;
    let key = (
        std::os::unix::fs::MetadataExt::dev(&meta),
        std::os::unix::fs::MetadataExt::ino(&meta),
    );
    let facts = match elf_cache.get(&key) {
        Some(f) => f.clone(),
        None => {
            let started = std::time::Instant::now();
            let f = elf_facts(file, meta.len()).map_err(|e| Refused::File(c.path.clone(), e))?;
            log::debug!("{}: symbols read in {:?}", c.path, started.elapsed());
            elf_cache.insert(key, f.clone());
            f
        }
    };
    let base = c.path.rsplit('/').next().unwrap_or(&c.path);
    let bias = c.start.wrapping_sub(facts.first_load & !0xfff);
    let mem = Mem::new(pid);
    let version = match facts.py_version {
        Some(v) => {
            let hex = mem.u32(v.wrapping_add(bias)).map_err(Refused::Memory)?;
            ((hex >> 24) as u8, (hex >> 16) as u8)
        }
        // Py_Version came with 3.11: older ones are named by their file.
        None => version_from_name(base).ok_or(Refused::NoRuntime(c.path.clone()))?,
    };
    if !matches!(version, (3, 8..=13)) {
        return Err(Refused::Version(version.0, version.1));
    }
    let (Some(runtime), Some(code_type), Some(frame_type)) =
        (facts.runtime, facts.code_type, facts.frame_type)
    else {
        return Err(Refused::NoRuntime(c.path.clone()));
    };
    let runtime = runtime.wrapping_add(bias);
    let code_type = code_type.wrapping_add(bias);
    let mut interp = match version.1 {
        8..=10 => frame_objects(
            &mem,
            version,
            runtime,
            code_type,
            frame_type.wrapping_add(bias),
            tsd_base,
        )?,
        11 | 12 => builtin(&mem, version, runtime, code_type, tsd_base)?,
        _ => from_debug_offsets(&mem, runtime, code_type, tsd_base)?,
    };
    interp.proc_.code_check = u32::try_from(interp.code.firstlineno & !7)
        .map_err(|_| Refused::Layout("co_firstlineno out of range"))?;
    // The sampler reads the word and the name pointer in one CODE_SPAN read; a layout where
    // they lie further apart goes without the name's hash (the churn test would show it).
    let word = u64::from(interp.proc_.code_check);
    interp.proc_.name_check = u32::try_from(interp.code.qualname)
        .ok()
        .filter(|&at| {
            at.is_multiple_of(8)
                && u64::from(at) > word
                && u64::from(at) + 8 - word <= CODE_SPAN as u64
        })
        .unwrap_or(0);
    // A key that is not set up, or a wild one, means the offsets do not fit this build.
    let initialized = mem
        .u32(interp.proc_.tss_key_addr - 4)
        .map_err(Refused::Memory)?;
    if initialized != 1 {
        return Err(Refused::Layout("_PyRuntime.autoTSSkey is not initialized"));
    }
    Ok(Some(interp))
}

fn version_from_name(base: &str) -> Option<(u8, u8)> {
    let rest = base
        .strip_prefix("libpython")
        .or_else(|| base.strip_prefix("python"))?;
    let mut parts = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Reads only the parts of the file it needs (headers, dynamic symbols): registration is
/// what the process's first samples wait for, and a libpython with DWARF is ~30 MB.
fn elf_facts(file: std::fs::File, len: u64) -> io::Result<ElfFacts> {
    if len > MAX_ELF_BYTES {
        return Err(io::Error::other(format!(
            "larger than {MAX_ELF_BYTES} bytes"
        )));
    }
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(io::Error::other)?;
    let mut facts = ElfFacts {
        first_load: elf.segments().map(|s| s.address()).min().unwrap_or(0),
        ..ElfFacts::default()
    };
    let take = |facts: &mut ElfFacts,
                sym: object::Symbol<'_, '_, &object::ReadCache<std::fs::File>>| {
        let slot = match sym.name() {
            Ok("_PyRuntime") => &mut facts.runtime,
            Ok("Py_Version") => &mut facts.py_version,
            Ok("PyCode_Type") => &mut facts.code_type,
            Ok("PyFrame_Type") => &mut facts.frame_type,
            _ => return,
        };
        if slot.is_none() && sym.address() != 0 {
            *slot = Some(sym.address());
        }
    };
    // All are exported; the full symbol table only for a build that hides them.
    for sym in elf.dynamic_symbols() {
        take(&mut facts, sym);
    }
    if facts.runtime.is_none() || facts.code_type.is_none() || facts.frame_type.is_none() {
        for sym in elf.symbols() {
            take(&mut facts, sym);
        }
    }
    Ok(facts)
}

/// 3.11 and 3.12: frame and thread-state offsets as CPython lays them out (checked on the
/// pyenv and Debian builds with gdb), code-object offsets from `PyCode_Type.tp_members`.
fn builtin(
    mem: &Mem,
    version: (u8, u8),
    runtime: u64,
    code_type: u64,
    tsd_base: u32,
) -> Result<Interp, Refused> {
    let (tss_key, proc_, ascii_size, compact_size) = if version.1 == 11 {
        (
            592, // _PyRuntime.gilstate.autoTSSkey
            PyProc {
                cframe: 56,
                current_frame: 8,
                frame_code: 32,
                frame_previous: 48,
                frame_instr: 56,
                entry_byte: 68,
                entry_mode: entry::IS_ENTRY_BYTE,
                ..PyProc::default()
            },
            48,
            72,
        )
    } else {
        (
            1544, // _PyRuntime.autoTSSkey
            PyProc {
                cframe: 56,
                current_frame: 0,
                frame_code: 0,
                frame_previous: 8,
                frame_instr: 56,
                entry_byte: 70,
                entry_mode: entry::CSTACK_SHIM,
                ..PyProc::default()
            },
            40,
            56,
        )
    };
    let members = members(mem, code_type)?;
    let get = |name: &str| {
        members
            .get(name)
            .copied()
            .ok_or(Refused::Layout("PyCode_Type lacks a member we read"))
    };
    let code = CodeLayout {
        code_type,
        filename: get("co_filename")?,
        name: get("co_name")?,
        qualname: get("co_qualname")?,
        linetable: get("co_linetable")?,
        lines: Lines::Locations,
        firstlineno: get("co_firstlineno")?,
        code_adaptive: mem.u64(code_type + 32).map_err(Refused::Memory)?, // tp_basicsize
        ascii_size,
        compact_size,
    };
    Ok(Interp {
        version,
        proc_: PyProc {
            tss_key_addr: runtime + tss_key + 4,
            tsd_base,
            ..proc_
        },
        code,
    })
}

/// 3.8-3.10: the thread state's `frame` and the `PyFrameObject` chain (one eval-loop call
/// each). Offsets as CPython lays them out (checked with gdb on the pyenv builds), the frame
/// ones checked against the target's `PyFrame_Type.tp_members`, the code-object ones read
/// from `PyCode_Type.tp_members`.
fn frame_objects(
    mem: &Mem,
    version: (u8, u8),
    runtime: u64,
    code_type: u64,
    frame_type: u64,
    tsd_base: u32,
) -> Result<Interp, Refused> {
    // _PyRuntime.gilstate.autoTSSkey, and f_lasti (3.10 dropped f_stacktop before it).
    let (tss_key, lasti, lines, table) = match version.1 {
        8 => (1392, 104, Lines::Lnotab, "co_lnotab"),
        9 => (584, 104, Lines::Lnotab, "co_lnotab"),
        _ => (584, 96, Lines::Linetable310, "co_linetable"),
    };
    let proc_ = PyProc {
        tss_key_addr: runtime + tss_key + 4,
        tsd_base,
        cframe: u32::MAX,
        current_frame: 24, // PyThreadState.frame
        frame_code: 32,
        frame_previous: 24,
        frame_instr: lasti,
        entry_byte: 0,
        entry_mode: entry::FRAME_OBJECT,
        ..PyProc::default()
    };
    // 3.10 serves f_lasti through a getter (doubled), so only the members present are
    // compared; f_back and f_code are members in all three.
    let frame = members(mem, frame_type)?;
    for (name, want, required) in [
        ("f_back", proc_.frame_previous, true),
        ("f_code", proc_.frame_code, true),
        ("f_lasti", proc_.frame_instr, false),
    ] {
        match frame.get(name) {
            Some(&got) if got != u64::from(want) => {
                return Err(Refused::FrameMember(name, got, want));
            }
            None if required => return Err(Refused::Layout("PyFrame_Type lacks f_back or f_code")),
            _ => {}
        }
    }
    let code = members(mem, code_type)?;
    let get = |name: &str| {
        code.get(name)
            .copied()
            .ok_or(Refused::Layout("PyCode_Type lacks a member we read"))
    };
    let name = get("co_name")?;
    Ok(Interp {
        version,
        proc_,
        code: CodeLayout {
            code_type,
            filename: get("co_filename")?,
            name,
            qualname: name,
            linetable: get(table)?,
            lines,
            firstlineno: get("co_firstlineno")?,
            code_adaptive: 0,
            ascii_size: 48,
            compact_size: 72,
        },
    })
}

/// A type's `tp_members`: name -> offset (PyMemberDef is 40 bytes: name, type, offset).
fn members(mem: &Mem, code_type: u64) -> Result<HashMap<String, u64>, Refused> {
    let table = mem.u64(code_type + 240).map_err(Refused::Memory)?;
    let mut out = HashMap::new();
    for i in 0..64 {
        let m = table + 40 * i;
        let name = mem.u64(m).map_err(Refused::Memory)?;
        if name == 0 {
            return Ok(out);
        }
        let name = mem.c_string(name, 64).map_err(Refused::Memory)?;
        out.insert(name, mem.u64(m + 16).map_err(Refused::Memory)?);
    }
    Err(Refused::Layout("PyCode_Type.tp_members has no end"))
}

/// 3.13: `_Py_DebugOffsets` opens `_PyRuntime` (its 3.13.0 layout; later minors differ).
fn from_debug_offsets(
    mem: &Mem,
    runtime: u64,
    code_type: u64,
    tsd_base: u32,
) -> Result<Interp, Refused> {
    let mut d = vec![0u8; 584];
    mem.read(runtime, &mut d).map_err(Refused::Memory)?;
    if &d[..8] != b"xdebugpy" {
        return Err(Refused::Layout(
            "_PyRuntime does not start with _Py_DebugOffsets",
        ));
    }
    let at = |o: usize| u64::from_ne_bytes(d[o..o + 8].try_into().expect("8 bytes"));
    if at(16) != 0 {
        return Err(Refused::FreeThreaded);
    }
    let small = |o: usize| u32::try_from(at(o)).ok().filter(|&v| v < 64);
    let (Some(current_frame), Some(previous), Some(code), Some(instr)) = (
        u32::try_from(at(184)).ok(),
        small(232),
        small(240),
        small(248),
    ) else {
        return Err(Refused::Layout("_Py_DebugOffsets out of range"));
    };
    let owner = u32::try_from(at(264)).unwrap_or(0);
    if !(64..72).contains(&owner) || code % 8 != 0 || previous % 8 != 0 || instr % 8 != 0 {
        return Err(Refused::Layout(
            "_PyInterpreterFrame fields where the walk cannot read them",
        ));
    }
    let ascii_size = at(560);
    Ok(Interp {
        version: (3, 13),
        proc_: PyProc {
            tss_key_addr: runtime + 2160 + 4, // _PyRuntime.autoTSSkey (not in the debug offsets)
            tsd_base,
            cframe: u32::MAX,
            current_frame,
            frame_code: code,
            frame_previous: previous,
            frame_instr: instr,
            entry_byte: owner,
            entry_mode: entry::CSTACK_SHIM,
            ..PyProc::default()
        },
        code: CodeLayout {
            code_type,
            filename: at(280),
            name: at(288),
            qualname: at(296),
            linetable: at(304),
            lines: Lines::Locations,
            firstlineno: at(312),
            code_adaptive: at(344),
            ascii_size,
            compact_size: ascii_size + 16,
        },
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_from_file_names() {
        assert_eq!(
            super::version_from_name("libpython3.10.so.1.0"),
            Some((3, 10))
        );
        assert_eq!(super::version_from_name("python3.9"), Some((3, 9)));
        assert_eq!(super::version_from_name("python"), None);
    }
}
