//! Walking cgroup trees and comparing cgroup paths: the one walker (live cgroups are the
//! directories of a hierarchy) and the one "at or below" test, used by the dying counts,
//! the cgroup2 id lookup, `--cgroup` and the store's cgroup queries.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// `path` is `root` or a descendant of it, by whole components (`/lab` is not below
/// `/la`); every path is below the root (`/` or "").
pub(crate) fn is_at_or_below(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    root.is_empty()
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The child cgroups of `dir`: its subdirectories (symlinks not followed, so a loop cannot
/// make a walk endless).
pub(crate) fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Visits `root` and every cgroup below it, parents before children, until `visit` returns
/// false.
pub(crate) fn walk(root: &Path, mut visit: impl FnMut(&Path) -> bool) {
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        if !visit(&dir) {
            return;
        }
        todo.extend(subdirs(&dir));
    }
}

/// Directories in the tree at `root`, `root` included: the live cgroups of a hierarchy.
pub(crate) fn count_dirs(root: &Path) -> u64 {
    let mut n = 0;
    walk(root, |_| {
        n += 1;
        true
    });
    n
}

/// Paths (within the hierarchy) of the cgroup v2 ids in `wanted`, found by walking the
/// cgroup2 tree: a cgroup's id is its directory's inode number. Ids of cgroups already
/// removed stay unknown.
pub(crate) fn cgroup2_paths(wanted: &[u64]) -> HashMap<u64, String> {
    let mut found = HashMap::new();
    let Some(mount) = super::cgroup2_mount() else {
        return found;
    };
    walk(&mount, |dir| {
        if let Ok(meta) = std::fs::metadata(dir)
            && wanted.contains(&meta.ino())
        {
            let rel = dir.strip_prefix(&mount).unwrap_or(Path::new(""));
            found.insert(meta.ino(), format!("/{}", rel.display()));
        }
        found.len() < wanted.len()
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_or_below_by_whole_components() {
        assert!(is_at_or_below("/lab", "/lab"));
        assert!(is_at_or_below("/lab/a/b", "/lab/"));
        assert!(!is_at_or_below("/laboratory", "/lab"));
        assert!(!is_at_or_below("/", "/lab"));
        assert!(is_at_or_below("/anything", "/"));
        assert!(is_at_or_below("/anything", ""));
    }

    #[test]
    fn walks_a_fake_tree() {
        let dir = tempfile::Builder::new()
            .prefix("cgroups-walk-")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::create_dir_all(dir.path().join("c")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("c/loop")).unwrap();
        assert_eq!(count_dirs(dir.path()), 4);
        let mut seen = 0;
        walk(dir.path(), |_| {
            seen += 1;
            seen < 2
        });
        assert_eq!(seen, 2, "the walk stops when told");
    }

    #[test]
    fn finds_the_root_cgroup_by_inode() {
        let Some(mount) = super::super::cgroup2_mount() else {
            return;
        };
        let ino = std::fs::metadata(&mount).unwrap().ino();
        assert_eq!(
            cgroup2_paths(&[ino]).get(&ino).map(String::as_str),
            Some("/")
        );
    }
}
