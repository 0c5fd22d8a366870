//! Compiled unwind tables kept on disk (`--unwind-cache`, issue 10): a second recording reads
//! fx-unwind's, libc's and ld.so's tables from the cache instead of compiling them, and
//! cache files damaged in place are refused (compiled again), so stacks stay whole.

use std::path::Path;

use profiler_tests::{
    TempDir, exclusive, expect_success, has_chain, head, read_folded, record, require_bpf, samples,
    spawn_fixture_args,
};

const FIXTURE: &str = env!("FIXTURE_FX_UNWIND");

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
