//! Scratch directories for profiler outputs, made by `tempfile`. Removed on drop, except when
//! the test is panicking: then the directory is kept and its path printed, to look at what
//! was written.

use std::path::Path;

/// A fresh directory under std::env::temp_dir(), unique per call (`tempfile`).
pub struct TempDir {
    dir: Option<tempfile::TempDir>,
}

impl TempDir {
    /// Creates `<tmp>/profiler-tests-<label>-XXXXXX`; `label` names the test, for humans.
    pub fn new(label: &str) -> TempDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("profiler-tests-{label}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temp dir for {label}: {e}"));
        TempDir { dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("kept until drop").path()
    }

    /// `<dir>/<name>` as a String, ready to pass as a profiler argument.
    pub fn file(&self, name: &str) -> String {
        self.path()
            .join(name)
            .to_str()
            .expect("UTF-8 temp path")
            .to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        if std::thread::panicking() {
            eprintln!("kept {} for inspection", dir.keep().display());
        }
        // Otherwise `dir` removes the directory as it drops.
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
