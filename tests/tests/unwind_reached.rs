//! `--unwind-tables reached` (the agent's default, issue 12): only the binaries a process's
//! stacks go through get unwind tables, and its stacks are still whole. Debian's sqlite3 maps
//! eight files (itself, libsqlite3, libreadline, libtinfo, libz, libm, libc, ld.so) and a
//! recursive query runs in three of them. Recorded with `reached`, its stacks reach the entry
//! (each binary a walk leaves for is compiled then, and the stack copies taken meanwhile are
//! walked once it is), and libreadline, which no stack enters, gets no table; recorded with
//! `all` (the negative control), it gets one. What was compiled is read from the disk cache
//! each run starts empty: a table's file is named by its binary's build id.

use std::path::Path;

use profiler_tests::{
    TempDir, build_id, exclusive, expect_success, head, read_folded, record, require_bpf,
    spawn_fixture_args, tool,
};

const READLINE: &str = "/usr/lib/x86_64-linux-gnu/libreadline.so.8";

/// Records the sqlite3 loop for 4 s with `--unwind-tables <policy>` and a new table cache;
/// returns (share of sqlite3 samples whose stack reaches the entry, samples, whether
/// libreadline's table was compiled, the folded text).
fn record_sqlite(policy: &str) -> (u64, u64, bool, String) {
    let dir = TempDir::new(&format!("unwind-reached-{policy}"));
    let cache = dir.file("tables");
    let out = dir.file("out.folded");
    let _load = spawn_fixture_args(
        Path::new("/bin/sh"),
        &[
            "-c",
            "while :; do sqlite3 :memory: 'WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL \
             SELECT x + 1 FROM c LIMIT 3000000) SELECT sum(x) FROM c;' > /dev/null; done",
        ],
    );
    let args = [
        "-F",
        "499",
        "-d",
        "4s",
        "--comm",
        "sqlite3",
        "--unwind",
        "dwarf",
        "--unwind-tables",
        policy,
        "--unwind-cache",
        &cache,
        "-o",
        &out,
    ];
    let output = record(&args);
    expect_success(&output, &format!("profiler record {args:?}"));
    let (text, stacks) = read_folded(Path::new(&out));
    let (mut whole, mut total) = (0, 0);
    for (frames, n) in &stacks {
        total += n;
        if frames.iter().any(|f| {
            let name = f.split(' ').next().unwrap_or(f);
            name == "main" || name == "_start" || name.starts_with("__libc_start")
        }) {
            whole += n;
        }
    }
    let readline = Path::new(&cache)
        .join(format!("b{}.unw", build_id(READLINE)))
        .exists();
    (
        (whole * 100).checked_div(total).unwrap_or(0),
        total,
        readline,
        text,
    )
}

#[test]
fn only_the_binaries_stacks_reach_get_tables_and_stacks_stay_whole() {
    if !require_bpf() {
        return;
    }
    tool("sqlite3", "sqlite3").expect("sqlite3");
    assert!(Path::new(READLINE).exists(), "{READLINE} is missing");
    let _serial = exclusive();
    let (share, total, readline, text) = record_sqlite("reached");
    eprintln!("reached: {share}% of {total} samples whole, libreadline compiled: {readline}");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        share >= 90,
        "only {share}% of {total} sqlite3 samples reach the entry with --unwind-tables reached \
         (want 90% or more: a stack is whole once the binaries it crosses are compiled, and \
         the copies taken before are walked then); {}",
        head(&text, 20)
    );
    assert!(
        !readline,
        "libreadline's table was compiled with --unwind-tables reached, though no sqlite3 \
         stack runs in it"
    );
    // Negative control: every mapped binary's table, libreadline's too.
    let (share, total, readline, _) = record_sqlite("all");
    eprintln!("all: {share}% of {total} samples whole, libreadline compiled: {readline}");
    assert!(
        readline,
        "libreadline's table was not compiled with --unwind-tables all either: the cache \
         check above proves nothing"
    );
}
