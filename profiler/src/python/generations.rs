//! The Python names the collector holds, per process generation (`process::SpaceId`: a pid
//! and which of its execs): filled as samples arrive (`Tracker::saw`), named at the drains,
//! and forgotten once a generation ended (exec or exit) and the window holding its last
//! samples was cut. Pure bookkeeping, tested on its own; `Tracker` adds the reading.
use std::collections::{HashMap, HashSet};

use profiler_common::python::{ENTRY_BIT, PyFrame};

use super::{Code, PyName};
use crate::process::{SpaceId, space_pid};

/// A Python frame's name key: (process generation, code address, instruction with its
/// checksum). The generation keeps an exec or a reused pid from being named with the
/// image before.
pub(crate) type PyKey = (SpaceId, u64, u64);

/// What is held of one process generation.
#[derive(Clone, Copy, Debug, Default)]
struct SpaceState {
    /// Python frames were sampled (names are cached for it).
    python: bool,
    /// It exec'd or exited: forgotten at the next `forget_gone`.
    ended: bool,
    /// Sampled, but the kernel's records showed no interpreter among its mappings, so it
    /// was not detected: detected if one is mapped later (`mapped_interpreter`).
    deferred: bool,
}

#[derive(Default)]
pub(super) struct Generations {
    /// Every generation sampled or registered, until forgotten.
    spaces: HashMap<SpaceId, SpaceState>,
    /// By (generation, code address, checksum): a code object dropped and another allocated
    /// at its address has (almost always) another checksum, so another entry.
    pub codes: HashMap<PyKey, Option<Code>>,
    /// Names by `PyKey`; None: not read (yet, while in `unnamed`) or could not be read.
    pub names: HashMap<PyKey, Option<PyName>>,
    /// Keys seen and not named yet.
    pub unnamed: Vec<PyKey>,
}

impl Generations {
    /// Notes a generation without a sample yet (registered before sampling); false when it
    /// was known.
    pub(super) fn note(&mut self, space: SpaceId) -> bool {
        let new = !self.spaces.contains_key(&space);
        self.spaces.entry(space).or_default();
        new
    }

    /// Notes a sample of `space` and its Python frames; true when the generation is new
    /// (to be detected).
    pub(super) fn saw(&mut self, space: SpaceId, frames: &[PyFrame]) -> bool {
        let new = !self.spaces.contains_key(&space);
        let state = self.spaces.entry(space).or_default();
        state.python |= !frames.is_empty();
        for f in frames {
            let key = (space, f.code, f.instr & !ENTRY_BIT);
            if let std::collections::hash_map::Entry::Vacant(slot) = self.names.entry(key) {
                slot.insert(None);
                self.unnamed.push(key);
            }
        }
        new
    }

    /// `space` (new at `saw`) is not detected now: none of its mappings is an interpreter.
    pub(super) fn defer(&mut self, space: SpaceId) {
        if let Some(s) = self.spaces.get_mut(&space) {
            s.deferred = true;
        }
    }

    /// `space` mapped an interpreter: true when it was deferred (to be detected now), once.
    pub(super) fn mapped_interpreter(&mut self, space: SpaceId) -> bool {
        match self.spaces.get_mut(&space) {
            Some(s) if s.deferred && !s.ended => {
                s.deferred = false;
                true
            }
            _ => false,
        }
    }

    /// `space` exec'd or exited: nothing more can be read of it.
    pub(super) fn end(&mut self, space: SpaceId) {
        if let Some(s) = self.spaces.get_mut(&space) {
            s.ended = true;
        }
    }

    /// Whether `space` ended (or is not known: forgotten, so gone).
    pub(super) fn ended(&self, space: SpaceId) -> bool {
        self.spaces.get(&space).is_none_or(|s| s.ended)
    }

    /// Forgets every generation that ended and every one whose pid `gone` says is gone:
    /// names, code objects, keys waiting.
    pub(super) fn forget_gone(&mut self, mut gone: impl FnMut(u32) -> bool) {
        let mut forget: HashSet<SpaceId> = HashSet::new();
        self.spaces.retain(|&space, s| {
            let drop = s.ended || gone(space_pid(space));
            if drop {
                forget.insert(space);
            }
            !drop
        });
        if forget.is_empty() {
            return;
        }
        self.names.retain(|k, _| !forget.contains(&k.0));
        self.codes.retain(|k, _| !forget.contains(&k.0));
        self.unnamed.retain(|k| !forget.contains(&k.0));
    }

    /// Generations with Python frames held.
    pub(super) fn python_processes(&self) -> usize {
        self.spaces.values().filter(|s| s.python).count()
    }
}

/// What naming a frame of generation `space` may do with its pid's registration: `reg` is
/// (when its memory was pinned, the generation the kernel's records say ran then), known
/// only once those records were read (`opened_ns < records_read_ns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Use {
    /// The registration is of this generation: read with it.
    Read,
    /// This generation cannot be named any more.
    Never,
    /// Not yet known: ask again at the next drain.
    Later,
}

