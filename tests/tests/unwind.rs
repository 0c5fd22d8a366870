//! Table unwinding (issue 10): the fx-unwind fixture is built without frame pointers, like
//! distribution packages, and spends its time in Debian's libc, which has none either. With
//! `--unwind dwarf` the kernel walks its stacks by the tables compiled from .eh_frame and
//! reaches `_start`; with `--unwind fp` the same assertion fails (the negative control).
//! Each test records the fixture by `--pid`, which loads its tables before sampling starts.

use std::path::Path;
use std::process::Command;

use profiler_tests::{
    Stack, TempDir, exclusive, expect_success, has_chain, head, read_folded, record, report,
    require_bpf, samples, spawn_fixture_args, tool,
};

const FIXTURE: &str = env!("FIXTURE_FX_UNWIND");
const COMM: &str = "fx-unwind";

/// Records fixture mode `mode` for `secs` s at 999 Hz with `--unwind <unwind>`; returns the
/// folded text, its stacks (only the fixture's) and the profiler's stderr. The capture is
/// left at `capture` when given. 999 Hz: cpu-clock counts only the fixture's running time,
/// and on a loaded machine (load 24 on 2 CPUs) 3 s at 499 Hz gave fewer than 100 samples.
fn record_mode(
    mode: &str,
    unwind: &str,
    secs: u32,
    capture: Option<&str>,
) -> (String, Vec<Stack>, String) {
    let dir = TempDir::new(&format!("unwind-{mode}-{unwind}"));
    let fixture = spawn_fixture_args(Path::new(FIXTURE), &["20", mode]);
    let out = dir.file("out.folded");
    let pid = fixture.pid().to_string();
    let duration = format!("{secs}s");
    let mut args = vec![
        "-p", &pid, "-F", "999", "-d", &duration, "--unwind", unwind, "-o", &out,
    ];
    if let Some(capture) = capture {
        args.extend(["-o", capture]);
    }
    let output = record(&args);
    expect_success(&output, &format!("profiler record {args:?}"));
    let (text, stacks) = read_folded(Path::new(&out));
    let stacks = stacks.into_iter().filter(|(f, _)| f[0] == COMM).collect();
    (
        text,
        stacks,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Share (percent) of the fixture's samples whose stack starts at `_start` and then has
/// `chain` in order, and the total.
fn whole_share(stacks: &[Stack], chain: &[&str]) -> (u64, u64) {
    let total = samples(stacks, |_| true);
    let whole = samples(stacks, |f| {
        f.get(1).is_some_and(|root| root == "_start") && has_chain(f, chain, |a, b| a == b)
    });
    ((whole * 100).checked_div(total).unwrap_or(0), total)
}

fn objdump(function: &str) -> String {
    let out = Command::new("objdump")
        .args(["-d", &format!("--disassemble={function}"), FIXTURE])
        .output()
        .expect("running objdump (binutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The premise of the other tests: the fixture's functions set up no frame pointer.
#[test]
fn fixture_has_no_frame_pointer_prologue() {
    for function in ["main", "a", "b", "cmp", "deep", "spin"] {
        let code = objdump(function);
        assert!(
            code.contains(&format!("<{function}>:")),
            "objdump shows no {function} in {FIXTURE}:\n{code}"
        );
        assert!(
            !code.contains("mov    %rsp,%rbp"),
            "{function} sets up a frame pointer:\n{code}"
        );
    }
}

#[test]
fn qsort_through_libc_reaches_start_by_table_only() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let (text, stacks, stderr) = record_mode("qsort", "dwarf", 3, None);
    let (share, total) = whole_share(&stacks, &["main", "a", "b"]);
    eprintln!("dwarf: {share}% of {total} samples whole\n{stderr}");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        share >= 95,
        "only {share}% of {total} samples reach _start -> main -> a -> b; {}",
        head(&text, 20)
    );
    // The walk crossed libc's sort (no frame pointers) from the comparison function.
    let (crossed, _) = whole_share(&stacks, &["main", "a", "b", "qsort_r", "cmp"]);
    assert!(
        crossed >= 80,
        "only {crossed}% of samples have b -> qsort_r -> cmp; {}",
        head(&text, 20)
    );

    // Negative control: the same fixture and assertion, walked by frame pointers.
    let (text, stacks, _) = record_mode("qsort", "fp", 3, None);
    let (share, total) = whole_share(&stacks, &["main", "a", "b"]);
    eprintln!("fp: {share}% of {total} samples whole");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        share < 95,
        "frame pointers alone got {share}% whole stacks: the fixture does not test table unwinding"
    );
}

#[test]
fn memcpy_leaf_in_libc_reaches_start() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let (text, stacks, stderr) = record_mode("memcpy", "dwarf", 3, None);
    let (share, total) = whole_share(&stacks, &["main", "a", "b"]);
    eprintln!("{share}% of {total} samples whole\n{stderr}");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        share >= 95,
        "only {share}% of {total} samples reach _start -> main -> a -> b; {}",
        head(&text, 20)
    );
    // Most of the time is in libc's copy routine, a leaf right under b.
    let in_copy = samples(&stacks, |f| {
        f.iter()
            .position(|x| x == "b")
            .and_then(|i| f.get(i + 1))
            .is_some_and(|leaf| leaf.contains("memmove") || leaf.contains("memcpy"))
    });
    assert!(
        in_copy * 100 >= total * 70,
        "only {in_copy} of {total} samples in memcpy under b; {}",
        head(&text, 20)
    );
}

