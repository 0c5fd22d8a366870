//! The unwind-table memory budget (`--unwind-memory`, issue 10): with a budget that holds
//! python3's table or libc's but not both, a python3 process sampled next to fx-unwind (whose
//! stacks cross libc) makes the loader evict tables; once python3 has exited, fx-unwind's
//! stacks are whole again (its libc table re-loaded), and the capture says how many tables
//! were evicted and how much kernel memory the tables took. And the compile pool: a small
//! program started next to one mapping a huge library is walked by table while the huge
//! library's table is still being compiled.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use profiler_tests::{
    Running, TempDir, cannot_run, exclusive, expect_success, head, report, require_bpf,
    spawn_fixture_args,
};

const FIXTURE: &str = env!("FIXTURE_FX_UNWIND");
const FX_BIG: &str = env!("FIXTURE_FX_BIG");

/// Entries of UNWIND_ROWS (4 bytes each: rows and page index) the table the profiler
/// compiles for the binary at `path` takes in the kernel.
fn rows(path: &Path) -> u64 {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = profiler::testkit::unwind::compile(&data)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut rules = profiler::testkit::unwind::Rules::default();
    let kernel =
        profiler::testkit::unwind::KernelTable::new(&table.rows, &table.padding, &mut rules)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    u64::from(kernel.len())
}

/// The file `pid` maps whose name starts with `prefix` (e.g. `libc.so`), waiting (5 s at
/// most) for ld.so to map it.
fn mapped(pid: u32, prefix: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("reading maps");
        let found = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| {
                Path::new(p)
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            });
        if let Some(path) = found {
            return path.to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "pid {pid} maps no {prefix}*:\n{maps}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One sample of `report -o x.perf.txt`: comm, pid, time (s), frame names leaf first.
struct Sample {
    comm: String,
    pid: u32,
    time: f64,
    frames: Vec<String>,
}

fn perf_samples(text: &str) -> Vec<Sample> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut lines = block.lines().filter(|l| !l.is_empty());
            let head: Vec<&str> = lines.next()?.split_whitespace().collect();
            let time = head.get(3)?.trim_end_matches(':').parse().ok()?;
            // "\tADDR NAME (MODULE)": names may hold spaces (`[truncated: not loaded]`).
            let frames = lines
                .filter_map(|l| {
                    let (_, rest) = l.trim().split_once(' ')?;
                    Some(
                        rest.rsplit_once(" (")
                            .map_or(rest, |(name, _)| name)
                            .to_owned(),
                    )
                })
                .collect();
            Some(Sample {
                comm: head[0].to_owned(),
                pid: head.get(1)?.split_once('/')?.0.parse().ok()?,
                time,
                frames,
            })
        })
        .collect()
}

/// Root `_start`, then main -> a -> b on the way to the leaf.
fn whole(frames: &[String]) -> bool {
    let root_first: Vec<&str> = frames.iter().rev().map(String::as_str).collect();
    let chain = ["_start", "main", "a", "b"];
    root_first.first() == Some(&"_start")
        && chain
            .iter()
            .try_fold(0, |from, f| {
                root_first[from..]
                    .iter()
                    .position(|x| x == f)
                    .map(|i| from + i + 1)
            })
            .is_some()
}

/// The samples of `capture` as `report -o NAME.perf.txt` (in `dir`) prints them.
fn report_samples(dir: &TempDir, capture: &str, name: &str) -> Vec<Sample> {
    let text = dir.file(name);
    let out = report(&[capture, "-o", &text]);
    expect_success(&out, "report -o perf.txt");
    perf_samples(&std::fs::read_to_string(&text).expect("reading perf.txt"))
}

/// `report --stats` of `capture`.
fn report_stats(capture: &str) -> String {
    let stats = report(&[capture, "--stats"]);
    expect_success(&stats, "report --stats");
    String::from_utf8_lossy(&stats.stdout).into_owned()
}

/// The counter `name` of `report --stats` (`stderr`, the record's, for the failure message).
fn counter(stats: &str, name: &str, stderr: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in report --stats:\n{stats}\n{stderr}"))
}

