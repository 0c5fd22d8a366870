//! Table unwinding's edge cases (issue 10), each on a fixture without frame pointers: a
//! sample in a PLT stub, a busy signal handler (crossing `__restore_rt`), a leaf in the
//! vDSO, a static binary, and Rust built without frame pointers. Each asserts that >= 95% of
//! the fixture's samples have the whole chain from `_start`, and that the same assertion
//! fails with `--unwind fp` (the negative control: the fixture really needs the tables).
//! The vDSO case runs twice: a process seeded from /proc (`-p`), and one started after the
//! recording began, whose mappings (`[vdso]` among them) come from the kernel's MMAP2 records.
//! A binary whose CFI is in .debug_frame only, its own or its separate debug file's.
//! Deep recursion, dlopen and Go are in unwind.rs; agreement with perf in unwind_perf.rs.

use std::path::Path;
use std::process::Command;

use profiler_tests::{
    InstalledDebugFile, Running, Stack, TempDir, build_id, exclusive, expect_success, has_chain,
    head, is_kernel, read_folded, record, require_bpf, samples, spawn_fixture_args,
};

const FX_EDGES: &str = env!("FIXTURE_FX_EDGES");
const FX_STATIC: &str = env!("FIXTURE_FX_STATIC");
const FX_RUST_NOFP: &str = env!("FIXTURE_FX_RUST_NOFP");
const FX_DEBUG_FRAME: &str = env!("FIXTURE_FX_DEBUG_FRAME");
const FX_DFRAME_STRIP: &str = env!("FIXTURE_FX_DFRAME_STRIP");
const FX_DFRAME_STRIP_DEBUG: &str = env!("FIXTURE_FX_DFRAME_STRIP_DEBUG");

/// One recording of a fixture run by `--pid` (its tables load before sampling starts).
struct Run {
    text: String,
    /// The fixture's stacks only.
    stacks: Vec<Stack>,
    stderr: String,
}

