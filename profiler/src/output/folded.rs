//! Folded stacks, as Brendan Gregg's stackcollapse tools and inferno write them:
//! `comm;outer;...;leaf COUNT`, one line per unique stack, sorted; kernel frames end in `_[k]`
//! (the perf + inferno convention, which flame graph palettes colour apart).
use std::{collections::HashMap, io};

use crate::profile::{FrameKind, GroupBy, Profile, attribution::Grouper};

/// The folded lines of `profile`, sorted, without trailing newlines, rooted at the comm.
pub fn folded_lines(profile: &Profile) -> Vec<String> {
    folded_lines_by(profile, GroupBy::Comm)
}

/// The folded lines with `group` as the root frame of every stack.
pub fn folded_lines_by(profile: &Profile, group: GroupBy) -> Vec<String> {
    let grouper = Grouper::new(profile, group);
    // Count per (root, stack) first: far fewer than samples. Roots are interned by label.
    let mut roots: HashMap<Option<String>, u32> = HashMap::new();
    let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
    for s in &profile.samples {
        let next = roots.len() as u32;
        let root = *roots.entry(grouper.label(s)).or_insert(next);
        *counts.entry((root, s.stack)).or_default() += 1;
    }
    let mut labels = vec![None; roots.len()];
    for (label, id) in roots {
        labels[id as usize] = label;
    }
    // Different interned stacks can print the same (same names, other addresses): merge.
    let mut lines: HashMap<String, u64> = HashMap::new();
    for ((root, stack), n) in counts {
        let mut line = labels[root as usize]
            .as_deref()
            .map(clean)
            .unwrap_or_default();
        for frame in profile.stack_frames(stack) {
            if !line.is_empty() {
                line.push(';');
            }
            line.push_str(&clean(profile.str(frame.name)));
            if frame.kind == FrameKind::Kernel {
                line.push_str("_[k]");
            }
        }
        *lines.entry(line).or_default() += n;
    }
    let mut out: Vec<String> = lines.into_iter().map(|(l, n)| format!("{l} {n}")).collect();
    out.sort_unstable();
    out
}

pub fn write_folded(profile: &Profile, group: GroupBy, w: &mut impl io::Write) -> io::Result<()> {
    for line in folded_lines_by(profile, group) {
        writeln!(w, "{line}")?;
    }
    Ok(())
}

/// `;` separates frames and a newline ends the record: neither may appear inside a name.
fn clean(name: &str) -> String {
    let name = if name.is_empty() { "[unknown]" } else { name };
    name.replace([';', '\n', '\r'], ":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, Interner, Meta, Sample};

    #[test]
    fn folds_counts_sorts_and_marks_kernel_frames() {
        let mut i = Interner::new(Meta::default());
        let vm = i.string("vmlinux");
        let main = Frame {
            name: i.string("main"),
            module: 0,
            kind: FrameKind::User,
        };
        let work = Frame {
            name: i.string("work;odd"),
            module: 0,
            kind: FrameKind::User,
        };
        let read = Frame {
            name: i.string("ksys_read"),
            module: vm,
            kind: FrameKind::Kernel,
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
        let mut bytes = Vec::new();
        write_folded(&p, GroupBy::Comm, &mut bytes).unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "app;main;ksys_read_[k] 1\napp;main;work:odd 2\nx;main;work:odd 1\n"
        );
    }
}
