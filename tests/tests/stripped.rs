//! Stripped binaries (issue 3): a recording of the stripped chain fixture has
//! `fx-stripped+0xOFFSET` frames and the binary's build id in the capture; with its separate
//! debug file installed by build id under /usr/lib/debug/.build-id, the same frames resolve to
//! main, a, b, c; so do they with the debug file next to a copy of the binary that names it
//! in a `.gnu_debuglink` section. The capture is read through the profiler library, as
//! `report` would.

use std::path::Path;
use std::process::Command;

use profiler::profile::{FrameKind, Profile, read_file};
use profiler_tests::{
    InstalledDebugFile, TempDir, build_id, exclusive, expect_success, record, require_bpf,
    spawn_fixture,
};

const BIN: &str = env!("FIXTURE_FX_STRIPPED");
const DEBUG: &str = env!("FIXTURE_FX_STRIPPED_DEBUG");

/// Records the stripped fixture (or a copy at `bin`) into a capture and reads it back.
fn record_capture(dir: &TempDir, bin: &Path, name: &str) -> Profile {
    let _fixture = spawn_fixture(bin, 120);
    let capture = dir.file(name);
    let comm = bin.file_name().unwrap().to_str().unwrap();
    let args = ["--comm", comm, "-F", "499", "-d", "3s", "-o", &capture];
    expect_success(&record(&args), &format!("profiler record {args:?}"));
    read_file(Path::new(&capture)).expect("reading the capture")
}

/// The user frames of `comm`'s samples that lie in its binary (named like it), as
/// (name, build id), one entry per sample and frame, root first.
fn fixture_frames(p: &Profile, comm: &str) -> Vec<Vec<(String, String)>> {
    let suffix = format!("/{comm}");
    p.samples
        .iter()
        .filter(|s| p.str(s.comm) == comm)
        .map(|s| {
            p.stack_frames(s.stack)
                .filter(|f| f.kind == FrameKind::User)
                .filter_map(|f| {
                    let b = p.binaries.get(f.binary as usize)?;
                    b.path
                        .ends_with(&suffix)
                        .then(|| (p.str(f.name).to_owned(), b.build_id.clone()))
                })
                .collect()
        })
        .collect()
}

#[test]
fn stripped_frames_keep_build_id_and_resolve_with_debug_file() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let id = build_id(BIN);
    assert_eq!(id, build_id(DEBUG), "the debug file belongs to the binary");
    // A debug file left behind by an interrupted run would name the frames in the first half.
    let _ = std::fs::remove_file(InstalledDebugFile::path(&id));
    let dir = TempDir::new("stripped");

    let bare = fixture_frames(
        &record_capture(&dir, Path::new(BIN), "bare.capture"),
        "fx-stripped",
    );
    let frames: Vec<&(String, String)> = bare.iter().flatten().collect();
    assert!(
        bare.len() >= 50 && !frames.is_empty(),
        "{} samples of fx-stripped, {} frames in its binary",
        bare.len(),
        frames.len()
    );
    let unnamed = frames
        .iter()
        .filter(|(name, _)| {
            name.strip_prefix("fx-stripped+0x")
                .is_some_and(|hex| u64::from_str_radix(hex, 16).is_ok())
        })
        .count();
    assert_eq!(
        unnamed,
        frames.len(),
        "frames of the stripped binary should be fx-stripped+0xOFFSET; got {:?}",
        frames.iter().take(10).collect::<Vec<_>>()
    );
    assert!(
        frames.iter().all(|(_, build_id)| *build_id == id),
        "frames should carry build id {id}; got {:?}",
        frames.iter().take(5).collect::<Vec<_>>()
    );

    let _installed = InstalledDebugFile::new(&id, DEBUG);
    let named = fixture_frames(
        &record_capture(&dir, Path::new(BIN), "debug.capture"),
        "fx-stripped",
    );
    expect_chain(&named, "with the debug file by build id");
}

/// A copy of the stripped binary with a `.gnu_debuglink` naming its debug file, which sits
/// next to it (nothing installed by build id): its frames resolve to main;a;b;c.
#[test]
fn debuglink_next_to_the_binary_names_frames() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let _ = std::fs::remove_file(InstalledDebugFile::path(&build_id(BIN)));
    let dir = TempDir::new("debuglink");
    let (linked, debug) = (dir.file("fx-linked"), dir.file("fx-linked.debug"));
    std::fs::copy(DEBUG, &debug).expect("copying the debug file");
    let status = Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={debug}"))
        .args([BIN, &linked])
        .status()
        .expect("running objcopy (binutils)");
    assert!(status.success(), "objcopy --add-gnu-debuglink failed");
    let named = fixture_frames(
        &record_capture(&dir, Path::new(&linked), "linked.capture"),
        "fx-linked",
    );
    expect_chain(&named, "with the debug file by .gnu_debuglink");
}

/// At least 80% of the samples (and at least 50) have main;a;b;c in a row.
fn expect_chain(named: &[Vec<(String, String)>], how: &str) {
    let chained = named
        .iter()
        .filter(|stack| {
            let names: Vec<&str> = stack.iter().map(|(n, _)| n.as_str()).collect();
            names.windows(4).any(|w| w == ["main", "a", "b", "c"])
        })
        .count();
    eprintln!(
        "{how}: {chained} of {} samples have main;a;b;c",
        named.len()
    );
    assert!(
        named.len() >= 50 && chained * 100 >= named.len() * 80,
        "{how}: only {chained} of {} samples resolve to main;a;b;c; first: {:?}",
        named.len(),
        named.first()
    );
}