fn record_fixture(fixture: &str, args: &[&str], unwind: &str, secs: u32) -> Run {
    let name = Path::new(fixture).file_name().unwrap().to_string_lossy();
    let dir = TempDir::new(&format!("unwind-edges-{name}-{unwind}"));
    let process = spawn_fixture_args(Path::new(fixture), args);
    let out = dir.file("out.folded");
    let pid = process.pid().to_string();
    let duration = format!("{secs}s");
    // 999 Hz: cpu-clock counts only the fixture's running time, and on a loaded machine
    // (load 24 on 2 CPUs) 3 s at 499 Hz gave fewer than 100 samples.
    // No disk cache: each run compiles its tables (a table cached before a debug file was
    // installed would hide it).
    let ours = [
        "-p",
        &pid,
        "-F",
        "999",
        "-d",
        &duration,
        "--unwind",
        unwind,
        "--unwind-cache",
        "off",
        "-o",
        &out,
    ];
    let output = record(&ours);
    expect_success(&output, &format!("profiler record {ours:?}"));
    let (text, stacks) = read_folded(Path::new(&out));
    let comm: String = name.chars().take(15).collect();
    Run {
        text,
        stacks: stacks.into_iter().filter(|(f, _)| f[0] == comm).collect(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// One recording of a fixture started after sampling began (`--comm`): its mappings come
/// from the kernel's MMAP2 records, not /proc. Its stacks are picked by pid (`--group-by
/// pid`): other tests' fixtures of the same name may be running on the machine.
fn record_new_fixture(fixture: &str, args: &[&str], unwind: &str, secs: u32) -> Run {
    let name = Path::new(fixture).file_name().unwrap().to_string_lossy();
    let comm: String = name.chars().take(15).collect();
    let dir = TempDir::new(&format!("unwind-edges-new-{name}-{unwind}"));
    let out = dir.file("out.folded");
    let duration = format!("{secs}s");
    let ours = [
        "record",
        "-F",
        "999",
        "-d",
        &duration,
        "--unwind",
        unwind,
        "--comm",
        &comm,
        "--group-by",
        "pid",
        "-o",
        &out,
    ];
    let mut rec = Running::start(&ours);
    rec.wait_for("sampling ");
    let process = spawn_fixture_args(Path::new(fixture), args);
    let root = format!("{comm} [{}]", process.pid());
    let (status, stderr) = rec.finish();
    assert!(status.success(), "profiler {ours:?} failed:\n{stderr}");
    let (text, stacks) = read_folded(Path::new(&out));
    Run {
        text,
        stacks: stacks.into_iter().filter(|(f, _)| f[0] == root).collect(),
        stderr,
    }
}

/// Whether the stack starts at `_start` (right after the comm) and has `chain` in order.
fn whole(f: &[String], chain: &[&str]) -> bool {
    f.get(1).is_some_and(|root| root == "_start") && has_chain(f, chain, |a, b| a == b)
}

/// Samples of `run` that `pick` selects, and how many of them are whole down to `chain`.
fn whole_of(run: &Run, chain: &[&str], pick: impl Fn(&[String]) -> bool) -> (u64, u64) {
    let picked = samples(&run.stacks, &pick);
    let good = samples(&run.stacks, |f| pick(f) && whole(f, chain));
    (good, picked)
}

/// The test's assertion on `run`: at least `min` samples picked, >= 95% of them whole.
fn assert_whole(run: &Run, chain: &[&str], pick: impl Fn(&[String]) -> bool, min: u64, what: &str) {
    let (good, total) = whole_of(run, chain, pick);
    eprintln!("{what}: {good} of {total} samples whole\n{}", run.stderr);
    assert!(
        total >= min,
        "{what}: only {total} samples; {}",
        head(&run.text, 20)
    );
    assert!(
        good * 100 >= total * 95,
        "{what}: only {good} of {total} samples reach _start -> {chain:?}; {}",
        head(&run.text, 20)
    );
}

/// Negative control: the same assertion, walked by frame pointers, must fail.
fn assert_fp_fails(fixture: &str, args: &[&str], chain: &[&str], what: &str) {
    let run = record_fixture(fixture, args, "fp", 3);
    let (good, total) = whole_of(&run, chain, |_| true);
    eprintln!("{what} --unwind fp: {good} of {total} samples whole");
    assert!(
        total >= 100,
        "{what}: only {total} samples; {}",
        head(&run.text, 20)
    );
    assert!(
        good * 100 < total * 95,
        "{what}: frame pointers alone got {good} of {total} whole: the fixture does not test \
         table unwinding"
    );
}

/// The disassembly of each of `functions` in `binary` (objdump, demangled), which must not
/// set up a frame pointer: the premise of the tests.
fn assert_no_frame_pointer_prologue(binary: &str, functions: &[&str]) {
    let out = Command::new("objdump")
        .args(["-d", "-C", "--no-show-raw-insn", binary])
        .output()
        .expect("running objdump (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    for function in functions {
        let header = format!("<{function}>:");
        let code = text
            .split("\n\n")
            .find(|block| block.lines().next().is_some_and(|l| l.ends_with(&header)))
            .unwrap_or_else(|| panic!("objdump shows no {function} in {binary}"));
        assert!(
            !code.contains("mov    %rsp,%rbp"),
            "{function} sets up a frame pointer:\n{code}"
        );
    }
}

#[test]
fn fixtures_have_no_frame_pointer_prologue() {
    let c = [
        "main",
        "a",
        "b",
        "spin",
        "plt_loop",
        "vdso_loop",
        "on_signal",
        "burn",
    ];
    assert_no_frame_pointer_prologue(FX_EDGES, &c);
    assert_no_frame_pointer_prologue(FX_STATIC, &c);
    assert_no_frame_pointer_prologue(FX_DEBUG_FRAME, &["main", "a", "b", "spin"]);
    let rust = ["rust_outer", "rust_middle", "rust_inner"].map(|f| format!("fx_rust_nofp::{f}"));
    assert_no_frame_pointer_prologue(FX_RUST_NOFP, &rust.each_ref().map(String::as_str));
}

/// A hot loop calling a one-line function of a shared library through the PLT: many samples
/// land in the stub itself, where the binutils PLT expression gives the CFA. The PLT has no
/// symbols of its own; the symbolizer names it after the nearest one before it (`_init`).
#[test]
fn sample_in_a_plt_stub_is_whole() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["20", "plt"];
    let chain = ["main", "a", "b", "plt_loop"];
    let run = record_fixture(FX_EDGES, &args, "dwarf", 3);
    assert_whole(&run, &chain, |_| true, 100, "plt");
    let in_stub =
        |f: &[String]| f.len() >= 2 && f[f.len() - 2] == "plt_loop" && f[f.len() - 1] == "_init";
    let total = samples(&run.stacks, |_| true);
    let (good, stub) = whole_of(&run, &chain, in_stub);
    assert!(
        stub * 100 >= total * 5,
        "only {stub} of {total} samples in the PLT stub: the fixture does not test it; {}",
        head(&run.text, 20)
    );
    assert!(
        good * 100 >= stub * 95,
        "only {good} of {stub} samples in the PLT stub are whole; {}",
        head(&run.text, 20)
    );
    let in_library = samples(&run.stacks, |f| f.last().is_some_and(|l| l == "fx_tiny"));
    assert!(
        in_library > 0,
        "no sample in fx_tiny; {}",
        head(&run.text, 20)
    );
    assert_fp_fails(FX_EDGES, &args, &chain, "plt");
}

/// A SIGPROF handler that burns CPU: its samples must cross the signal frame (libc's
/// `__restore_rt`, whose registers are in the sigcontext) into the interrupted `spin`.
#[test]
fn busy_signal_handler_crosses_the_signal_frame() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["20", "signal"];
    // The handler burns 3 ms of CPU every 10 ms: about 30% of the samples.
    let run = record_fixture(FX_EDGES, &args, "dwarf", 5);
    let in_handler = |f: &[String]| f.iter().any(|x| x == "on_signal");
    let chain = ["main", "a", "b", "spin", "on_signal", "burn"];
    assert_whole(&run, &chain, in_handler, 50, "signal handler");
    let total = samples(&run.stacks, |_| true);
    let handler = samples(&run.stacks, in_handler);
    assert!(
        handler * 100 >= total * 10,
        "only {handler} of {total} samples in the handler; {}",
        head(&run.text, 20)
    );
    // And the samples outside the handler are whole as well.
    assert_whole(&run, &chain[..4], |_| true, 100, "signal, all");
    assert_fp_fails(FX_EDGES, &args, &chain[..4], "signal");
}

/// A loop on clock_gettime: the leaf is in the vDSO (in no file; symbolized `[unknown]`
/// under libc's `clock_gettime`), walked by the table of the vDSO's own .eh_frame, so a
/// sample at its first instruction (before `push %rbp`) is whole too.
#[test]
fn leaf_in_the_vdso_reaches_main() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["20", "vdso"];
    let chain = ["main", "a", "b", "vdso_loop"];
    let run = record_fixture(FX_EDGES, &args, "dwarf", 3);
    assert_whole(&run, &chain, |_| true, 100, "vdso");
    let in_vdso = |f: &[String]| {
        f.len() >= 2 && f[f.len() - 2] == "clock_gettime" && f[f.len() - 1] == "[unknown]"
    };
    let total = samples(&run.stacks, |_| true);
    let vdso = samples(&run.stacks, in_vdso);
    assert!(
        vdso * 100 >= total * 20,
        "only {vdso} of {total} samples in the vDSO; {}",
        head(&run.text, 20)
    );
    assert_eq!(
        samples(&run.stacks, |f| f
            .iter()
            .any(|x| x.starts_with("[truncated"))),
        0,
        "stacks cut short; {}",
        head(&run.text, 20)
    );
    assert_fp_fails(FX_EDGES, &args, &chain, "vdso");
}

