//! Pure parsers of the kernel-wide text files the dying counts read (/proc/cgroups,
//! cgroup.stat and memory.stat, slabinfo, meminfo), tested on real-shaped text.

/// One line of /proc/cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerLine {
    pub name: String,
    /// Hierarchy id; 0 = not mounted on v1 (bound to cgroup2 or unused).
    pub hierarchy: u32,
    /// cgroups of this controller, dying ones included.
    pub num_cgroups: u64,
    pub enabled: bool,
}

/// Parses /proc/cgroups (`#subsys_name hierarchy num_cgroups enabled`).
pub fn parse_proc_cgroups(text: &str) -> Vec<ControllerLine> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(ControllerLine {
                name: f.next()?.to_owned(),
                hierarchy: f.next()?.parse().ok()?,
                num_cgroups: f.next()?.parse().ok()?,
                enabled: f.next()? == "1",
            })
        })
        .collect()
}

/// `key value` lines (cgroup.stat, memory.stat): the value of `key`.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Active objects of slab cache `name` in /proc/slabinfo.
pub fn slab_active_objects(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == name).then(|| f.next()?.parse().ok())?
    })
}

/// A /proc/meminfo field in kB (e.g. `Percpu`).
pub fn meminfo_kb(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::fixtures::PROC_CGROUPS;

    #[test]
    fn proc_cgroups_lines() {
        let l = parse_proc_cgroups(PROC_CGROUPS);
        assert_eq!(l.len(), 6);
        assert_eq!(
            l[3],
            ControllerLine {
                name: "memory".into(),
                hierarchy: 4,
                num_cgroups: 529,
                enabled: true
            }
        );
    }

    #[test]
    fn stat_files() {
        let stat = "nr_descendants 3\nnr_dying_descendants 412\n";
        assert_eq!(stat_value(stat, "nr_dying_descendants"), Some(412));
        assert_eq!(stat_value(stat, "nr_dying"), None);
        let mem = "cache 4096\nrss 0\ntotal_cache 2052096\ntotal_rss 12\n";
        assert_eq!(stat_value(mem, "cache"), Some(4096));
        assert_eq!(stat_value(mem, "total_cache"), Some(2_052_096));
    }

    #[test]
    fn slabinfo_and_meminfo() {
        let slab = "slabinfo - version: 2.1\n\
            # name <active_objs> <num_objs> <objsize>\n\
            mem_cgroup_per_node   600    600   1024 \n\
            mem_cgroup            570    574   2240   14    8 : tunables 0 0 0\n";
        assert_eq!(slab_active_objects(slab, "mem_cgroup"), Some(570));
        let mem = "MemTotal:        4000000 kB\nPercpu:             2688 kB\n";
        assert_eq!(meminfo_kb(mem, "Percpu"), Some(2688));
        assert_eq!(meminfo_kb(mem, "Per"), None);
    }
}
