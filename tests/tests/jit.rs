//! JIT code: a fixture runs machine code from an anonymous mapping that only its
//! /tmp/perf-PID.map names; the recording must show that name, not `[unknown]`, also when the
//! map is written only after the code has been sampled for a while.

use std::path::Path;

use profiler_tests::{
    TempDir, exclusive, expect_success, head, read_folded, record, require_bpf, samples,
    spawn_fixture_args,
};

#[test]
fn perf_map_names_jit_code() {
    if let Some(out) = record_jit(None) {
        check_named(&out);
    }
}

/// The map appears 1.5 s into a 3 s recording (perf-map-agent style): the addresses first
/// seen before it must still get their names, so nearly all samples do, not about half.
#[test]
fn perf_map_written_late_still_names_earlier_samples() {
    if let Some(out) = record_jit(Some("1.5")) {
        check_named(&out);
    }
}

/// Records fx-jit for 3 s (its map written at once, or `map_after` seconds in); None when
/// the test cannot run here.
fn record_jit(map_after: Option<&str>) -> Option<(TempDir, String)> {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: fx-jit carries x86-64 machine code");
        return None;
    }
    if !require_bpf() {
        return None;
    }
    let _serial = exclusive();
    let dir = TempDir::new("jit");
    let mut args = vec!["20"];
    args.extend(map_after);
    let fixture = spawn_fixture_args(Path::new(env!("FIXTURE_FX_JIT")), &args);
    let map = format!("/tmp/perf-{}.map", fixture.pid());
    if map_after.is_none() {
        // The fixture writes its map right after exec; give it a moment before sampling.
        for _ in 0..200 {
            if Path::new(&map).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    } else {
        assert!(!Path::new(&map).exists(), "the map must come later");
    }
    let out = dir.file("jit.folded");
    let result = record(&["--comm", "fx-jit", "-d", "3s", "-o", &out]);
    let map_written = Path::new(&map).exists();
    drop(fixture); // SIGKILL: the fixture cannot remove its map, so we do
    let _ = std::fs::remove_file(&map);
    expect_success(&result, "record");
    assert!(map_written, "fx-jit never wrote {map}");
    Some((dir, out))
}

/// At least 80% of fx-jit's samples end in jit_hot_loop and lead back to main.
fn check_named((_dir, out): &(TempDir, String)) {
    let (text, stacks) = read_folded(Path::new(out));
    let total = samples(&stacks, |f| f[0] == "fx-jit");
    let jit = samples(&stacks, |f| {
        f[0] == "fx-jit" && f.last().is_some_and(|l| l == "jit_hot_loop")
    });
    // Frame pointers lead from the JIT frame back into the fixture's main.
    let rooted = samples(&stacks, |f| {
        f[0] == "fx-jit" && f.iter().any(|x| x == "main") && f.iter().any(|x| x == "jit_hot_loop")
    });
    eprintln!("fx-jit: {jit} of {total} samples end in jit_hot_loop, {rooted} below main");
    assert!(total >= 50, "only {total} samples; {}", head(&text, 20));
    assert!(
        jit * 100 >= total * 80,
        "only {jit} of {total} samples end in jit_hot_loop; {}",
        head(&text, 20)
    );
    assert!(
        rooted * 100 >= total * 80,
        "only {rooted} of {total} samples lead from main to jit_hot_loop; {}",
        head(&text, 20)
    );
}