/// Recursion deeper than the walk goes: the stack is cut, marked at its root and counted
/// with its reason, not passed off as whole.
#[test]
fn deep_recursion_is_marked_truncated_with_its_reason() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("unwind-deep-capture");
    let capture = dir.file("deep.capture");
    let (text, stacks, stderr) = record_mode("deep", "dwarf", 3, Some(&capture));
    let total = samples(&stacks, |_| true);
    let marked = samples(&stacks, |f| {
        f.get(1)
            .is_some_and(|root| root == "[truncated: frame limit]")
            && f.iter().any(|x| x == "deep")
    });
    eprintln!("{marked} of {total} marked\n{stderr}");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        marked * 100 >= total * 90,
        "only {marked} of {total} samples marked as cut by the frame limit; {}",
        head(&text, 20)
    );
    assert_eq!(
        samples(&stacks, |f| f.iter().any(|x| x == "main")),
        0,
        "a 300-deep stack cannot reach main in 127 frames; {}",
        head(&text, 20)
    );
    assert!(
        stderr.contains("frame limit"),
        "the frame-limit count is not reported:\n{stderr}"
    );
    // `report --stats` counts them per reason from the capture.
    let out = report(&[&capture, "--stats"]);
    expect_success(&out, "profiler report --stats");
    let stats = String::from_utf8_lossy(&out.stdout);
    let counted: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("truncated frame limit: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no frame-limit count in report --stats:\n{stats}"));
    assert!(
        counted >= marked,
        "report --stats counts {counted}, the stacks show {marked}"
    );

    // Negative control: frame pointers alone cannot say why the stack stops.
    let (text, stacks, _) = record_mode("deep", "fp", 3, None);
    let total = samples(&stacks, |_| true);
    let marked = samples(&stacks, |f| {
        f.get(1)
            .is_some_and(|root| root == "[truncated: frame limit]")
    });
    eprintln!("fp: {marked} of {total} marked");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        marked * 100 < total * 90,
        "frame pointers alone marked {marked} of {total}: the test does not test the table walk"
    );
}