/// The vDSO leaf in a process started after the recording began: its mappings, `[vdso]`
/// among them, come from the kernel's MMAP2 records. Samples from before its tables were
/// loaded (`[truncated: not loaded]`: walked by frame pointer, or up to a library ld.so
/// mapped after the process's entry was written, their stack copies refused at 999 Hz, ten
/// times the copy ration) are left out; every other sample is whole (those with the leaf in
/// the vDSO too) and none from `main` on is cut short for another reason.
#[test]
fn leaf_in_the_vdso_of_a_new_process_reaches_main() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["4", "vdso"];
    let chain = ["main", "a", "b", "vdso_loop"];
    let run = record_new_fixture(FX_EDGES, &args, "dwarf", 5);
    let loaded = |f: &[String]| f.get(1).is_none_or(|r| r != "[truncated: not loaded]");
    assert_whole(&run, &chain, loaded, 100, "vdso, new process");
    // Named here: the collector names the vDSO from its own copy of the image (`/proc`
    // seeding leaves it `[unknown]`), so the leaf is the vDSO's clock_gettime under libc's.
    let in_vdso = |f: &[String]| {
        let user: Vec<&String> = f.iter().filter(|x| !is_kernel(x)).collect();
        loaded(f) && user.ends_with(&[&"clock_gettime".to_owned(), &"clock_gettime".to_owned()])
    };
    assert_whole(&run, &chain, in_vdso, 20, "vdso leaf, new process");
    let (total, vdso) = (samples(&run.stacks, loaded), samples(&run.stacks, in_vdso));
    assert!(
        vdso * 100 >= total * 20,
        "only {vdso} of {total} samples in the vDSO; {}",
        head(&run.text, 20)
    );
    // In its loop: the process's start-up (ld.so mapping libc, whose table may still be
    // compiling) has a window of its own, not the vDSO's.
    let cut = |f: &[String]| {
        loaded(f) && f.iter().any(|x| x == "main") && f.iter().any(|x| x.starts_with("[truncated"))
    };
    let cut_stacks: Vec<String> = run
        .stacks
        .iter()
        .filter(|(f, _)| cut(f))
        .take(5)
        .map(|(f, n)| format!("{} {n}", f.join(";")))
        .collect();
    assert_eq!(
        samples(&run.stacks, cut),
        0,
        "stacks cut short:\n{}\n{}",
        cut_stacks.join("\n"),
        head(&run.text, 20)
    );
}