/// A budget, in rows, that holds python3's table, and fx-unwind's tables (its own, libc's and
/// ld.so's), but not python3's and libc's together.
fn budget_for(python: &Path, fixture_pid: u32) -> u64 {
    let libc = mapped(fixture_pid, "libc.so");
    let (py_rows, libc_rows) = (rows(python), rows(Path::new(&libc)));
    let fixture_rows =
        rows(Path::new(FIXTURE)) + libc_rows + rows(Path::new(&mapped(fixture_pid, "ld-linux")));
    let budget_rows = py_rows + libc_rows / 2;
    assert!(
        fixture_rows < budget_rows,
        "fx-unwind needs {fixture_rows} rows"
    );
    eprintln!(
        "rows: python3 {py_rows}, libc {libc_rows}, fx-unwind's {fixture_rows}; budget {budget_rows}"
    );
    budget_rows
}

/// Records fx-unwind and python3.11 for 9 s by table with `budget_rows` of table memory, with
/// two seconds of pure-Python work (its stacks cross python3's own code) after the first.
/// Returns the record's stderr.
fn record_python_beside_the_fixture(python: &Path, capture: &str, budget_rows: u64) -> String {
    let budget = (budget_rows * 4).to_string();
    let mut rec = Running::start(&[
        "record",
        "-v",
        "-F",
        "499",
        "-d",
        "9s",
        "--unwind",
        "dwarf",
        "--unwind-memory",
        &budget,
        "--comm",
        "fx-unwind",
        "--comm",
        "python3.11",
        "-o",
        capture,
    ]);
    rec.wait_for("sampling ");
    std::thread::sleep(Duration::from_secs(1));
    let py = Command::new(python)
        .args([
            "-c",
            "import time\nt = time.time()\nwhile time.time() - t < 2: sum(range(1000))",
        ])
        .output()
        .expect("running python3.11");
    assert!(py.status.success(), "python3.11 failed: {py:?}");
    let (status, stderr) = rec.finish();
    assert!(status.success(), "record failed:\n{stderr}");
    stderr
}

/// The capture counts the tables evicted (one or more) and the table memory used, within the
/// budget. Returns the evictions.
fn check_evictions_counted(capture: &str, budget_rows: u64, stderr: &str) -> u64 {
    let stats = report_stats(capture);
    let evicted = counter(&stats, "unwind_evicted", stderr);
    assert!(evicted >= 1, "no table was evicted:\n{stats}\n{stderr}");
    let (bytes, capacity) = (
        counter(&stats, "unwind_table_bytes", stderr),
        counter(&stats, "unwind_table_capacity_bytes", stderr),
    );
    assert!(
        bytes > 0 && bytes <= capacity && capacity == budget_rows * 4,
        "table bytes {bytes} of {capacity}:\n{stats}"
    );
    evicted
}

/// python3 was sampled (it competed for the budget); in the last 3 s of the recording, and at
/// least two seconds after python3 exited (time for the reader to run and load libc's table
/// again on a slow, busy machine), fx-unwind's stacks are whole: its libc table is back.
fn check_whole_after_python_exited(samples: &[Sample], evicted: u64, stderr: &str) {
    let py_end = samples
        .iter()
        .filter(|s| s.comm.starts_with("python3"))
        .map(|s| s.time)
        .fold(f64::NAN, f64::max);
    assert!(
        py_end.is_finite(),
        "no python3.11 samples: it was never loaded, nothing competed for the budget\n{stderr}"
    );
    let end = samples.iter().map(|s| s.time).fold(f64::NAN, f64::max);
    let from = (py_end + 2.0).max(end - 3.0);
    let late: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.comm == "fx-unwind" && s.time > from)
        .collect();
    let whole_late = late.iter().filter(|s| whole(&s.frames)).count();
    let broken: Vec<String> = late
        .iter()
        .filter(|s| !whole(&s.frames))
        .take(5)
        .map(|s| format!("{:.3}: {}", s.time - py_end, s.frames.join(" <- ")))
        .collect();
    eprintln!(
        "{evicted} evicted; {whole_late} of {} fx-unwind samples whole after python3 exited\n{stderr}",
        late.len()
    );
    assert!(
        late.len() >= 100,
        "only {} late samples\n{stderr}",
        late.len()
    );
    assert!(
        whole_late * 100 >= late.len() * 95,
        "only {whole_late} of {} fx-unwind samples reach _start -> main -> a -> b after \
         python3 exited: its evicted tables did not come back; s after python3's end: \
         stack\n{}\n{stderr}",
        late.len(),
        broken.join("\n")
    );
}

