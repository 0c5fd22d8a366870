//! JIT code: user addresses in anonymous memory named from their process's perf map
//! (`/tmp/perf-PID.map`), read off the drain thread because the map is the process's own
//! file (`perfmap` bounds and checks it).
use super::{
    PerfMap, SpaceId, UserLoc, perfmap,
    table::{ProcessTable, space_pid},
};

impl ProcessTable {
    /// Notes anonymous-memory addresses of a space for its process's perf map. Only cheap
    /// /proc reads here (this runs on the drain thread); the map itself is read by
    /// `JitWork::read`.
    pub(super) fn queue_jit(&mut self, space: SpaceId, addrs: Vec<u64>) {
        use std::collections::hash_map::Entry;
        match self.unnamed_anon.entry(space) {
            Entry::Occupied(mut e) => e.get_mut().1.extend(addrs),
            Entry::Vacant(e) => {
                // Gone already: nothing says whose map /tmp/perf-PID.map would be.
                if let Some(src) = perfmap::Source::of(space_pid(space)) {
                    e.insert((src, addrs));
                }
            }
        }
    }

    /// Takes the addresses waiting for a perf map, to be read (`JitWork::read`, blocking file
    /// work) where no samples are drained and no HTTP is served, then given back to
    /// `apply_jit_names`.
    fn jit_work(&mut self) -> JitWork {
        JitWork(std::mem::take(&mut self.unnamed_anon).into_iter().collect())
    }

    /// Names the addresses `names` found; keeps the rest waiting for a later read while
    /// their process lives (its map may grow).
    fn apply_jit_names(&mut self, names: JitNames) {
        for (space, src, mut addrs, map) in names.0 {
            for &addr in &addrs {
                if self.locs.get(&(space, addr)) != Some(&UserLoc::Unknown) {
                    continue;
                }
                let Some(name) = map.lookup(addr) else {
                    continue;
                };
                let id = self.names.intern_ref(name);
                self.locs.insert((space, addr), UserLoc::Named(id));
            }
            addrs.retain(|a| self.locs.get(&(space, *a)) == Some(&UserLoc::Unknown));
            let pid = space_pid(space);
            if !addrs.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists() {
                self.unnamed_anon
                    .entry(space)
                    .or_insert((src, Vec::new()))
                    .1
                    .extend(addrs);
            }
        }
    }

    /// Reads the perf maps of the processes with unnamed anonymous-memory addresses, on a
    /// blocking thread (the caller's may drain samples or serve HTTP), and names them.
    pub(crate) async fn name_jit_code(&mut self) -> std::io::Result<()> {
        let work = self.jit_work();
        // Most windows have no JIT code: no blocking thread then (one a window, started
        // anew as each outlives the pool's keep-alive, which a window's length matches).
        if work.0.is_empty() {
            return Ok(());
        }
        let names = tokio::task::spawn_blocking(move || work.read())
            .await
            .map_err(std::io::Error::other)?;
        self.apply_jit_names(names);
        Ok(())
    }
}

/// Perf maps to read: (space, source, addresses), sent to a blocking thread.
struct JitWork(Vec<(SpaceId, (perfmap::Source, Vec<u64>))>);

/// `JitWork` done: each process's map (empty when it has none or it was refused).
struct JitNames(Vec<(SpaceId, perfmap::Source, Vec<u64>, PerfMap)>);

impl JitWork {
    /// Reads each process's map once. Blocking file work, bounded by the map caps.
    fn read(self) -> JitNames {
        JitNames(
            self.0
                .into_iter()
                .map(|(space, (src, mut addrs))| {
                    addrs.sort_unstable();
                    addrs.dedup();
                    let map = perfmap::read(space_pid(space), &src).unwrap_or_default();
                    (space, src, addrs, map)
                })
                .collect(),
        )
    }
}