/// A static binary (its own libc inside, no frame pointers): one table from its .eh_frame.
#[test]
fn static_binary_is_walked_by_its_own_table() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["20", "spin"];
    let chain = ["main", "a", "b", "spin"];
    let run = record_fixture(FX_STATIC, &args, "dwarf", 3);
    // Two tables: the binary's and the vDSO's; nothing by frame pointer.
    assert!(
        run.stderr.contains("2 binaries by table") && run.stderr.contains("0 by frame pointer"),
        "the static binary did not get a table:\n{}",
        run.stderr
    );
    assert_whole(&run, &chain, |_| true, 100, "static");
    assert_fp_fails(FX_STATIC, &args, &chain, "static");
}

/// Rust built as `cargo build --release` builds by default (optimized, no frame pointers,
/// linked by lld): the chain through std's runtime down to rust_inner is whole.
#[test]
fn rust_without_frame_pointers_is_whole() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["20"];
    let chain = [
        "main",
        "fx_rust_nofp::main",
        "fx_rust_nofp::rust_outer",
        "fx_rust_nofp::rust_middle",
        "fx_rust_nofp::rust_inner",
    ];
    let run = record_fixture(FX_RUST_NOFP, &args, "dwarf", 3);
    assert_whole(&run, &chain, |_| true, 100, "rust");
    assert_fp_fails(FX_RUST_NOFP, &args, &chain, "rust");
}

