//! The symbolizer a front end keeps: the kernel's symbols, the user-space symbolizer and the
//! names found so far. A recording symbolizes one span with it; the agent's symbolizer thread
//! one span a window, so each window parses only binaries with addresses never seen before.
use std::time::{Duration, Instant};

use super::{KernelSymbols, NameCache, UserSymbolizer, build_profile};
use crate::{
    collect::Collected,
    profile::{Meta, Profile},
};

/// User frame names kept at most; then the cache starts afresh.
const MAX_NAMES: usize = 1_000_000;

/// Names the frames of collected spans, keeping what it found for the next.
pub(crate) struct Symbolizer {
    kernel: KernelSymbols,
    inline: bool,
    user: UserSymbolizer,
    user_since: Instant,
    /// How long `user` keeps the binaries it parsed before a fresh one replaces it (None:
    /// as long as this lives).
    renew_after: Option<Duration>,
    names: NameCache,
    /// The process table's generation `names` were found in: their keys are its file ids.
    table_generation: u64,
}

impl Symbolizer {
    /// `inline`: expand inlined functions from DWARF into frames of their own (`--inline`).
    pub(crate) fn new(kernel: KernelSymbols, inline: bool) -> Self {
        Self {
            kernel,
            inline,
            user: UserSymbolizer::new(inline),
            user_since: Instant::now(),
            renew_after: None,
            names: NameCache::new(),
            table_generation: 0,
        }
    }

    /// Starts the user-space symbolizer afresh once it is `after` old, so binaries no longer
    /// run leave memory; names already found are kept, so a big binary with a few new
    /// addresses each window is parsed once per `after`, not every window.
    pub(crate) fn renewing_after(mut self, after: Duration) -> Self {
        self.renew_after = Some(after);
        self
    }

    /// Names every frame of `collected`, a span of a process table of `table_generation`
    /// (`session::Window`): its profile.
    pub(crate) fn profile(
        &mut self,
        collected: Collected,
        meta: Meta,
        table_generation: u64,
    ) -> Profile {
        if table_generation != self.table_generation || self.names.len() > MAX_NAMES {
            // File ids start afresh (or the cache is too big): names keyed by them go.
            self.names.clear();
            self.table_generation = table_generation;
        }
        if self
            .renew_after
            .is_some_and(|after| self.user_since.elapsed() >= after)
        {
            self.user = UserSymbolizer::new(self.inline);
            self.user_since = Instant::now();
        }
        build_profile(collected, meta, &self.kernel, &self.user, &mut self.names)
    }
}
