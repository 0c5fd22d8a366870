//! cgroup facts for attribution: a process's cgroup paths (v2 and the v1 memory and cpu
//! hierarchies) from /proc/PID/cgroup, and the path of each cgroup v2 id samples carry, found
//! by walking the cgroup2 mount (the id is the directory's inode number).
use std::{collections::HashMap, os::unix::fs::MetadataExt as _, path::Path};

/// A process's cgroup paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessCgroups {
    pub v2: String,
    pub memory: String,
    pub cpu: String,
}

/// Parses /proc/PID/cgroup text: `ID:CONTROLLERS:PATH` lines; v2 is `0::PATH`.
pub fn parse_proc_cgroup(text: &str) -> ProcessCgroups {
    let mut out = ProcessCgroups::default();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.v2 = path.to_owned();
        }
        for c in controllers.split(',') {
            match c {
                "memory" => out.memory = path.to_owned(),
                "cpu" => out.cpu = path.to_owned(),
                _ => {}
            }
        }
    }
    out
}

pub fn read_process_cgroups(pid: u32) -> ProcessCgroups {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| parse_proc_cgroup(&t))
        .unwrap_or_default()
}

/// Where cgroup2 is mounted (`/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
/// hybrid ones), from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(str::to_owned))?
    })
}

/// Paths of the cgroup v2 ids in `wanted`, found by walking the cgroup2 tree. Ids of cgroups
/// already removed stay unknown.
pub fn cgroup2_paths(wanted: &[u64]) -> HashMap<u64, String> {
    let mut found = HashMap::new();
    let Some(mount) = cgroup2_mount() else {
        return found;
    };
    let mut todo: Vec<std::path::PathBuf> = vec![mount.clone().into()];
    while let Some(dir) = todo.pop() {
        if found.len() == wanted.len() {
            break;
        }
        let Ok(meta) = std::fs::metadata(&dir) else {
            continue;
        };
        if wanted.contains(&meta.ino()) {
            let rel = dir.strip_prefix(&mount).unwrap_or(Path::new(""));
            found.insert(meta.ino(), format!("/{}", rel.display()));
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        todo.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_v1_host() {
        let text = "9:name=systemd:/\n4:memory:/process_api/15a9\n2:cpuacct:/\n1:cpu,cpuacct:/kubepods/pod1\n0::/\n";
        assert_eq!(
            parse_proc_cgroup(text),
            ProcessCgroups {
                v2: "/".into(),
                memory: "/process_api/15a9".into(),
                cpu: "/kubepods/pod1".into()
            }
        );
    }

    #[test]
    fn unified_host() {
        let c = parse_proc_cgroup("0::/system.slice/kubelet.service\n");
        assert_eq!(c.v2, "/system.slice/kubelet.service");
        assert_eq!(c.memory, "");
    }

    #[test]
    fn finds_the_root_cgroup_by_inode() {
        let Some(mount) = cgroup2_mount() else { return };
        let ino = std::fs::metadata(&mount).unwrap().ino();
        assert_eq!(
            cgroup2_paths(&[ino]).get(&ino).map(String::as_str),
            Some("/")
        );
    }
}