/// The address of function `name` in the symbol table of the ELF file at `path`.
fn symbol(path: &str, name: &str) -> u64 {
    let out = Command::new("nm")
        .arg(path)
        .output()
        .expect("running nm (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let (addr, _, sym) = (w.next()?, w.next()?, w.next()?);
            (sym == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .unwrap_or_else(|| panic!("nm {path} shows no {name}"))
}

/// The premise of the .debug_frame tests, without root: the stripped fx-dframe-strip's
/// .eh_frame does not describe `b`; the table compiled with its debug file's .debug_frame
/// does (CFA from RSP), and so does fx-debug-frame's own.
#[test]
fn debug_frame_covers_what_eh_frame_leaves_out() {
    use profiler::testkit::unwind::compile_with_debug;
    use profiler_common::unwind::kind;
    let b = symbol(FX_DFRAME_STRIP_DEBUG, "b");
    let stripped = std::fs::read(FX_DFRAME_STRIP).unwrap();
    let debug = std::fs::read(FX_DFRAME_STRIP_DEBUG).unwrap();
    let kind_at = |table: &profiler::testkit::unwind::Table| table.lookup(b).map(|r| r.kind);
    let alone = compile_with_debug(&stripped, |_| None::<&[u8]>).unwrap();
    assert!(
        matches!(kind_at(&alone), None | Some(kind::NONE)),
        ".eh_frame describes b: {:?}",
        alone.lookup(b)
    );
    let with_debug = compile_with_debug(&stripped, |_| Some(&debug[..])).unwrap();
    assert_eq!(kind_at(&with_debug), Some(kind::CFA_RSP), "{with_debug:?}");
    let own = std::fs::read(FX_DEBUG_FRAME).unwrap();
    let own_table = profiler::testkit::unwind::compile(&own).unwrap();
    assert_eq!(
        own_table
            .lookup(symbol(FX_DEBUG_FRAME, "b"))
            .map(|r| r.kind),
        Some(kind::CFA_RSP)
    );
}

/// A binary whose own functions are described by .debug_frame only (built with
/// -fno-asynchronous-unwind-tables -fno-unwind-tables -g): whole by table, not by frame
/// pointer.
#[test]
fn debug_frame_only_binary_is_whole() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let args = ["20"];
    let chain = ["main", "a", "b", "spin"];
    let run = record_fixture(FX_DEBUG_FRAME, &args, "dwarf", 3);
    assert_whole(&run, &chain, |_| true, 100, "debug_frame");
    assert_fp_fails(FX_DEBUG_FRAME, &args, &chain, "debug_frame");
}

/// The same binary stripped: its .debug_frame (and names) are in a separate debug file,
/// found by build id under /usr/lib/debug/.build-id.
#[test]
fn debug_frame_from_a_debug_file_found_by_build_id() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let id = build_id(FX_DFRAME_STRIP);
    assert_eq!(
        id,
        build_id(FX_DFRAME_STRIP_DEBUG),
        "the debug file is the binary's"
    );
    let _installed = InstalledDebugFile::new(&id, FX_DFRAME_STRIP_DEBUG);
    let run = record_fixture(FX_DFRAME_STRIP, &["20"], "dwarf", 3);
    assert_whole(
        &run,
        &["main", "a", "b", "spin"],
        |_| true,
        100,
        "debug file",
    );
}

/// Kernel threads have no user stack. A tick in one must not walk the zeros it saved as
/// "user registers" (every kworker sample read `[truncated: no mapping];[unknown]` under
/// `--unwind dwarf` before the sampler checked the saved code segment). Workqueue work is made
/// on every CPU by writing /proc/sys/vm/stat_refresh in a loop (the kernel runs it in each
/// CPU's kworker and waits): about 1,300 kernel-thread samples in 5 s at 999 Hz here.
#[test]
fn kernel_threads_have_no_user_frames() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("unwind-edges-kthreads");
    let out = dir.file("out.folded");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let work = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write("/proc/sys/vm/stat_refresh", "1")
                    .expect("writing /proc/sys/vm/stat_refresh (root needed)");
            }
        })
    };
    let args = [
        "-F",
        "999",
        "-d",
        "5s",
        "--unwind",
        "dwarf",
        "--group-by",
        "pid",
        "-o",
        &out,
    ];
    let output = record(&args);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    work.join().expect("the stat_refresh loop");
    expect_success(&output, &format!("profiler record {args:?}"));
    let (text, stacks) = read_folded(Path::new(&out));
    // `comm [pid]` roots; a kernel thread is kthreadd (pid 2) or one of its children.
    let kernel_thread = |frames: &[String]| {
        let pid = frames[0]
            .rsplit_once(" [")
            .and_then(|(_, p)| p.trim_end_matches(']').parse::<u32>().ok());
        pid.is_some_and(|pid| {
            pid == 2
                || std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().eq(["PPid:", "2"])))
        })
    };
    let total = samples(&stacks, kernel_thread);
    let with_user = samples(&stacks, |f| {
        kernel_thread(f) && f[1..].iter().any(|x| !is_kernel(x))
    });
    assert!(
        total >= 50,
        "only {total} kernel-thread samples while stat_refresh ran; {}",
        head(&text, 20)
    );
    assert_eq!(
        with_user,
        0,
        "{with_user} of {total} kernel-thread samples have user frames: {}",
        stacks
            .iter()
            .filter(|(f, _)| kernel_thread(f) && f[1..].iter().any(|x| !is_kernel(x)))
            .take(5)
            .map(|(f, n)| format!("{} {n}", f.join(";")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