#[test]
fn tables_evicted_for_another_process_come_back_whole() {
    if !require_bpf() {
        return;
    }
    // Debian's python3.11 (`cargo xtask setup --tests` installs it), not a pyenv shim.
    let python = Path::new("/usr/bin/python3.11");
    if !python.is_file() {
        cannot_run("/usr/bin/python3.11 is missing (apt install python3.11)");
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("unwind-budget");
    let fixture = spawn_fixture_args(Path::new(FIXTURE), &["30", "qsort"]);
    let budget_rows = budget_for(python, fixture.pid());
    let capture = dir.file("budget.capture");
    let stderr = record_python_beside_the_fixture(python, &capture, budget_rows);
    drop(fixture);
    let evicted = check_evictions_counted(&capture, budget_rows, &stderr);
    let samples = report_samples(&dir, &capture, "out.perf.txt");
    check_whole_after_python_exited(&samples, evicted, &stderr);
}

/// The compile pool: fx-big maps a library with 8 MiB of .eh_frame (seconds to compile) and
/// is sampled first, then fx-unwind starts. One thread compiling tables in turn loaded
/// fx-unwind only after fx-big's library; the pool's small lane compiles fx-unwind's
/// tables beside it, so fx-unwind is loaded and walked whole while fx-big's library is
/// still compiling. fx-big itself no longer waits for it either (its other binaries are
/// walked by table meanwhile, the library PENDING), so the library's end is read from the
/// profiler's debug log: fx-unwind's load is logged before the library's table is done.
/// The assertions are on the order of events, not on how long anything took.
#[test]
fn small_program_is_not_held_up_by_a_huge_table() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("unwind-pool");
    let capture = dir.file("pool.capture");
    // No disk cache: a table cached by an earlier run would load at once.
    let mut rec = Running::start(&[
        "record",
        "-vv",
        "-F",
        "999",
        "-d",
        "8s",
        "--unwind",
        "dwarf",
        "--unwind-cache",
        "off",
        "--comm",
        "fx-big",
        "--comm",
        "fx-unwind",
        "-o",
        &capture,
    ]);
    rec.wait_for("sampling ");
    let big = spawn_fixture_args(Path::new(FX_BIG), &["30"]);
    let big_pid = big.pid();
    // fx-big spins at once: its first samples (and its tables' compiles) come first.
    std::thread::sleep(Duration::from_millis(500));
    let small = spawn_fixture_args(Path::new(FIXTURE), &["30", "qsort"]);
    let small_pid = small.pid();
    let (status, stderr) = rec.finish();
    assert!(status.success(), "record failed:\n{stderr}");
    drop((big, small));

    let samples = report_samples(&dir, &capture, "pool.perf.txt");
    let not_loaded = |s: &Sample| {
        s.frames
            .last()
            .is_some_and(|f| f == "[truncated: not loaded]")
    };
    // By pid: other tests' fixtures of the same name may run on the machine.
    let of = |pid: u32| samples.iter().filter(move |s| s.pid == pid);
    let small_whole: Vec<f64> = of(small_pid)
        .filter(|s| whole(&s.frames))
        .map(|s| s.time)
        .collect();
    let (small_total, small_waited) = (
        of(small_pid).count(),
        of(small_pid).filter(|s| not_loaded(s)).count(),
    );
    let big_total = of(big_pid).count();
    // The debug log, in the order things happened: fx-unwind's mappings loaded (its tables
    // in), and fx-big's library's table compiled.
    let lines: Vec<&str> = stderr.lines().collect();
    let small_loaded = lines.iter().position(|l| {
        l.contains(&format!("pid {small_pid}: ")) && l.contains("loaded for unwinding")
    });
    let big_compiled = lines
        .iter()
        .position(|l| l.contains("libfx-big.so: unwind table compiled"));
    eprintln!(
        "fx-unwind: {} of {small_total} samples whole, {small_waited} not loaded; fx-big: \
         {big_total} samples; log lines: fx-unwind loaded {small_loaded:?}, the huge table \
         compiled {big_compiled:?}",
        small_whole.len(),
    );
    assert!(
        big_total > 0,
        "fx-big was not sampled: the test needs its huge table asked for first"
    );
    assert!(
        small_whole.len() >= 50,
        "only {} of fx-unwind's {small_total} samples whole\n{}",
        small_whole.len(),
        head(&stderr, 40)
    );
    let small_loaded = small_loaded.expect("no log line of fx-unwind's mappings loaded");
    assert!(
        big_compiled.is_none_or(|b| small_loaded < b),
        "fx-unwind was loaded after fx-big's huge table was compiled: the small program \
         waited behind it"
    );
}

