//! The cgroup paths of the ids samples carry, found at each cut (`resolve_cgroups`).
use super::Collection;

/// How often cgroup ids not found are looked up again (`Collection::resolve_cgroups`).
const CGROUP_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

impl Collection {
    /// Finds the path of every cgroup id seen so far. An id not found (its cgroup removed
    /// since the sample) is looked up again at most every `CGROUP_RETRY`: each lookup walks
    /// the whole cgroup tree, tens of thousands of directories on a host with dying cgroups,
    /// and the agent did it at every window for such an id.
    pub(super) fn resolve_cgroups(&mut self) {
        let mut ids: Vec<u64> = self.samples.iter().map(|s| s.cgroup_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let retry = self
            .cgroups_retried
            .is_none_or(|t| t.elapsed() >= CGROUP_RETRY);
        ids.retain(|id| match self.cgroup_paths.get(id) {
            None => true,
            Some(path) => path.is_empty() && retry,
        });
        if ids.is_empty() {
            return;
        }
        if retry {
            self.cgroups_retried = Some(std::time::Instant::now());
        }
        let found = crate::cgroups::cgroup2_paths(&ids);
        for id in ids {
            self.cgroup_paths
                .insert(id, found.get(&id).cloned().unwrap_or_default());
        }
    }
}
