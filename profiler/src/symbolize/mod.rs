//! Third stage: turn raw addresses into named frames (kernel from kallsyms, user through
//! blazesym, each unique address once) and build the profile model from the collection.
mod debuginfo;
mod demangle;
mod kernel;
mod user;

use std::collections::HashMap;

pub(crate) use debuginfo::{file_build_id, find_debug_file};
pub(crate) use kernel::KernelSym;
pub use kernel::KernelSymbols;
pub(crate) use user::UserSymbolizer;

use crate::{
    collect::{Collection, UserLoc},
    profile::{Binary, Cgroup, Frame, FrameKind, Interner, Meta, Profile, Sample, UNKNOWN_FRAME},
    python::merge::is_eval_loop,
};

/// The module of frames named by a perf map (JIT code has no file).
pub(crate) const JIT_MODULE: &str = "[jit]";

/// User frame names by (file id in the collection's process table, file offset). The agent
/// keeps one across windows, so each window symbolizes only addresses it has never seen; it
/// must be cleared whenever the process table's file ids are reset.
pub(crate) type NameCache = HashMap<(u32, u64), Vec<String>>;

/// Builds the profile: symbolizes every frame of `collection` and orders samples by time.
/// The collection stays the caller's (the agent keeps its process table from one window to
/// the next); names come from `names`, which gains the ones that had to be looked up.
pub(crate) fn build_profile_cached(
    collection: &Collection,
    meta: Meta,
    kernel: &KernelSymbols,
    user: &UserSymbolizer,
    names: &mut NameCache,
) -> Profile {
    let start = meta.start_mono_ns;
    let mut out = Interner::new(meta);
    symbolize_user(collection, user, names);
    let user_names = &*names;

    let kernel_module = out.string("vmlinux");
    // pprof mappings name the kernel as perf does; modules have no build id at hand.
    let kernel_binary = out.binary(Binary {
        path: "[kernel.kallsyms]".into(),
        build_id: debuginfo::kernel_build_id(),
    });
    let kstacks: Vec<Vec<u32>> = collection
        .kstacks
        .items()
        .iter()
        .map(|addrs| {
            addrs
                .iter()
                .rev()
                .map(|&addr| {
                    let (name, module, binary) = match kernel.lookup(addr) {
                        Some(KernelSym { name, module }) if module != "vmlinux" => {
                            let binary = out.binary(Binary {
                                path: format!("[{module}]"),
                                build_id: String::new(),
                            });
                            (out.string(name), out.string(module), binary)
                        }
                        Some(KernelSym { name, .. }) => {
                            (out.string(name), kernel_module, kernel_binary)
                        }
                        None if kernel.hidden() => {
                            (out.string("[kernel]"), kernel_module, kernel_binary)
                        }
                        None => (out.string(UNKNOWN_FRAME), kernel_module, kernel_binary),
                    };
                    out.frame(Frame {
                        name,
                        module,
                        kind: FrameKind::Kernel,
                        addr,
                        binary,
                    })
                })
                .collect()
        })
        .collect();

    let user_binaries: Vec<u32> = collection
        .processes
        .files
        .iter()
        .map(|f| {
            out.binary(Binary {
                path: f.path.display().to_string(),
                build_id: f
                    .build_id
                    .as_deref()
                    .map(debuginfo::hex)
                    .unwrap_or_default(),
            })
        })
        .collect();
    // Each frame with whether it is the eval loop (where Python frames go).
    let ustacks: Vec<Vec<(u32, bool)>> = collection
        .ustacks
        .items()
        .iter()
        .map(|(space, addrs)| {
            let mut frames = Vec::with_capacity(addrs.len());
            for &addr in addrs.iter().rev() {
                if let Some(name) = crate::collect::truncation_name(addr) {
                    let name = out.string(&name);
                    let frame = out.frame(Frame {
                        name,
                        module: 0,
                        kind: FrameKind::User,
                        addr: 0,
                        binary: 0,
                    });
                    frames.push((frame, false));
                    continue;
                }
                let loc = collection.processes.locs.get(&(*space, addr)).copied();
                // Outermost first: the function, then what `--inline` found inlined in it.
                let names: Vec<(u32, u32, bool)> = match loc {
                    Some(UserLoc::File { file, offset }) => {
                        let path = &collection.processes.files[file as usize].path;
                        let base = path.file_name().map_or_else(
                            || path.display().to_string(),
                            |b| b.to_string_lossy().into_owned(),
                        );
                        let module = out.string(&base);
                        match user_names.get(&(file, offset)) {
                            Some(names) if !names.is_empty() => names
                                .iter()
                                .map(|name| (out.string(name), module, is_eval_loop(name)))
                                .collect(),
                            _ => vec![(out.string(&format!("{base}+{offset:#x}")), module, false)],
                        }
                    }
                    Some(UserLoc::Named(id)) => vec![(
                        out.string(&collection.processes.names[id]),
                        out.string(JIT_MODULE),
                        false,
                    )],
                    _ => vec![(out.string(UNKNOWN_FRAME), 0, false)],
                };
                let (addr, binary) = match loc {
                    Some(UserLoc::File { file, offset }) => (offset, user_binaries[file as usize]),
                    _ => (0, 0),
                };
                for (name, module, eval) in names {
                    let frame = out.frame(Frame {
                        name,
                        module,
                        kind: FrameKind::User,
                        addr,
                        binary,
                    });
                    frames.push((frame, eval));
                }
            }
            frames
        })
        .collect();

    let comms: Vec<u32> = collection.comms.iter().map(|c| out.string(c)).collect();
    let pystacks = python_stacks(collection, &mut out);
    let mut joined: HashMap<(u32, u32, u32), u32> = HashMap::new();
    let mut samples = collection.samples.clone();
    samples.sort_by_key(|s| s.time_ns);
    for s in &samples {
        let key = (s.ustack, s.pystack, s.kstack);
        let stack = *joined.entry(key).or_insert_with(|| {
            let native = &ustacks[s.ustack as usize];
            let python = pystacks
                .get(s.pystack as usize)
                .map_or(&[][..], Vec::as_slice);
            let mut frames = if python.is_empty() {
                native.iter().map(|f| f.0).collect()
            } else {
                let ids: Vec<u32> = native.iter().map(|f| f.0).collect();
                let eval: Vec<bool> = native.iter().map(|f| f.1).collect();
                crate::python::merge::merge(&ids, &eval, python)
            };
            frames.extend_from_slice(&kstacks[s.kstack as usize]);
            out.stack(frames)
        });
        out.sample(Sample {
            offset_ns: s.time_ns.saturating_sub(start),
            cpu: s.cpu,
            pid: s.pid,
            tid: s.tid,
            cgroup_id: s.cgroup_id,
            comm: comms[s.comm as usize],
            stack,
        });
    }
    for p in collection.processes.processes.values() {
        out.process(p.clone());
    }
    for l in collection.lifetimes(start) {
        out.lifetime(l);
    }
    let mut cgroups: Vec<Cgroup> = collection
        .cgroup_paths
        .iter()
        .map(|(id, path)| Cgroup {
            id: *id,
            path: path.clone(),
        })
        .collect();
    cgroups.sort_by_key(|c| c.id);
    for c in cgroups {
        out.cgroup(c);
    }
    out.finish()
}

