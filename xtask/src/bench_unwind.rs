//! `cargo xtask bench unwind`: table unwinding (issue 10) side by side on one workload that
//! runs throughout: fx-unwind (no frame pointers, through Debian's libc), and unmodified
//! Debian python3.11 (json + re), xz -6 (restarted in a loop) and sqlite3 (a recursive query).
//! One after the other, each for the same time at 99 Hz: ours with `--unwind fp` and
//! `--unwind dwarf`, profile-bee `--dwarf`, bpftrace's frame-pointer `ustack`, and
//! `perf record --call-graph dwarf`. Reported: BPF ns per sample (bpf_stats), the share of
//! each program's samples whose user stack reaches its entry, our lost samples, our BPF map
//! memory against the binaries' raw .eh_frame bytes, and table build times. First, on a quiet
//! machine, the cost of 30-frame table walks (`bench_unwind_deep`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::bench_support::{BpfStatsEnabled, Proc, ProgStats, catch_ctrl_c, prepare_build, sleep};
use crate::bench_unwind_peers::{bpftrace, perf_dwarf, profile_bee, reach_perf_text};
use crate::setup::Extras;
use crate::util;

/// The programs of the workload, by comm.
pub(crate) const PROGRAMS: [&str; 4] = ["fx-unwind", "python3.11", "xz", "sqlite3"];
pub(crate) const HZ: u64 = 99;
/// Program stats are read this long before a run ends (the tools stop sampling at the end).
pub(crate) const READ_BEFORE_END: u64 = 2;
pub(crate) const EXIT_GRACE: Duration = Duration::from_secs(120);

/// fx-unwind's flags, as tests/build.rs builds it: like distribution packages, no frame
/// pointers, only .eh_frame describes its frames; no inlining, so its chain is the source's.
const NO_FP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fasynchronous-unwind-tables",
    "-fno-inline",
    "-fno-optimize-sibling-calls",
];

