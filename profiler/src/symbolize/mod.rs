//! Third stage: turn raw addresses into named frames (kernel from kallsyms, user through
//! blazesym, each unique address once) and build the profile model from the collection.
mod demangle;
mod kernel;
mod user;

use std::collections::HashMap;

pub use kernel::{KernelSym, KernelSymbols};
pub use user::UserSymbolizer;

use crate::{
    collect::{Collection, UserLoc},
    profile::{Cgroup, Frame, FrameKind, Interner, Meta, Profile, Sample},
};

/// Builds the profile: symbolizes every frame of `collection` and orders samples by time.
pub fn build_profile(
    collection: Collection,
    meta: Meta,
    kernel: &KernelSymbols,
    user: &UserSymbolizer,
) -> Profile {
    let start = meta.start_mono_ns;
    let mut out = Interner::new(meta);
    let user_names = symbolize_user(&collection, user);

    let kernel_module = out.string("vmlinux");
    let kstacks: Vec<Vec<u32>> = collection
        .kstacks
        .stacks
        .iter()
        .map(|addrs| {
            addrs
                .iter()
                .rev()
                .map(|&addr| {
                    let (name, module) = match kernel.lookup(addr) {
                        Some(KernelSym { name, module }) => (out.string(name), out.string(module)),
                        None if kernel.hidden() => (out.string("[kernel]"), kernel_module),
                        None => (out.string("[unknown]"), kernel_module),
                    };
                    out.frame(Frame {
                        name,
                        module,
                        kind: FrameKind::Kernel,
                    })
                })
                .collect()
        })
        .collect();

    let ustacks: Vec<Vec<u32>> = collection
        .ustacks
        .stacks
        .iter()
        .map(|(pid, addrs)| {
            addrs
                .iter()
                .rev()
                .map(|&addr| {
                    let loc = collection.processes.locs.get(&(*pid, addr)).copied();
                    let (name, module) = match loc {
                        Some(UserLoc::File { file, offset }) => {
                            let path = &collection.processes.files[file as usize].path;
                            let base = path.file_name().map_or_else(
                                || path.display().to_string(),
                                |b| b.to_string_lossy().into_owned(),
                            );
                            let name = match user_names.get(&(file, offset)) {
                                Some(Some(name)) => out.string(name),
                                _ => out.string(&format!("{base}+{offset:#x}")),
                            };
                            (name, out.string(&base))
                        }
                        _ => (out.string("[unknown]"), 0),
                    };
                    out.frame(Frame {
                        name,
                        module,
                        kind: FrameKind::User,
                    })
                })
                .collect()
        })
        .collect();

    let comms: Vec<u32> = collection.comms.iter().map(|c| out.string(c)).collect();
    let mut joined: HashMap<(u32, u32), u32> = HashMap::new();
    let mut samples = collection.samples;
    samples.sort_by_key(|s| s.time_ns);
    for s in &samples {
        let stack = *joined.entry((s.ustack, s.kstack)).or_insert_with(|| {
            let mut frames = ustacks[s.ustack as usize].clone();
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
    for p in collection.processes.processes.into_values() {
        out.process(p);
    }
    let mut cgroups: Vec<Cgroup> = collection
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

/// Names for every (file, offset) the collection holds, one blazesym batch per file.
fn symbolize_user(c: &Collection, user: &UserSymbolizer) -> HashMap<(u32, u64), Option<String>> {
    let mut per_file: HashMap<u32, Vec<u64>> = HashMap::new();
    for loc in c.processes.locs.values() {
        if let UserLoc::File { file, offset } = *loc {
            per_file.entry(file).or_default().push(offset);
        }
    }
    let mut names = HashMap::new();
    for (file, mut offsets) in per_file {
        offsets.sort_unstable();
        offsets.dedup();
        let path = c.processes.files[file as usize].readable_path();
        for (offset, name) in offsets.iter().zip(user.symbolize_file(&path, &offsets)) {
            names.insert((file, *offset), name);
        }
    }
    names
}