pub(super) fn usable(
    space: SpaceId,
    ended: bool,
    reg: Option<(u64, SpaceId)>,
    records_read_ns: u64,
) -> Use {
    match reg.filter(|(opened_ns, _)| *opened_ns < records_read_ns) {
        Some((_, of)) if of == space => Use::Read,
        // A later generation's (same pid: the generation is the high half): this one's
        // image is gone.
        Some((_, of)) if of > space => Use::Never,
        // None yet, or not known to be of this generation yet: one may come (a detection
        // under way) while the generation lives.
        _ if ended => Use::Never,
        _ => Use::Later,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::space_id;

    fn frame(code: u64, instr: u64) -> PyFrame {
        PyFrame { code, instr }
    }

    fn name(q: &str) -> PyName {
        PyName {
            qualname: q.into(),
            file: "x.py".into(),
            line: Some(1),
        }
    }

    #[test]
    fn an_exec_and_a_reused_pid_get_keys_of_their_own_and_are_forgotten() {
        let mut g = Generations::default();
        let (before, after) = (space_id(7, 0), space_id(7, 1));
        // The same code address and instruction before and after an exec.
        assert!(g.saw(before, &[frame(0x1000, 0x1010)]));
        assert!(!g.saw(before, &[frame(0x1000, 0x1010)]), "known already");
        g.names
            .insert((before, 0x1000, 0x1010), Some(name("first")));
        assert!(g.saw(after, &[frame(0x1000, 0x1010 | ENTRY_BIT)]));
        assert_eq!(
            g.names.get(&(after, 0x1000, 0x1010)),
            Some(&None),
            "the new image's frame is not named with the old image's name"
        );
        assert_eq!(
            g.unnamed,
            [(before, 0x1000, 0x1010), (after, 0x1000, 0x1010)]
        );
        assert_eq!(g.python_processes(), 2);
        // A non-Python process is tracked (for detection) but holds no names.
        assert!(g.saw(space_id(8, 0), &[]));
        assert_eq!(g.python_processes(), 2);

        // The exec ended generation 0; the pid lives on.
        g.end(before);
        assert!(g.ended(before) && !g.ended(after));
        g.forget_gone(|_| false);
        assert!(!g.names.keys().any(|k| k.0 == before), "{:?}", g.names);
        assert!(!g.unnamed.iter().any(|k| k.0 == before));
        assert_eq!(g.python_processes(), 1);
        assert!(g.names.contains_key(&(after, 0x1000, 0x1010)));

        // Pid 7 exits without a record (lost): gone from /proc, forgotten all the same; its
        // number reused later starts with nothing.
        g.forget_gone(|pid| pid == 7);
        assert_eq!(g.python_processes(), 0);
        assert!(g.names.is_empty() && g.unnamed.is_empty(), "{:?}", g.names);
        assert!(g.saw(before, &[frame(0x1000, 0x1010)]), "new again");
        assert_eq!(g.names.get(&(before, 0x1000, 0x1010)), Some(&None));
        // Forgetting leaves the live ones.
        g.forget_gone(|pid| pid == 9);
        assert_eq!(g.python_processes(), 1);
    }

    #[test]
    fn a_registration_names_only_its_own_generation() {
        let (g0, g1) = (space_id(7, 0), space_id(7, 1));
        // Pinned at 100, records read at 200 say generation 0 ran then.
        assert_eq!(usable(g0, false, Some((100, g0)), 200), Use::Read);
        // Generation 0's frames with generation 1's registration: never.
        assert_eq!(usable(g0, false, Some((100, g1)), 200), Use::Never);
        // Generation 1's frames with generation 0's (stale) registration: wait for its own,
        // unless it ended too.
        assert_eq!(usable(g1, false, Some((100, g0)), 200), Use::Later);
        assert_eq!(usable(g1, true, Some((100, g0)), 200), Use::Never);
        // Records not read past the pinning yet: an exec may be unread.
        assert_eq!(usable(g0, false, Some((250, g0)), 200), Use::Later);
        assert_eq!(usable(g0, true, Some((250, g0)), 200), Use::Never);
        assert_eq!(usable(g0, false, None, 200), Use::Later);
    }

    /// A deferred generation (no interpreter mapped at its first sample) is detected once
    /// it maps one, once; never after it ended, and a generation not deferred never again.
    #[test]
    fn a_deferred_generation_is_detected_once_when_it_maps_an_interpreter() {
        let mut g = Generations::default();
        let (a, b, c) = (space_id(9, 1), space_id(10, 1), space_id(11, 1));
        for s in [a, b, c] {
            assert!(g.saw(s, &[]));
        }
        g.defer(a);
        g.defer(b);
        assert!(
            !g.mapped_interpreter(c),
            "detected at its first sample already"
        );
        assert!(g.mapped_interpreter(a));
        assert!(!g.mapped_interpreter(a), "once");
        g.end(b);
        assert!(!g.mapped_interpreter(b), "ended: nothing to detect");
        assert!(!g.mapped_interpreter(space_id(12, 1)), "never sampled");
    }
}
