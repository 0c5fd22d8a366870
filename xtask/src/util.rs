//! Running commands and locating the workspace, shared by every xtask command.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// A command as a user would type it, for progress lines and error messages.
pub(crate) fn display(cmd: &Command) -> String {
    let quote = |s: &OsStr| {
        let s = s.to_string_lossy();
        if s.is_empty() || s.contains([' ', '\'', '"', '{', '$']) {
            format!("'{s}'")
        } else {
            s.into_owned()
        }
    };
    let mut words = vec![quote(cmd.get_program())];
    words.extend(cmd.get_args().map(quote));
    words.join(" ")
}

/// Runs `cmd` with the terminal's stdin/stdout/stderr; a non-zero exit is an error.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let name = display(cmd);
    let status = cmd.status().with_context(|| spawn_error(&name))?;
    if !status.success() {
        bail!("`{name}` failed ({status}); see its output above");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; a non-zero exit is an error carrying its stderr.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let name = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| spawn_error(&name))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!("`{name}` failed ({}): {}", out.status, stderr.trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn spawn_error(name: &str) -> String {
    let program = name.split(' ').next().unwrap_or(name);
    format!("cannot start `{name}`: is `{program}` installed and on PATH?")
}

/// The value of the first `key: value` line in `text`: the shape of /proc status and fdinfo
/// files, `rustc -vV` and `profiler report --stats`.
pub(crate) fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// Where `name` would be found on PATH, like `command -v`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The workspace root: xtask lives one level below it.
pub(crate) fn workspace_root() -> PathBuf {
    // Cargo sets CARGO_MANIFEST_DIR when it runs us; the compile-time value covers a direct run.
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest
        .parent()
        .map_or_else(|| manifest.clone(), Path::to_path_buf)
}

/// Cargo's target directory, absolute: CARGO_TARGET_DIR (relative to where we were started, as
/// cargo reads it) or `<workspace>/target`.
pub(crate) fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => env::current_dir().unwrap_or_default().join(dir),
        None => workspace_root().join("target"),
    }
}

/// The cargo that runs us, started in the workspace root so `cargo xtask` works from any folder.
pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    // The child runs elsewhere, so it must get the target directory we resolved, not a relative one.
    if env::var_os("CARGO_TARGET_DIR").is_some() {
        cmd.env("CARGO_TARGET_DIR", target_dir());
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_reads_colon_lines() {
        let text = "prog_type:\t1\nrun_time_ns:\t12345\nLLVM version: 22.1.8\n";
        assert_eq!(field(text, "run_time_ns"), Some("12345"));
        assert_eq!(field(text, "LLVM version"), Some("22.1.8"));
        assert_eq!(field(text, "run_cnt"), None);
    }
}
