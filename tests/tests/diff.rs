//! `profiler diff` on two synthetic captures: AFTER has an extra hot function, which must top
//! the --top list, and the differential SVG must be written.

use std::path::Path;
use std::time::Duration;

use profiler::profile::{Frame, FrameKind, Interner, Meta, Sample, write_file};
use profiler_tests::{TempDir, expect_success, run_profiler};

/// A capture of one process `app` with `counts` samples per leaf function under `main`.
fn capture(path: &Path, counts: &[(&str, u32)]) {
    let mut i = Interner::new(Meta {
        frequency_hz: 99,
        duration_ns: 1_000_000_000,
        cpus: vec![0],
        ..Meta::default()
    });
    let comm = i.string("app");
    let module = i.string("app");
    let frame = |i: &mut Interner, name: &str| {
        let name = i.string(name);
        i.frame(Frame {
            name,
            module,
            kind: FrameKind::User,
            ..Frame::default()
        })
    };
    let main = frame(&mut i, "main");
    for &(leaf, n) in counts {
        let leaf = frame(&mut i, leaf);
        let stack = i.stack(vec![main, leaf]);
        for k in 0..n {
            i.sample(Sample {
                offset_ns: u64::from(k) * 1_000_000,
                cpu: 0,
                pid: 7,
                tid: 7,
                cgroup_id: 0,
                comm,
                stack,
            });
        }
    }
    write_file(&i.finish(), path).unwrap();
}

#[test]
fn extra_hot_function_is_the_top_increase() {
    let dir = TempDir::new("diff");
    let (before, after, svg) = (
        dir.file("a.capture"),
        dir.file("b.capture"),
        dir.file("d.svg"),
    );
    capture(Path::new(&before), &[("work", 100), ("idle_loop", 100)]);
    capture(
        Path::new(&after),
        &[("work", 100), ("idle_loop", 100), ("hot_path", 200)],
    );
    let out = run_profiler(
        &["diff", &before, &after, "-o", &svg, "--top", "3"],
        Duration::from_secs(60),
    );
    expect_success(&out, "profiler diff");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    // The first row under the self-share header is the biggest mover.
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("functions, self"));
    let first = lines.nth(2).expect("a row under the self-share header");
    assert!(first.ends_with("hot_path"), "top change is {first:?}");
    assert!(
        first.contains("+50.00"),
        "hot_path went 0% -> 50%: {first:?}"
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("hot_path"));
}

#[test]
fn folded_inputs_and_nothing_to_do() {
    let dir = TempDir::new("diff-folded");
    let (a, b) = (dir.file("a.folded"), dir.file("b.folded"));
    std::fs::write(&a, "x;main;slow 90\nx;main;fast 10\n").unwrap();
    std::fs::write(&b, "x;main;slow 10\nx;main;fast 90\n").unwrap();
    let out = run_profiler(&["diff", &a, &b, "--top", "2"], Duration::from_secs(60));
    expect_success(&out, "profiler diff folded");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("-80.00  slow") && text.contains("+80.00  fast"),
        "{text}"
    );
    let out = run_profiler(&["diff", &a, &b], Duration::from_secs(60));
    assert!(!out.status.success(), "no -o and no --top must fail");
}
