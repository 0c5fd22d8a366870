//! JIT code: a fixture runs machine code from an anonymous mapping that only its
//! /tmp/perf-PID.map names; the recording must show that name, not `[unknown]`.

use std::path::Path;

use profiler_tests::{
    TempDir, exclusive, expect_success, head, read_folded, record, require_bpf, samples,
    spawn_fixture,
};

#[test]
fn perf_map_names_jit_code() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: fx-jit carries x86-64 machine code");
        return;
    }
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("jit");
    let fixture = spawn_fixture(Path::new(env!("FIXTURE_FX_JIT")), 20);
    let map = format!("/tmp/perf-{}.map", fixture.pid());
    // The fixture writes its map right after exec; give it a moment before sampling.
    for _ in 0..200 {
        if Path::new(&map).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = dir.file("jit.folded");
    let result = record(&["--comm", "fx-jit", "-d", "3s", "-o", &out]);
    drop(fixture); // SIGKILL: the fixture cannot remove its map, so we do
    let _ = std::fs::remove_file(&map);
    expect_success(&result, "record");

    let (text, stacks) = read_folded(Path::new(&out));
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
