//! What the process lifetimes of a profile say: how many processes started and exited during
//! the recording, how they ended, and whether the ones that started were symbolized. `report
//! --stats` prints it; crash-loop detection builds on the same table.
use std::collections::{BTreeMap, HashMap};

use super::model::{FrameKind, Profile};

/// Counts over `Profile::lifetimes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LifetimeStats {
    /// Processes that forked or exec'd during the recording.
    pub started: u64,
    /// Processes that exited during the recording.
    pub exited: u64,
    /// Started processes with at least one sample that has user frames.
    pub started_sampled: u64,
    /// Of `started_sampled`, those whose every sample with user frames has a named user leaf
    /// (not `[unknown]`).
    pub started_symbolized: u64,
    /// Exits by how they ended: ("code 0", n), ("signal 9", n), ("unknown", n); most first.
    pub exits: Vec<(String, u64)>,
}

pub fn lifetime_stats(p: &Profile) -> LifetimeStats {
    // Per pid: (samples with user frames, of which with a named user leaf).
    let mut user: HashMap<u32, (u64, u64)> = HashMap::new();
    for s in &p.samples {
        let leaf = p
            .stack_frames(s.stack)
            .filter(|f| f.kind == FrameKind::User)
            .last();
        if let Some(f) = leaf {
            let e = user.entry(s.pid).or_default();
            e.0 += 1;
            e.1 += u64::from(p.str(f.name) != super::UNKNOWN_FRAME);
        }
    }
    let mut st = LifetimeStats::default();
    let mut exits: BTreeMap<String, u64> = BTreeMap::new();
    for l in &p.lifetimes {
        if l.started() {
            st.started += 1;
            if let Some(&(with_user, named)) = user.get(&l.pid) {
                st.started_sampled += 1;
                st.started_symbolized += u64::from(named == with_user);
            }
        }
        if l.exit_ns.is_some() {
            st.exited += 1;
            let how = match (l.exit_code(), l.exit_signal()) {
                (Some(c), _) => format!("code {c}"),
                (_, Some(s)) => format!("signal {s}"),
                _ => "unknown".to_owned(),
            };
            *exits.entry(how).or_default() += 1;
        }
    }
    st.exits = exits.into_iter().collect();
    st.exits.sort_by_key(|e| std::cmp::Reverse(e.1));
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, Interner, Lifetime, Meta, Sample};

    #[test]
    fn counts_starts_exits_and_symbolized() {
        let mut i = Interner::new(Meta::default());
        let (named, unknown) = (i.string("c"), i.string("[unknown]"));
        let good = i.frame(Frame {
            name: named,
            ..Frame::default()
        });
        let bad = i.frame(Frame {
            name: unknown,
            ..Frame::default()
        });
        let (good, bad) = (i.stack(vec![good]), i.stack(vec![bad]));
        for (pid, stack) in [(1, good), (2, good), (2, bad), (4, good)] {
            i.sample(Sample {
                offset_ns: 0,
                cpu: 0,
                pid,
                tid: pid,
                cgroup_id: 0,
                comm: 0,
                stack,
            });
        }
        let life = |pid, fork_ns, exit_ns, exit_status| Lifetime {
            pid,
            fork_ns,
            exit_ns,
            exit_status,
            ..Lifetime::default()
        };
        i.lifetime(life(1, Some(1), Some(5), Some(0)));
        i.lifetime(life(2, Some(1), Some(6), Some(9)));
        i.lifetime(life(3, Some(2), Some(7), Some(3 << 8)));
        i.lifetime(life(4, None, Some(8), None));
        let st = lifetime_stats(&i.finish());
        assert_eq!((st.started, st.exited), (3, 4));
        assert_eq!((st.started_sampled, st.started_symbolized), (2, 1));
        let mut exits = st.exits.clone();
        exits.sort();
        assert_eq!(
            exits,
            [
                ("code 0".to_owned(), 1),
                ("code 3".to_owned(), 1),
                ("signal 9".to_owned(), 1),
                ("unknown".to_owned(), 1)
            ]
        );
    }
}
