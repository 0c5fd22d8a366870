//! JIT code: a fixture runs machine code from an anonymous mapping that only its
//! /tmp/perf-PID.map names; the recording must show that name, not `[unknown]`, also when the
//! map is written only after the code has been sampled for a while.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use profiler_tests::{
    Running, TempDir, exclusive, head, read_folded, require_bpf, samples, spawn_fixture_args,
};

#[test]
fn perf_map_names_jit_code() {
    if let Some(out) = record_jit(false) {
        check_named(&out);
    }
}

/// The map appears only after the code has been sampled for a second (perf-map-agent style,
/// on request: SIGUSR1 once the profiler says it samples), about half-way through: the
/// addresses first seen before it must still get their names, so nearly all samples do, not
/// about half.
#[test]
fn perf_map_written_late_still_names_earlier_samples() {
    if let Some(out) = record_jit(true) {
        check_named(&out);
    }
}

/// Records fx-jit for about 2 s (its map written at once, or with `late` one second into
/// sampling); None when the test cannot run here.
fn record_jit(late: bool) -> Option<(TempDir, String)> {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: fx-jit carries x86-64 machine code");
        return None;
    }
    if !require_bpf() {
        return None;
    }
    let _serial = exclusive();
    let dir = TempDir::new("jit");
    let mut args = vec!["60"];
    if late {
        args.push("late");
    }
    let fixture = spawn_fixture_args(Path::new(env!("FIXTURE_FX_JIT")), &args);
    let map = format!("/tmp/perf-{}.map", fixture.pid());
    // The fixture writes its map right after exec, or on SIGUSR1.
    let wait_map = || {
        let start = Instant::now();
        while !Path::new(&map).exists() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Path::new(&map).exists()
    };
    if !late {
        assert!(wait_map(), "fx-jit never wrote {map}");
    }
    let out = dir.file("jit.folded");
    let mut profiler = Running::start(&[
        "record", "--comm", "fx-jit", "-F", "999", "-d", "60s", "-o", &out,
    ]);
    profiler.wait_for("sampling");
    if late {
        assert!(!Path::new(&map).exists(), "the map must come later");
        // A second of samples whose addresses have no name yet (~half of the recording).
        std::thread::sleep(Duration::from_secs(1));
        let sent = Command::new("kill")
            .args(["-s", "USR1", &fixture.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill -s USR1 fx-jit failed");
        assert!(wait_map(), "fx-jit never wrote {map} after SIGUSR1");
    }
    // The rest of ~2 s of sampling, with the map in place.
    std::thread::sleep(Duration::from_secs(if late { 1 } else { 2 }));
    profiler.signal("INT");
    let (status, stderr) = profiler.finish();
    drop(fixture); // SIGKILL: the fixture cannot remove its map, so we do
    let _ = std::fs::remove_file(&map);
    assert!(status.success(), "record failed with {status}:\n{stderr}");
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
    // ~2 s at 999 Hz of a fixture that spins: ~2,000 when it has a CPU to itself, ~650 seen
    // with load 8 on 2 CPUs; a tenth leaves room for a machine busier still.
    assert!(total >= 200, "only {total} samples; {}", head(&text, 20));
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