/// The Python frames of each of the collection's Python stacks, innermost first, each with
/// whether it is the outermost of its eval-loop call (`python::merge`). A frame that could
/// not be read is `[unknown python]` rather than dropped, so stacks keep their shape.
fn python_stacks(collection: &Collection, out: &mut Interner) -> Vec<Vec<(u32, bool)>> {
    use profiler_common::python::ENTRY_BIT;
    // A live collection's tracker names its frames; a window cut from one carries them.
    let names = match &collection.python {
        Some(t) => t.names(),
        None if !collection.py_names.is_empty() => &collection.py_names,
        None => return Vec::new(),
    };
    collection
        .pystacks
        .items()
        .iter()
        .map(|(space, frames)| {
            frames
                .iter()
                .map(|f| {
                    let named = names.get(&(*space, f.code, f.instr & !ENTRY_BIT));
                    let (name, module) = match named {
                        Some(Some(n)) => (n.display(), n.file.clone()),
                        _ => ("[unknown python]".to_owned(), String::new()),
                    };
                    let frame = Frame {
                        name: out.string(&name),
                        module: out.string(&module),
                        kind: FrameKind::User,
                        addr: 0,
                        binary: 0,
                    };
                    (out.frame(frame), f.instr & ENTRY_BIT != 0)
                })
                .collect()
        })
        .collect()
}

/// Names for every (file, offset) the collection holds and `names` lacks, one blazesym batch
/// per file. Each holds the function then, with `--inline`, the functions inlined there
/// (empty: no symbol).
fn symbolize_user(c: &Collection, user: &UserSymbolizer, names: &mut NameCache) {
    let mut per_file: HashMap<u32, Vec<u64>> = HashMap::new();
    for loc in c.processes.locs.values() {
        if let UserLoc::File { file, offset } = *loc
            && !names.contains_key(&(file, offset))
        {
            per_file.entry(file).or_default().push(offset);
        }
    }
    for (file, mut offsets) in per_file {
        offsets.sort_unstable();
        offsets.dedup();
        let f = &c.processes.files[file as usize];
        let (path, _opened) = match f.readable_path() {
            Ok(p) => p,
            Err(e) => {
                log::debug!("{}: not symbolized: {e}", f.path.display());
                names.extend(offsets.iter().map(|&o| ((file, o), Vec::new())));
                continue;
            }
        };
        let mut found = user.symbolize_file_inlined(&path, &offsets);
        debug_file_names(f, &path, &offsets, &mut found);
        for (offset, name) in offsets.iter().zip(found) {
            names.insert((file, *offset), name);
        }
    }
}

/// Fills in the offsets `found` has no name for from the file's separate debug file, found by
/// build id or `.gnu_debuglink` (stripped binaries).
fn debug_file_names(
    f: &crate::collect::UserFile,
    path: &std::path::Path,
    offsets: &[u64],
    found: &mut [Vec<String>],
) {
    let missing: Vec<usize> = (0..offsets.len())
        .filter(|&i| found[i].is_empty())
        .collect();
    if missing.is_empty() {
        return;
    }
    let Some(debug) = debuginfo::find_debug_file(path, &f.path, f.build_id.as_deref()) else {
        return;
    };
    let wanted: Vec<u64> = missing.iter().map(|&i| offsets[i]).collect();
    let named = debuginfo::symbolize_from_debug_file(path, &debug, &wanted);
    for (i, name) in missing.into_iter().zip(named) {
        found[i].extend(name);
    }
}
