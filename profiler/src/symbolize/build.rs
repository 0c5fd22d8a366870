//! The profile builder: consumes what the collect stage handed on (`Collected`), names its
//! kernel and user stacks through the two stages, joins each sample's native, Python and
//! kernel frames into one stack, and hands the profile model on to the outputs.
use std::collections::HashMap;

use super::{
    JIT_MODULE, KernelSym, KernelSymbols, NameCache, Unknown, UserSymbolizer, debuginfo,
    unknown_name, user::symbolize_user,
};
use crate::{
    collect::Collected,
    process::UserLoc,
    profile::{Binary, Cgroup, Frame, FrameKind, Interner, Meta, Profile, Sample},
    python::merge::is_eval_loop,
};

/// Builds the profile of `collected`: names every frame and orders samples by time. Names
/// come from `names`, which gains the ones that had to be looked up (the agent keeps it
/// across windows).
pub(crate) fn build_profile(
    collected: Collected,
    meta: Meta,
    kernel: &KernelSymbols,
    user: &UserSymbolizer,
    names: &mut NameCache,
) -> Profile {
    let start = meta.start_mono_ns;
    let mut out = Interner::new(meta);
    symbolize_user(&collected.facts, user, names);
    let kstacks = kernel_stacks(&collected, kernel, &mut out);
    let ustacks = user_stacks(&collected, names, &mut out);
    let pystacks = python_stacks(&collected, &mut out);

    let comms: Vec<u32> = collected.comms.iter().map(|c| out.string(c)).collect();
    let mut joined: HashMap<(u32, u32, u32), u32> = HashMap::new();
    let mut samples = collected.samples;
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
    let facts = collected.facts;
    for p in facts.processes.into_values() {
        out.process(p);
    }
    for l in facts.lifetimes {
        out.lifetime(l);
    }
    let mut cgroups: Vec<Cgroup> = collected
        .cgroup_paths
        .into_iter()
        .map(|(id, path)| Cgroup { id, path })
        .collect();
    cgroups.sort_by_key(|c| c.id);
    for c in cgroups {
        out.cgroup(c);
    }
    out.finish()
}

/// Each kernel stack as frame ids, outermost first.
fn kernel_stacks(c: &Collected, kernel: &KernelSymbols, out: &mut Interner) -> Vec<Vec<u32>> {
    let vmlinux = out.string("vmlinux");
    // pprof mappings name the kernel as perf does; modules have no build id at hand.
    let vmlinux_binary = out.binary(Binary {
        path: "[kernel.kallsyms]".into(),
        build_id: debuginfo::kernel_build_id(),
    });
    let mut frame = |addr: u64| {
        let (name, module, binary) = match kernel.resolve(addr) {
            Ok(KernelSym { name, module }) if module != "vmlinux" => {
                let binary = out.binary(Binary {
                    path: format!("[{module}]"),
                    build_id: String::new(),
                });
                (out.string(&name), out.string(module), binary)
            }
            Ok(KernelSym { name, .. }) => (out.string(&name), vmlinux, vmlinux_binary),
            Err(why) => (
                out.string(&unknown_name(why, None)),
                vmlinux,
                vmlinux_binary,
            ),
        };
        out.frame(Frame {
            name,
            module,
            kind: FrameKind::Kernel,
            addr,
            binary,
        })
    };
    c.kstacks
        .items()
        .iter()
        .map(|addrs| addrs.iter().rev().map(|&a| frame(a)).collect())
        .collect()
}

/// Each user stack as frame ids, outermost first, each with whether it is the eval loop
/// (where Python frames go).
fn user_stacks(c: &Collected, names: &NameCache, out: &mut Interner) -> Vec<Vec<(u32, bool)>> {
    let facts = &c.facts;
    let binaries: Vec<u32> = facts
        .files
        .iter()
        .map(|f| {
            out.binary(Binary {
                path: f.path.display().to_string(),
                build_id: f
                    .build_id
                    .as_deref()
                    .map(crate::util::hex)
                    .unwrap_or_default(),
            })
        })
        .collect();
    let mut frames_of = |space: u64, addr: u64, frames: &mut Vec<(u32, bool)>| {
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
            return;
        }
        let loc = facts.locs.get(&(space, addr)).copied();
        // Outermost first: the function, then what `--inline` found inlined in it.
        let (named, addr, binary): (Vec<(u32, u32, bool)>, u64, u32) = match loc {
            Some(UserLoc::File { file, offset }) => {
                let path = &facts.files[file as usize].path;
                let base = path.file_name().map_or_else(
                    || path.display().to_string(),
                    |b| b.to_string_lossy().into_owned(),
                );
                let module = out.string(&base);
                let named = match names.get(&(file, offset)) {
                    Some(Ok(names)) => names
                        .iter()
                        .map(|name| (out.string(name), module, is_eval_loop(name)))
                        .collect(),
                    Some(Err(why)) => {
                        let name = unknown_name(*why, Some((&base, offset)));
                        vec![(out.string(&name), module, false)]
                    }
                    None => {
                        let name = unknown_name(Unknown::NoSymbol, Some((&base, offset)));
                        vec![(out.string(&name), module, false)]
                    }
                };
                (named, offset, binaries[file as usize])
            }
            Some(UserLoc::Named(id)) => {
                let named = (
                    out.string(&facts.jit_names[id]),
                    out.string(JIT_MODULE),
                    false,
                );
                (vec![named], 0, 0)
            }
            _ => {
                let name = out.string(&unknown_name(Unknown::NotMapped, None));
                (vec![(name, 0, false)], 0, 0)
            }
        };
        for (name, module, eval) in named {
            let frame = out.frame(Frame {
                name,
                module,
                kind: FrameKind::User,
                addr,
                binary,
            });
            frames.push((frame, eval));
        }
    };
    c.ustacks
        .items()
        .iter()
        .map(|(space, addrs)| {
            let mut frames = Vec::with_capacity(addrs.len());
            for &addr in addrs.iter().rev() {
                frames_of(*space, addr, &mut frames);
            }
            frames
        })
        .collect()
}

/// The Python frames of each Python stack, innermost first, each with whether it is the
/// outermost of its eval-loop call (`python::merge`). A frame that could not be read or
/// named stays as an unknown frame rather than dropped, so stacks keep their shape.
fn python_stacks(c: &Collected, out: &mut Interner) -> Vec<Vec<(u32, bool)>> {
    use profiler_common::python::ENTRY_BIT;
    c.pystacks
        .items()
        .iter()
        .map(|(space, frames)| {
            frames
                .iter()
                .map(|f| {
                    let named = c.py_names.get(&(*space, f.code, f.instr & !ENTRY_BIT));
                    let (name, module) = match named {
                        Some(Some(n)) => (n.display(), n.file.clone()),
                        _ => (unknown_name(Unknown::Python, None), String::new()),
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
