//! Folded stacks, as Brendan Gregg's stackcollapse tools and inferno write them:
//! `comm;outer;...;leaf COUNT`, one line per unique stack, sorted; kernel frames end in `_[k]`
//! (the perf + inferno convention, which flame graph palettes colour apart), after ` [module]`
//! for code in a kernel module.
use std::fmt::Write as _;

use crate::profile::{Frame, FrameKind, GroupBy, Profile, attribution::Grouper};
use crate::util::{Dense, FxDense, FxMap};

/// The folded lines of `profile`, sorted, without trailing newlines, rooted at the comm.
pub fn folded_lines(profile: &Profile) -> Vec<String> {
    folded_lines_by(profile, GroupBy::Comm)
}

/// The folded lines with `group` as the root frame of every stack.
pub(crate) fn folded_lines_by(profile: &Profile, group: GroupBy) -> Vec<String> {
    let grouper = Grouper::new(profile, group);
    // Count per (root, stack) first: far fewer than samples. Roots are interned by label, and
    // a label depends only on the sample's comm, pid and cgroup: computed once per triple.
    let mut roots: Dense<Option<String>> = Dense::default();
    let mut root_of: FxMap<(u32, u32, u64), u32> = FxMap::default();
    let mut counts: FxMap<(u32, u32), u64> = FxMap::default();
    for s in &profile.samples {
        let root = *root_of
            .entry((s.comm, s.pid, s.cgroup_id))
            .or_insert_with(|| roots.intern(grouper.label(s)));
        *counts.entry((root, s.stack)).or_default() += 1;
    }
    let labels: Vec<String> = roots
        .into_items()
        .iter()
        .map(|l| l.as_deref().map(clean).unwrap_or_default())
        .collect();
    // Each frame's text once, and one id per distinct text: stacks share most of their
    // frames, and frames at other addresses often print the same.
    let mut texts: FxDense<String> = FxDense::default();
    let text_of: Vec<u32> = profile
        .frames
        .iter()
        .map(|f| texts.intern(frame_text(profile, f)))
        .collect();
    let texts = texts.into_items();
    // Different interned stacks can print the same: merge them by their texts' ids, so a
    // line's text (kilobytes for a deep stack) is built once and never hashed.
    let mut lines: FxMap<(u32, Vec<u32>), u64> = FxMap::default();
    for ((root, stack), n) in counts {
        let ids = profile.stacks[stack as usize]
            .frames
            .iter()
            .map(|&f| text_of[f as usize])
            .collect();
        *lines.entry((root, ids)).or_default() += n;
    }
    let mut out: Vec<String> = lines
        .into_iter()
        .map(|((root, ids), n)| {
            let root = &labels[root as usize];
            let len = root.len()
                + ids
                    .iter()
                    .map(|&i| texts[i as usize].len() + 1)
                    .sum::<usize>();
            let mut line = String::with_capacity(len + 21);
            line.push_str(root);
            for &i in &ids {
                if !line.is_empty() {
                    line.push(';');
                }
                line.push_str(&texts[i as usize]);
            }
            let _ = write!(line, " {n}");
            line
        })
        .collect();
    out.sort_unstable();
    out
}

/// A frame as folded text. Kernel frames end in `_[k]`; code in a kernel module is marked
/// `func [module]_[k]` (docs/symbolization.md): the module is where to look, and `_[k]` stays
/// last for the flame graph palettes.
fn frame_text(profile: &Profile, frame: &Frame) -> String {
    let mut text = clean(profile.str(frame.name));
    if frame.kind == FrameKind::Kernel {
        let module = profile.str(frame.module);
        if !matches!(module, "" | "vmlinux") {
            text.push_str(" [");
            text.push_str(&clean(module));
            text.push(']');
        }
        text.push_str("_[k]");
    }
    text
}

/// `;` separates frames and a newline ends the record: neither may appear inside a name.
fn clean(name: &str) -> String {
    let name = if name.is_empty() {
        crate::profile::UNKNOWN_FRAME
    } else {
        name
    };
    name.replace([';', '\n', '\r'], ":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Interner, Meta, Sample};

    #[test]
    #[expect(
        clippy::many_single_char_names,
        reason = "a, b, c are the fixture's frames"
    )]
    fn folds_counts_sorts_and_marks_kernel_frames() {
        let mut i = Interner::new(Meta::default());
        let vm = i.string("vmlinux");
        let main = Frame {
            name: i.string("main"),
            module: 0,
            kind: FrameKind::User,
            ..Frame::default()
        };
        let work = Frame {
            name: i.string("work;odd"),
            module: 0,
            kind: FrameKind::User,
            ..Frame::default()
        };
        let read = Frame {
            name: i.string("ksys_read"),
            module: vm,
            kind: FrameKind::Kernel,
            ..Frame::default()
        };
        let (main, work, read) = (i.frame(main), i.frame(work), i.frame(read));
        let a = i.stack(vec![main, work]);
        let b = i.stack(vec![main, read]);
        let (x, y) = (i.string("x"), i.string("app"));
        for (comm, stack) in [(y, a), (y, b), (y, a), (x, a)] {
            i.sample(Sample {
                offset_ns: 0,
                cpu: 0,
                pid: 1,
                tid: 1,
                cgroup_id: 0,
                comm,
                stack,
            });
        }
        let p = i.finish();
        assert_eq!(
            folded_lines(&p),
            [
                "app;main;ksys_read_[k] 1",
                "app;main;work:odd 2",
                "x;main;work:odd 1"
            ]
        );
    }

    #[test]
    fn kernel_module_frames_name_their_module() {
        let kallsyms = crate::symbolize::KernelSymbols::parse(
            "ffffffff81003000 T __x64_sys_read\nffffffffc0001000 t e1000_clean\t[e1000]\n",
        );
        let mut i = Interner::new(Meta::default());
        let frames: Vec<u32> = [0xffffffff81003010, 0xffffffffc0001010]
            .into_iter()
            .map(|addr| {
                let sym = kallsyms.lookup(addr).unwrap();
                let frame = Frame {
                    name: i.string(&sym.name),
                    module: i.string(sym.module),
                    kind: FrameKind::Kernel,
                    ..Frame::default()
                };
                i.frame(frame)
            })
            .collect();
        let stack = i.stack(frames);
        let comm = i.string("irq");
        i.sample(Sample {
            offset_ns: 0,
            cpu: 0,
            pid: 0,
            tid: 0,
            cgroup_id: 0,
            comm,
            stack,
        });
        assert_eq!(
            folded_lines(&i.finish()),
            ["irq;__x64_sys_read_[k];e1000_clean [e1000]_[k] 1"]
        );
    }
}