/// `name:` of /proc/PID/status, in bytes.
fn status_bytes(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or_else(
            || panic!("no {name} in /proc/{pid}/status:\n{status}"),
            |kb| kb * 1024,
        )
}

/// The UNWIND_ROWS array (`--unwind-memory`) is kernel memory; the profiler maps only the
/// part its tables use (the kernel maps every page of an mmap of such an array at once, so a
/// whole mapping put all of it in RSS). With a 256 MiB array and one small process's tables
/// (a few MiB), the recording's peak RSS stays below the array's size: mapped whole, the
/// array alone would be more.
#[test]
fn unwind_array_is_not_in_rss_beyond_its_rows() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("unwind-rss");
    let fixture = spawn_fixture_args(Path::new(FIXTURE), &["30", "qsort"]);
    mapped(fixture.pid(), "libc.so");
    let array_bytes: u64 = 256 << 20;
    let capture = dir.file("rss.capture");
    let pid = fixture.pid().to_string();
    let mut rec = Running::start(&[
        "record",
        "-d",
        "4s",
        "--unwind",
        "dwarf",
        "--unwind-memory",
        &array_bytes.to_string(),
        "--unwind-cache",
        "off",
        "--pid",
        &pid,
        "-o",
        &capture,
    ]);
    // --pid loads the process's tables before sampling starts.
    rec.wait_for("sampling ");
    std::thread::sleep(Duration::from_secs(1));
    let peak = status_bytes(rec.pid(), "VmHWM:");
    let (status, stderr) = rec.finish();
    assert!(status.success(), "record failed:\n{stderr}");
    drop(fixture);

    let stats = report_stats(&capture);
    let (rows_bytes, capacity, mapped) = (
        counter(&stats, "unwind_table_bytes", &stderr),
        counter(&stats, "unwind_table_capacity_bytes", &stderr),
        counter(&stats, "unwind_table_mapped_bytes", &stderr),
    );
    eprintln!("peak RSS {peak} bytes; tables {rows_bytes} of {capacity} bytes, {mapped} mapped");
    assert_eq!(counter(&stats, "unwind_evicted", &stderr), 0, "{stats}");
    // Nothing was evicted, so the rows lie from row 0 on, and the chunks (1 MiB,
    // `rows_view::CHUNK_BYTES`) that hold them are all that is mapped.
    let chunk = profiler::testkit::unwind::CHUNK_BYTES as u64;
    assert!(
        mapped >= rows_bytes && mapped <= rows_bytes.next_multiple_of(chunk),
        "{mapped} bytes mapped for {rows_bytes} bytes of rows\n{stats}"
    );
    assert_eq!(capacity, array_bytes, "{stats}");
    assert!(
        rows_bytes > 0,
        "no table was loaded: nothing to show\n{stats}\n{stderr}"
    );
    assert!(
        peak < array_bytes,
        "peak RSS {peak} bytes is not below the {array_bytes}-byte unwind array: the array \
         is mapped beyond the {rows_bytes} bytes of rows in use\n{stderr}"
    );
}
