//! Separate debug files for the tests that need one found by build id (stripped.rs,
//! unwind_edges.rs): the build id as readelf prints it, and the file installed where
//! debuggers and the profiler look for it, removed again on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The GNU build id of `path` as `readelf -n` prints it (lowercase hex).
pub fn build_id(path: &str) -> String {
    let out = Command::new("readelf")
        .args(["-n", path])
        .output()
        .expect("running readelf (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("readelf -n {path} shows no build id:\n{text}"))
        .to_owned()
}

/// A debug file installed under /usr/lib/debug/.build-id; removed on drop (also when the
/// test fails), with the directory if it was made for it.
pub struct InstalledDebugFile {
    file: PathBuf,
    made_dir: bool,
}

impl InstalledDebugFile {
    /// Where the debug file of `build_id` is looked up.
    pub fn path(build_id: &str) -> PathBuf {
        Path::new("/usr/lib/debug/.build-id")
            .join(&build_id[..2])
            .join(format!("{}.debug", &build_id[2..]))
    }

    /// Copies `debug` there as the debug file of `build_id`.
    pub fn new(build_id: &str, debug: &str) -> Self {
        let file = Self::path(build_id);
        let dir = file.parent().unwrap();
        let made_dir = !dir.exists();
        std::fs::create_dir_all(dir).expect("creating the .build-id directory");
        std::fs::copy(debug, &file).expect("installing the debug file");
        InstalledDebugFile { file, made_dir }
    }
}

impl Drop for InstalledDebugFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        if self.made_dir {
            let _ = std::fs::remove_dir(self.file.parent().unwrap());
        }
    }
}
