//! `--inline`: a function inlined at -O (only DWARF knows it) appears as its own frame, marked
//! ` (inlined)`, under the function it was inlined into; without the flag it does not.

use std::path::Path;

use profiler_tests::{
    CpuUsage, Fixture, TempDir, exclusive, expect_success, head, read_folded, record, require_bpf,
    samples, spawn_fixture,
};

const INLINED: &str = "inner_spin (inlined)";

/// The folded text, its stacks, and the fewest fx-inline samples its CPU time allows (the
/// 499 Hz for 3 s).
fn record_fixture(
    dir: &TempDir,
    name: &str,
    extra: &[&str],
) -> (String, Vec<(Vec<String>, u64)>, f64) {
    let fixture: Fixture = spawn_fixture(Path::new(env!("FIXTURE_FX_INLINE")), 120);
    let usage = CpuUsage::start(fixture.pid());
    let out = dir.file(name);
    // -F 499: ~1,500 samples with a CPU to itself, a few hundred on a busy machine.
    let mut args = vec!["--comm", "fx-inline", "-F", "499", "-d", "3s", "-o", &out];
    args.extend_from_slice(extra);
    let result = record(&args);
    let (min, _) = usage.sample_band(499.0, 3.0);
    drop(fixture);
    expect_success(&result, "record");
    let (text, stacks) = read_folded(Path::new(&out));
    (text, stacks, min)
}

#[test]
fn inline_expands_inlined_frames() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("inline");

    let (text, stacks, min) = record_fixture(&dir, "inline.folded", &["--inline"]);
    let total = samples(&stacks, |f| f[0] == "fx-inline");
    let expanded = samples(&stacks, |f| {
        f[0] == "fx-inline"
            && f.windows(2)
                .any(|w| w[0] == "outer_work" && w[1] == INLINED)
    });
    eprintln!("--inline: {expanded} of {total} samples have outer_work;{INLINED}");
    assert!(
        total >= 50 && total as f64 >= min,
        "only {total} samples, {min:.0} expected from its CPU time; {}",
        head(&text, 20)
    );
    assert!(
        expanded * 100 >= total * 80,
        "only {expanded} of {total} samples show {INLINED} under outer_work; {}",
        head(&text, 20)
    );

    let (text, stacks, min) = record_fixture(&dir, "plain.folded", &[]);
    let total = samples(&stacks, |f| f[0] == "fx-inline");
    let in_outer = samples(&stacks, |f| {
        f[0] == "fx-inline" && f.iter().any(|x| x == "outer_work")
    });
    let inlined = samples(&stacks, |f| f.iter().any(|x| x.ends_with("(inlined)")));
    assert!(
        total >= 50 && total as f64 >= min,
        "only {total} samples, {min:.0} expected from its CPU time; {}",
        head(&text, 20)
    );
    assert!(
        inlined == 0 && in_outer * 100 >= total * 80,
        "without --inline: {inlined} inlined, {in_outer} of {total} in outer_work; {}",
        head(&text, 20)
    );
}
