//! Compiled unwind tables kept on disk (`--unwind-cache`, issue 10): a second recording reads
//! fx-unwind's, libc's and ld.so's tables from the cache instead of compiling them, and
//! cache files damaged in place are refused (compiled again), so stacks stay whole. A table
//! cached before the binary's debug file was installed is compiled again once it is.

use std::path::Path;

use profiler::testkit::unwind::{Compiled, TableCache};
use profiler_tests::{
    InstalledDebugFile, TempDir, build_id, exclusive, expect_success, has_chain, head, read_folded,
    record, require_bpf, samples, spawn_fixture_args,
};

const FIXTURE: &str = env!("FIXTURE_FX_UNWIND");
/// A binary whose CFI is only in .debug_frame, stripped into its separate debug file.
const FX_DFRAME_STRIP: &str = env!("FIXTURE_FX_DFRAME_STRIP");
const FX_DFRAME_STRIP_DEBUG: &str = env!("FIXTURE_FX_DFRAME_STRIP_DEBUG");

/// Records fx-unwind `qsort` for 3 s with the cache in `cache`; returns the share (percent) of
/// its samples that reach `_start -> main -> a -> b`, their count, and how many tables
/// the profiler says came from the disk cache.
fn record_with_cache(dir: &TempDir, cache: &str, name: &str) -> (u64, u64, u64, String) {
    let fixture = spawn_fixture_args(Path::new(FIXTURE), &["20", "qsort"]);
    let out = dir.file(&format!("{name}.folded"));
    let pid = fixture.pid().to_string();
    let args = [
        "-p",
        &pid,
        "-F",
        "499",
        "-d",
        "3s",
        "--unwind",
        "dwarf",
        "--unwind-cache",
        cache,
        "-o",
        &out,
    ];
    let output = record(&args);
    expect_success(&output, &format!("profiler record {args:?}"));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let (text, stacks) = read_folded(Path::new(&out));
    let stacks: Vec<_> = stacks
        .into_iter()
        .filter(|(f, _)| f[0] == "fx-unwind")
        .collect();
    let total = samples(&stacks, |_| true);
    let whole = samples(&stacks, |f| {
        f.get(1).is_some_and(|root| root == "_start")
            && has_chain(f, &["main", "a", "b"], |a, b| a == b)
    });
    // "... compiled in X s, N from the disk cache) ..."
    let hits = stderr
        .split(" from the disk cache")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cache figure in the profiler's stderr:\n{stderr}"));
    let share = (whole * 100).checked_div(total).unwrap_or(0);
    eprintln!("{name}: {share}% of {total} whole, {hits} tables from the cache");
    (share, total, hits, format!("{}\n{stderr}", head(&text, 10)))
}

#[test]
fn tables_come_from_the_disk_cache_and_damaged_files_are_refused() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("unwind-cache");
    let cache = dir.file("tables");

    let (share, total, hits, log) = record_with_cache(&dir, &cache, "cold");
    assert!(
        total >= 100 && share >= 95,
        "cold: {share}% of {total}\n{log}"
    );
    assert_eq!(hits, 0, "an empty cache gave tables\n{log}");
    let files: Vec<_> = std::fs::read_dir(&cache)
        .expect("the cache directory exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "unw"))
        .collect();
    assert!(files.len() >= 3, "{} cache files: {files:?}", files.len());

    let (share, total, hits, log) = record_with_cache(&dir, &cache, "warm");
    assert!(
        total >= 100 && share >= 95,
        "warm: {share}% of {total}\n{log}"
    );
    assert!(hits >= 3, "only {hits} tables from the cache\n{log}");

    // Every file damaged in place (same length, rows' bytes changed): refused, compiled again.
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        for b in bytes.iter_mut().skip(56).step_by(7) {
            *b ^= 0x5a;
        }
        std::fs::write(f, bytes).unwrap();
    }
    let (share, total, hits, log) = record_with_cache(&dir, &cache, "damaged");
    assert_eq!(hits, 0, "damaged cache files were used\n{log}");
    assert!(
        total >= 100 && share >= 95,
        "damaged: {share}% of {total}\n{log}"
    );
}

/// Copies of the stripped binary and its debug file with the build id's last byte changed
/// in both: a build id of this test alone, so the debug file it installs under
/// /usr/lib/debug/.build-id is not one another test (unwind_edges) installs and removes.
fn own_build_id_copies(dir: &TempDir) -> (String, String, String) {
    let id = build_id(FX_DFRAME_STRIP);
    let bytes: Vec<u8> = (0..id.len() / 2)
        .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut new = bytes.clone();
    *new.last_mut().unwrap() ^= 0xa5;
    let copy = |from: &str, name: &str| {
        let mut data = std::fs::read(from).unwrap();
        let at = data
            .windows(bytes.len())
            .position(|w| w == bytes.as_slice())
            .unwrap_or_else(|| panic!("{from} does not hold its build id"));
        data[at..at + new.len()].copy_from_slice(&new);
        let path = dir.file(name);
        std::fs::write(&path, data).unwrap();
        path
    };
    let binary = copy(FX_DFRAME_STRIP, "fx-dframe-strip");
    let debug = copy(FX_DFRAME_STRIP_DEBUG, "fx-dframe-strip.debug");
    let new_id = build_id(&binary);
    assert_ne!(new_id, id);
    assert_eq!(build_id(&debug), new_id);
    (binary, debug, new_id)
}

/// The binary's table through the cache: (rows, read from the cache).
fn table_via_cache(binary: &str, cache: &TableCache) -> (usize, bool) {
    let data = std::fs::read(binary).unwrap();
    let compiled = Compiled::new(Path::new(binary), &data, Some(cache));
    let rows = compiled.table.expect("a table").rows.len();
    (rows, compiled.cache_hit)
}

#[test]
fn a_table_cached_before_its_debug_file_was_installed_is_compiled_again() {
    // Installing a debug file under /usr/lib/debug needs root.
    if !require_bpf() {
        return;
    }
    let dir = TempDir::new("unwind-cache-debug");
    let (binary, debug, id) = own_build_id_copies(&dir);
    assert!(
        !InstalledDebugFile::path(&id).exists(),
        "a debug file for {id} is installed already"
    );
    let cache = TableCache::open(Path::new(&dir.file("tables")), 16 << 20).unwrap();

    let (without, hit) = table_via_cache(&binary, &cache);
    assert!(!hit, "an empty cache gave a table");
    let (again, hit) = table_via_cache(&binary, &cache);
    assert!(
        hit && again == without,
        "nothing changed: the cached table is used"
    );

    let _installed = InstalledDebugFile::new(&id, &debug);
    let (with, hit) = table_via_cache(&binary, &cache);
    assert!(
        !hit,
        "the table cached without the debug file was used after it was installed"
    );
    assert!(
        with > without,
        "the debug file's .debug_frame added no rows ({without} -> {with})"
    );
    let (again, hit) = table_via_cache(&binary, &cache);
    assert!(
        hit && again == with,
        "the table made with the debug file is cached"
    );
}
