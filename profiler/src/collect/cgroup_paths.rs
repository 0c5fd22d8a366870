//! The cgroup paths of the ids samples carry, found at each resolve and handed on with each
//! cut.
use std::{collections::HashMap, time::Instant};

/// How often cgroup ids not found are looked up again (`CgroupPaths::resolve`).
const CGROUP_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// Paths kept at most; then the cache starts afresh (cgroups come and go).
const MAX_PATHS: usize = 10_000;

/// Paths of the cgroup v2 ids samples carry ("" if the cgroup was gone).
#[derive(Default)]
pub(super) struct CgroupPaths {
    paths: HashMap<u64, String>,
    /// When ids not found were last looked up again (`CGROUP_RETRY`).
    retried: Option<Instant>,
}

impl CgroupPaths {
    /// Finds the path of every id of `ids` not known yet. An id not found (its cgroup removed
    /// since the sample) is looked up again at most every `CGROUP_RETRY`: each lookup walks
    /// the whole cgroup tree, tens of thousands of directories on a host with dying cgroups,
    /// and the agent did it at every window for such an id.
    pub(super) fn resolve(&mut self, ids: impl Iterator<Item = u64>) {
        let mut ids: Vec<u64> = ids.collect();
        ids.sort_unstable();
        ids.dedup();
        let retry = self.retried.is_none_or(|t| t.elapsed() >= CGROUP_RETRY);
        ids.retain(|id| match self.paths.get(id) {
            None => true,
            Some(path) => path.is_empty() && retry,
        });
        if ids.is_empty() {
            return;
        }
        if retry {
            self.retried = Some(Instant::now());
        }
        let found = crate::cgroups::cgroup2_paths(&ids);
        for id in ids {
            self.paths
                .insert(id, found.get(&id).cloned().unwrap_or_default());
        }
    }

    /// The paths of `ids` that were looked up.
    pub(super) fn of(&self, ids: impl Iterator<Item = u64>) -> HashMap<u64, String> {
        ids.filter_map(|id| Some((id, self.paths.get(&id)?.clone())))
            .collect()
    }

    /// Keeps the cache small: called at each cut, once its paths went with the window.
    pub(super) fn bound(&mut self) {
        if self.paths.len() > MAX_PATHS {
            self.paths.clear();
        }
    }
}