/// `deep30_only`: the 30-frame section alone (half a minute).
pub(crate) fn unwind(
    seconds: u64,
    debug: bool,
    profile_bee: bool,
    deep30_only: bool,
) -> Result<()> {
    let (bin, out_dir) = prepare_build(
        Extras {
            bench: true,
            profile_bee,
            ..Extras::default()
        },
        !debug,
    )?;
    let tmp = std::env::temp_dir().join(format!("profiler-bench-unwind-{}", std::process::id()));
    fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    catch_ctrl_c();
    let result = measure(&bin, &tmp, seconds, profile_bee, deep30_only);
    let _ = fs::remove_dir_all(&tmp);
    let m = result?;
    let build = if debug { "debug" } else { "release" };
    let mut table = if deep30_only {
        format!("unwind bench, 30-frame section only, {build} build of the profiler\n")
    } else {
        render(&m, seconds, build)
    };
    table += &crate::bench_unwind_deep::render(&m.deep30);
    print!("{table}");
    let path = out_dir.join("unwind.txt");
    fs::write(&path, &table).with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// One tool's run.
#[derive(Default)]
pub(crate) struct Run {
    pub(crate) name: String,
    /// BPF time per program run (None: the tool runs no BPF, perf).
    pub(crate) ns_per_sample: Option<f64>,
    /// Per program: (samples reaching the entry, samples).
    pub(crate) reach: BTreeMap<String, (u64, u64)>,
    pub(crate) lost: Option<u64>,
    /// Our map memory (memlock from fdinfo, what `bpftool map show` reports): all maps, and
    /// the unwind rows array; the rows in use (from the capture).
    pub(crate) map_bytes: Option<(u64, u64, u64)>,
}

#[derive(Default)]
struct Measurement {
    /// The 30-frame section's runs.
    deep30: Vec<crate::bench_unwind_deep::DeepRun>,
    runs: Vec<Run>,
    eh_frame_bytes: u64,
    binaries: usize,
    build_libc: String,
    build_python: String,
}

fn measure(
    bin: &Path,
    tmp: &Path,
    seconds: u64,
    profile_bee_too: bool,
    deep30_only: bool,
) -> Result<Measurement> {
    let fx = tmp.join("fx-unwind");
    let source = util::workspace_root().join("tests/fixtures/fx-unwind.c");
    util::run(
        Command::new("gcc")
            .args(NO_FP_CFLAGS)
            .arg("-o")
            .arg(&fx)
            .arg(&source),
    )?;
    // Before the workload starts: the section wants the CPUs to itself.
    let deep30 = crate::bench_unwind_deep::measure(bin, tmp, &fx)?;
    if deep30_only {
        return Ok(Measurement {
            deep30,
            ..Measurement::default()
        });
    }
    let input = tmp.join("xz-input");
    // Compressible but not trivially: base64 of random bytes.
    util::run(Command::new("sh").arg("-c").arg(format!(
        "head -c 400000 /dev/urandom | base64 > {}",
        input.display()
    )))?;
    let total = 8 * seconds + 60;
    let python = "import json, re, time\nt = time.time()\nwhile time.time() - t < {T}:\n    d = json.loads(json.dumps([{'k': i, 'v': str(i) * 5} for i in range(300)]))\n    re.findall(r'(\\d+)5', json.dumps(d))\n".replace("{T}", &total.to_string());
    let workload = vec![
        Proc::spawn(Command::new(&fx).args([&total.to_string(), "qsort"]))?,
        Proc::spawn(Command::new("/usr/bin/python3.11").args(["-c", &python]))?,
        Proc::spawn(Command::new("sh").arg("-c").arg(format!(
            "while :; do xz -6 -c < {} > /dev/null; done",
            input.display()
        )))?,
        Proc::spawn(Command::new("sh").arg("-c").arg(
            "while :; do sqlite3 :memory: 'WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL \
             SELECT x + 1 FROM c LIMIT 3000000) SELECT sum(x) FROM c;'; done",
        ))?,
    ];
    sleep(Duration::from_secs(2))?;
    let (eh_frame_bytes, binaries) = eh_frame_sizes(&workload);
    let _stats = BpfStatsEnabled::enable()?;
    let mut runs = Vec::new();
    for mode in ["fp", "dwarf"] {
        println!("==> profiler record --unwind {mode} -F {HZ} for {seconds}s");
        let ours = record_ours(bin, tmp, mode, HZ, seconds, &["--unwind", mode])?;
        runs.push(Run {
            name: format!("ours --unwind {mode}"),
            ns_per_sample: Some(ours.stats.ns_per_run()),
            reach: reach_perf_text(&ours.text),
            lost: Some(ours.num("lost_ringbuf_full")),
            map_bytes: ours
                .maps
                .map(|(all, rows)| (all, rows, ours.num("unwind_table_bytes"))),
        });
    }
    if profile_bee_too {
        runs.push(profile_bee(tmp, seconds)?);
    }
    runs.push(bpftrace(seconds)?);
    runs.push(perf_dwarf(tmp, seconds)?);
    // Table build times with no disk cache: python3.11's process (python3.11, libc, libm,
    // libz, libexpat, ld.so), and a process mapping little but libc (sleep, libc, ld.so).
    let build_python = build_time(bin, workload[1].pid())?;
    let sleeper = Proc::spawn(Command::new("sleep").arg("60"))?;
    let build_libc = build_time(bin, sleeper.pid())?;
    Ok(Measurement {
        deep30,
        runs,
        eh_frame_bytes,
        binaries,
        build_libc,
        build_python,
    })
}

/// One `profiler record` of ours: its BPF programs' stats over its sampling window, its map
/// memory, its `report --stats` and its perf-script text.
pub(crate) struct Ours {
    pub(crate) stats: ProgStats,
    pub(crate) maps: Option<(u64, u64)>,
    report: String,
    pub(crate) text: String,
}

impl Ours {
    /// A number of `report --stats` (0 when absent).
    pub(crate) fn num(&self, key: &str) -> u64 {
        util::field(&self.report, key)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    }
}

/// Records the whole system with our `bin` for `seconds` at `hz` with `args`, into files
/// named after `name` in `tmp`.
pub(crate) fn record_ours(
    bin: &Path,
    tmp: &Path,
    name: &str,
    hz: u64,
    seconds: u64,
    args: &[&str],
) -> Result<Ours> {
    let capture = tmp.join(format!("{name}.capture"));
    let mut cmd = Command::new(bin);
    cmd.args([
        "record",
        "-F",
        &hz.to_string(),
        "-d",
        &format!("{seconds}s"),
    ])
    .args(args)
    .arg("-o")
    .arg(&capture)
    .stderr(Stdio::null());
    let mut proc = Proc::spawn(&mut cmd)?;
    let stats = sampling_window(&proc, seconds)?;
    let maps = map_memory(proc.pid());
    proc.wait_success(Duration::from_secs(seconds) + EXIT_GRACE)?;
    let report = util::output(Command::new(bin).arg("report").arg(&capture).arg("--stats"))?;
    let text = tmp.join(format!("{name}.perf.txt"));
    util::run(
        Command::new(bin)
            .arg("report")
            .arg(&capture)
            .arg("-o")
            .arg(&text),
    )?;
    let text = fs::read_to_string(&text).with_context(|| format!("{}", text.display()))?;
    Ok(Ours {
        stats,
        maps,
        report,
        text,
    })
}

/// BPF run time of `proc`'s programs over its sampling: from their first run (loading and
/// verifying take seconds on a busy host, and the tools' durations count from there) to
/// READ_BEFORE_END seconds before its end.
pub(crate) fn sampling_window(proc: &Proc, seconds: u64) -> Result<ProgStats> {
    let started = std::time::Instant::now();
    let first = loop {
        if let Ok(s) = ProgStats::of(proc) {
            break s;
        }
        anyhow::ensure!(
            started.elapsed() < EXIT_GRACE,
            "its BPF programs did not run within {EXIT_GRACE:?}"
        );
        sleep(Duration::from_millis(200))?;
    };
    sleep(Duration::from_secs(seconds.saturating_sub(READ_BEFORE_END)))?;
    Ok(ProgStats::of(proc)?.since(first))
}

/// `record -p PID --unwind dwarf --unwind-cache off`'s own figure for building the tables
/// of the binaries PID maps ("compiled in X s").
fn build_time(bin: &Path, pid: u32) -> Result<String> {
    let out = Command::new(bin)
        .args([
            "record",
            "-p",
            &pid.to_string(),
            "-d",
            "1s",
            "--unwind",
            "dwarf",
        ])
        .args(["--unwind-cache", "off", "-o", "/dev/null.folded"])
        .stdout(Stdio::null())
        .output()
        .context("running profiler record")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("unwind tables:"))
        .with_context(|| format!("no `unwind tables:` line from profiler record:\n{stderr}"))?;
    Ok(line.trim_start_matches("unwind tables: ").to_owned())
}

