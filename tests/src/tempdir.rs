//! Scratch directories for profiler outputs, std only. Removed on drop, except when the test
//! is panicking: then the directory is kept and its path printed, to look at what was written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory under std::env::temp_dir(), unique per process and per call.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/profiler-tests-<pid>-<n>-<label>`; `label` names the test, for humans.
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("profiler-tests-{}-{n}-{label}", std::process::id());
        let path = std::env::temp_dir().join(name);
        // A leftover from an earlier process with the same pid would mix outputs.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating temp dir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<dir>/<name>` as a String, ready to pass as a profiler argument.
    pub fn file(&self, name: &str) -> String {
        self.path
            .join(name)
            .to_str()
            .expect("UTF-8 temp path")
            .to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for inspection", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_dirs_removed_on_drop() {
        let a = TempDir::new("unit");
        let b = TempDir::new("unit");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.file("x.folded"), "p;f 1\n").unwrap();
        let kept = a.path().to_owned();
        drop(a);
        assert!(
            !kept.exists(),
            "{} should be removed on drop",
            kept.display()
        );
        assert!(b.path().is_dir());
    }
}