/// fixtures/fx-go built with `go build` into `dir`.
fn build_go_fixture(go: &Path, dir: &TempDir) -> String {
    let bin = dir.file("fx-go");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/fx-go");
    let built = Command::new(go)
        .args(["build", "-o", &bin, "."])
        .current_dir(source)
        .output()
        .expect("running go build");
    assert!(
        built.status.success(),
        "go build failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    bin
}

/// A Go program keeps frame pointers and has no .eh_frame: `auto` walks it by frame pointer
/// and its stacks stay whole from `runtime.main` down.
#[test]
fn go_binary_is_walked_by_frame_pointer_under_auto() {
    if !require_bpf() {
        return;
    }
    let Some(go) = tool("go", "golang-go") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("unwind-go");
    let bin = build_go_fixture(&go, &dir);
    let fixture = spawn_fixture_args(Path::new(&bin), &["20"]);
    let out = dir.file("go.folded");
    let pid = fixture.pid().to_string();
    let args = ["-p", &pid, "-F", "999", "-d", "3s", "-o", &out];
    let output = record(&args);
    expect_success(&output, &format!("profiler record {args:?}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The one table is the vDSO's (the Go runtime reads the clock there).
    assert!(
        stderr.contains("1 binaries by table") && stderr.contains("1 by frame pointer"),
        "the Go binary was not left to frame pointers:\n{stderr}"
    );
    let (text, stacks) = read_folded(Path::new(&out));
    let total = samples(&stacks, |f| f[0] == "fx-go");
    let whole = samples(&stacks, |f| {
        f[0] == "fx-go"
            && has_chain(
                f,
                &["runtime.main", "main.main", "main.outer", "main.middle"],
                |a, b| a == b,
            )
    });
    eprintln!("go: {whole} of {total} samples whole\n{stderr}");
    assert!(total >= 100, "only {total} samples; {}", head(&text, 20));
    assert!(
        whole * 100 >= total * 95,
        "only {whole} of {total} Go samples have runtime.main -> main.main -> main.outer -> \
         main.middle; {}",
        head(&text, 20)
    );
}

/// Go's other threads and the scheduler's stacks: their base is runtime.mstart, goexit,
/// or a switch to the scheduler's stack (mcall, systemstack), whose frame pointer leads to no
/// frame of that stack. The walk stops there (the loader gives Go binaries STOP rows over
/// those functions), so those stacks have it as their root: no `[unknown]` beyond it, not
/// cut short. Before, such stacks ended in `[unknown]` and "no mapping".
#[test]
fn go_thread_stacks_end_at_their_entry() {
    if !require_bpf() {
        return;
    }
    let Some(go) = tool("go", "golang-go") else {
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("unwind-go-threads");
    let bin = build_go_fixture(&go, &dir);
    let fixture = spawn_fixture_args(Path::new(&bin), &["20", "threads"]);
    let out = dir.file("go.folded");
    let pid = fixture.pid().to_string();
    let args = ["-p", &pid, "-F", "999", "-d", "3s", "-o", &out];
    let output = record(&args);
    expect_success(&output, &format!("profiler record {args:?}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (text, stacks) = read_folded(Path::new(&out));
    let entry = |x: &String| {
        let name = x.strip_suffix(".abi0").unwrap_or(x);
        profiler::testkit::unwind::GO_STACK_BASES.contains(&name)
    };
    let total = samples(&stacks, |f| f[0] == "fx-go");
    let on_threads = samples(&stacks, |f| f[0] == "fx-go" && f.iter().any(entry));
    let rooted = samples(&stacks, |f| f[0] == "fx-go" && f.get(1).is_some_and(entry));
    let cut = samples(&stacks, |f| {
        f[0] == "fx-go" && f.iter().any(|x| x.starts_with("[truncated"))
    });
    // Cut short through a stack base: the walk went on past it.
    let cut_through = samples(&stacks, |f| {
        f[0] == "fx-go" && f.iter().any(|x| x.starts_with("[truncated")) && f.iter().any(entry)
    });
    eprintln!(
        "go threads: {rooted} of {on_threads} samples through a thread entry end there; \
         {cut} of {total} cut short\n{stderr}"
    );
    assert!(
        on_threads >= 10,
        "only {on_threads} of {total} samples on the runtime's own stacks: the fixture does \
         not test them; {}",
        head(&text, 20)
    );
    assert_eq!(
        rooted,
        on_threads,
        "stacks go on beyond the thread entry; {}",
        head(&text, 30)
    );
    // A sample at a function's first instructions (before `push %rbp`) loses its caller to
    // any frame-pointer walk; when that caller is a stack base, the walk goes on from a frame
    // pointer that is not this stack's and is cut short ("no mapping"). Those are counted
    // above, not asserted: only the walks through a stack base must end there.
    assert_eq!(
        cut_through,
        0,
        "Go stacks cut short past a stack base; {}",
        head(&text, 30)
    );
}

/// A library mapped after the process's mappings were loaded (dlopen): the first walks into
/// it leave the loaded mappings, the reader reads them again, and from then on stacks through
/// it are whole.
#[test]
fn dlopened_library_is_unwound_after_its_mappings_are_read_again() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    // The fixture dlopens libm 2.5 s after it starts, well after its first samples here.
    let (text, stacks, stderr) = record_mode("dlopen", "dwarf", 5, None);
    let in_libm = |f: &[String]| f.last().is_some_and(|leaf| leaf.contains("cos"));
    let total = samples(&stacks, |f| in_libm(f));
    let whole = samples(&stacks, |f| {
        in_libm(f)
            && f.get(1).is_some_and(|root| root == "_start")
            && has_chain(f, &["main", "a", "b"], |a, b| a == b)
    });
    eprintln!("dlopen: {whole} of {total} samples in cos whole\n{stderr}");
    assert!(
        total >= 100,
        "only {total} samples in cos; {}",
        head(&text, 20)
    );
    assert!(
        whole * 100 >= total * 90,
        "only {whole} of {total} samples in the dlopened cos reach _start -> main -> a -> b; {}",
        head(&text, 20)
    );

    // Negative control: the same assertion, walked by frame pointers.
    let (text, stacks, _) = record_mode("dlopen", "fp", 5, None);
    let total = samples(&stacks, |f| in_libm(f));
    let whole = samples(&stacks, |f| {
        in_libm(f)
            && f.get(1).is_some_and(|root| root == "_start")
            && has_chain(f, &["main", "a", "b"], |a, b| a == b)
    });
    eprintln!("fp: {whole} of {total} samples in cos whole");
    assert!(
        total >= 100,
        "only {total} samples in cos; {}",
        head(&text, 20)
    );
    assert!(
        whole * 100 < total * 90,
        "frame pointers alone got {whole} of {total} whole: the fixture does not test tables"
    );
}