/// Memlock bytes of every BPF map `pid` holds, and of the largest array of 8-byte values
/// (UNWIND_ROWS, two 4-byte words each), from /proc/PID/fdinfo.
fn map_memory(pid: u32) -> Option<(u64, u64)> {
    let mut ids = BTreeSet::new();
    let (mut all, mut rows) = (0, 0);
    for fd in fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        if fs::read_link(fd.path()).ok()? != Path::new("anon_inode:bpf-map") {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .ok()?;
        let num = |k| util::field(&info, k).and_then(|v| v.trim().parse::<u64>().ok());
        if !ids.insert(num("map_id")?) {
            continue;
        }
        let memlock = num("memlock").unwrap_or(0);
        all += memlock;
        if num("map_type") == Some(2) && num("value_size") == Some(8) {
            rows = rows.max(memlock);
        }
    }
    Some((all, rows))
}

/// The sum of .eh_frame section sizes of every executable file the workload maps.
fn eh_frame_sizes(workload: &[Proc]) -> (u64, usize) {
    let mut files = BTreeSet::new();
    for p in workload {
        // The shells' children (xz, sqlite3) map what the programs map; their own maps too.
        let mut pids = vec![p.pid()];
        if let Ok(children) = fs::read_to_string(format!("/proc/{0}/task/{0}/children", p.pid())) {
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
        for pid in pids {
            let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            for line in maps.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() >= 6 && f[1].contains('x') && f[5].starts_with('/') {
                    files.insert(f[5].to_owned());
                }
            }
        }
    }
    // xz and sqlite3 may be between runs: add the programs themselves and their libraries.
    for prog in ["/usr/bin/xz", "/usr/bin/sqlite3"] {
        files.insert(prog.to_owned());
        let ldd = util::output(Command::new("ldd").arg(prog)).unwrap_or_default();
        for lib in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
            files.insert(lib.to_owned());
        }
    }
    let mut total = 0;
    for f in &files {
        let sections = util::output(Command::new("readelf").args(["-SW", f])).unwrap_or_default();
        for line in sections.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            // [Nr] Name Type Address Off Size ...: after "]" (or "[ N]" split in two).
            if let Some(i) = w.iter().position(|x| *x == ".eh_frame")
                && let Some(size) = w.get(i + 4).and_then(|s| u64::from_str_radix(s, 16).ok())
            {
                total += size;
            }
        }
    }
    (total, files.len())
}

fn render(m: &Measurement, seconds: u64, build: &str) -> String {
    let mut o = String::new();
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    o += &format!(
        "unwind bench: {seconds} s per tool at {HZ} Hz, whole system, {build} build of the \
         profiler; load average at the end {}\n\n",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    o += "| tool | BPF ns/sample |";
    for p in PROGRAMS {
        o += &format!(" {p} reach entry |");
    }
    o += " lost |\n|---|--:|";
    o += &"--:|".repeat(PROGRAMS.len() + 1);
    o += "\n";
    for r in &m.runs {
        let ns = r.ns_per_sample.map_or("-".into(), |n| format!("{n:.0}"));
        o += &format!("| {} | {ns} |", r.name);
        for p in PROGRAMS {
            o += &match r.reach.get(p) {
                Some((hit, n)) if *n > 0 => format!(" {}% of {n} |", hit * 100 / n),
                _ if r.reach.is_empty() => " - |".into(),
                _ => " 0 samples |".into(),
            };
        }
        o += &format!(" {} |\n", r.lost.map_or("-".into(), |l| l.to_string()));
    }
    o += "\n";
    for r in &m.runs {
        if let Some((all, rows, used)) = r.map_bytes {
            o += &format!(
                "{}: BPF maps {:.1} MiB memlock (unwind rows array {:.1} MiB, allocated whole at load); \
                 rows in use at the end {:.2} MiB\n",
                r.name,
                all as f64 / 1048576.0,
                rows as f64 / 1048576.0,
                used as f64 / 1048576.0
            );
        }
    }
    o += &format!(
        "raw .eh_frame of the {} binaries the workload maps: {:.2} MiB\n",
        m.binaries,
        m.eh_frame_bytes as f64 / 1048576.0
    );
    o += &format!(
        "table build, python3.11's process (no cache): {}\n",
        m.build_python
    );
    o += &format!(
        "table build, sleep + libc + ld.so (no cache): {}\n",
        m.build_libc
    );
    o
}
