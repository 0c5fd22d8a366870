//! Peer test: `go tool pprof` (Debian golang-go) reads the pprof files we write. `-top` must
//! list the chain fixture's functions, `-traces` must show them in call order, and `-tags` the
//! labels. go missing is a skip on a laptop and a failure under CI=true.

use std::path::{Path, PathBuf};

use profiler_tests::{
    TempDir, exclusive, expect_success, go_tool_pprof, head, pprof_traces, record, report,
    require_bpf, spawn_fixture, tool,
};

/// The `go` command, or None (after saying why) when it is missing outside CI.
fn go() -> Option<PathBuf> {
    tool("go", "golang-go")
}

/// `go tool pprof <args>` with its state in the scratch directory.
fn pprof(go: &Path, dir: &TempDir, args: &[&str]) -> String {
    go_tool_pprof(go, dir.path(), args)
}

#[test]
fn go_tool_pprof_reads_record_and_report_output() {
    if !require_bpf() {
        return;
    }
    let Some(go) = go() else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("pprof");
    let _fixture = spawn_fixture(Path::new(env!("FIXTURE_FX_CHAIN")), 120);
    let (pb, capture) = (dir.file("x.pb.gz"), dir.file("x.capture"));
    let args = [
        "--comm", "fx-chain", "-F", "499", "-d", "3s", "-o", &pb, "-o", &capture,
    ];
    expect_success(&record(&args), &format!("profiler record {args:?}"));

    let top = pprof(&go, &dir, &["-top", &pb]);
    for function in ["c", "b", "a", "main"] {
        assert!(
            top.lines()
                .any(|l| l.split_whitespace().last() == Some(function)),
            "go tool pprof -top does not list {function}:\n{}",
            head(&top, 40)
        );
    }

    // Leaf first in pprof: c called by b called by a called by main.
    let text = pprof(&go, &dir, &["-traces", &pb]);
    let all = pprof_traces(&text);
    let chained = all
        .iter()
        .filter(|t| t.windows(4).any(|w| w == ["c", "b", "a", "main"]))
        .count();
    assert!(
        chained * 2 >= all.len() && chained > 0,
        "only {chained} of {} traces have c <- b <- a <- main:\n{}",
        all.len(),
        head(&text, 60)
    );

    let tags = pprof(&go, &dir, &["-tags", &pb]);
    for want in ["comm", "fx-chain", "pid", "cgroup"] {
        assert!(
            tags.contains(want),
            "go tool pprof -tags lacks {want}:\n{}",
            head(&tags, 40)
        );
    }

    // `report` writes the same format from a capture.
    let again = dir.file("again.pb.gz");
    expect_success(
        &report(&[&capture, "-o", &again]),
        "profiler report x.capture -o again.pb.gz",
    );
    let top = pprof(&go, &dir, &["-top", &again]);
    assert!(
        top.lines()
            .any(|l| l.split_whitespace().last() == Some("c")),
        "go tool pprof -top of the report output does not list c:\n{}",
        head(&top, 40)
    );
}
