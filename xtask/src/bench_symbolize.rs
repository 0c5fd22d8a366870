//! `cargo xtask bench symbolize`: time and peak memory to turn a recording of a varied
//! workload into folded stacks and a flame graph, ours (`profiler report`) against
//! `perf script | inferno-collapse-perf | inferno-flamegraph` on a perf.data of the same
//! workload, duration and frequency. Our capture is symbolized while recording, so that
//! share (printed by `profiler record`) is reported too.

use std::fs::{self, File};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::bench_support::{Proc, catch_ctrl_c, prepare, round, sleep, wait4, write_json};
use crate::setup::Extras;
use crate::util;

/// Target from issue 3: our report at least this many times faster than perf + inferno.
const MIN_SPEEDUP: f64 = 5.0;

/// Each worker loops over programs from different binaries and libraries (find, coreutils,
/// gzip, python): many mappings, many symbols, deep and shallow stacks.
const WORKER: &str = r#"while :; do
  find /usr -xdev -type f -name '*.py' 2>/dev/null | head -3000 | xargs cat 2>/dev/null | gzip -6 | gzip -d | sort | md5sum >/dev/null
  python3 -c 'import json; s = [json.dumps({"k": i, "v": [i] * 5}) for i in range(150000)]; s.sort()'
  ls -lR /usr/lib >/dev/null 2>&1
  seq 1 200000 | sort -R | sort -n | tail -n 1 >/dev/null
done"#;

pub(crate) fn symbolize(seconds: u64, frequency: u64, record_args: &[String]) -> Result<()> {
    let (bin, out_dir) = prepare(Extras {
        bench: true,
        ..Extras::default()
    })?;
    for tool in ["inferno-collapse-perf", "inferno-flamegraph"] {
        ensure!(
            util::which(tool).is_some(),
            "{tool} is not on PATH: run `cargo xtask setup --bench` (cargo install inferno)"
        );
    }
    // perf.data of a million samples is a few hundred MB: kept under target/, not /tmp.
    let work = out_dir.join("symbolize-work");
    fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    catch_ctrl_c();

    println!(
        "recording {seconds} s at {frequency} Hz with the profiler {}, under load",
        record_args.join(" ")
    );
    let capture = work.join("w.capture");
    let record_log = work.join("record.log");
    let load = start_load()?;
    let mut rec = Command::new(&bin);
    rec.args(["record", "-F", &frequency.to_string()])
        .arg("-d")
        .arg(format!("{seconds}s"))
        .arg("-o")
        .arg(&capture)
        .args(record_args)
        .stderr(File::create(&record_log)?);
    let mut rec = Proc::spawn(&mut rec)?;
    // Sampling ends where symbolizing starts: stop the load then, so our symbolization time
    // is measured on idle CPUs, as perf script's is.
    while !fs::read_to_string(&record_log)?.contains("symbolizing ") {
        if rec.wait(Duration::from_millis(1)).is_ok() {
            break; // exited early: wait_success below says why
        }
        sleep(Duration::from_millis(100))?;
    }
    drop(load);
    rec.wait_success(Duration::from_secs(600))?;
    let record_text = fs::read_to_string(&record_log)?;
    let (ours_samples, record_symbolize_s) = parse_symbolized(&record_text)
        .with_context(|| format!("no `symbolized N samples in X s` line in {record_text}"))?;

    println!("recording {seconds} s at {frequency} Hz with perf record -a -g, under load");
    let perf_data = work.join("perf.data");
    let perf_log = work.join("perf-record.log");
    let load = start_load()?;
    let mut rec = Command::new("perf");
    rec.args(["record", "-F", &frequency.to_string(), "-a", "-g", "-o"])
        .arg(&perf_data)
        .args(["--", "sleep", &seconds.to_string()])
        .stderr(File::create(&perf_log)?);
    Proc::spawn(&mut rec)?.wait_success(Duration::from_secs(seconds + 600))?;
    drop(load);
    let perf_text = fs::read_to_string(&perf_log)?;
    let perf_samples = parse_perf_samples(&perf_text)
        .with_context(|| format!("no `(N samples)` in perf record's output: {perf_text}"))?;

    println!("ours: profiler report w.capture -o out.folded -o out.svg");
    let ours = measure(vec![
        Command::new(&bin)
            .arg("report")
            .arg(&capture)
            .arg("-o")
            .arg(work.join("out.folded"))
            .arg("-o")
            .arg(work.join("out.svg"))
            .stderr(Stdio::null()),
    ])?;
    println!("perf: perf script | inferno-collapse-perf | inferno-flamegraph > perf.svg");
    let mut script = Command::new("perf");
    script
        .args(["script", "-i"])
        .arg(&perf_data)
        .stderr(Stdio::null());
    let mut flame = Command::new("inferno-flamegraph");
    flame.stdout(File::create(work.join("perf.svg"))?);
    let perf = measure(vec![
        &mut script,
        &mut Command::new("inferno-collapse-perf"),
        &mut flame,
    ])?;

    let ours_frames = mean_frames(&fs::read_to_string(work.join("out.folded"))?);
    let r = Results {
        seconds,
        frequency,
        record_args: record_args.to_vec(),
        ours_frames,
        ours_samples,
        perf_samples,
        record_symbolize_s,
        ours,
        perf,
    };
    print_table(&r);
    let json = out_dir.join("symbolize.json");
    write_json(&json, &to_json(&r))?;
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// Starts one workload worker per CPU; dropping them kills their process groups.
fn start_load() -> Result<Vec<Group>> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let workers: Vec<Group> = (0..cpus)
        .map(|_| Group::spawn(Command::new("sh").args(["-c", WORKER])))
        .collect::<Result<_>>()?;
    sleep(Duration::from_secs(1))?; // past the first process starts
    Ok(workers)
}

/// A shell and everything it starts, in a process group of its own, killed on drop.
struct Group(Child);

impl Group {
    fn spawn(cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the workload")?;
        Ok(Self(child))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the group we created; the leader is unreaped, so the id is ours.
        unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Wall time, CPU time and peak memory of a command or pipeline.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    wall_s: f64,
    /// User + system, all stages.
    cpu_s: f64,
    /// The largest stage's peak RSS, MiB.
    max_rss_mib: f64,
    /// Peak RSS summed over the stages (they run at the same time), MiB.
    sum_rss_mib: f64,
}

/// Runs `stages` as a pipeline (each one's stdout into the next one's stdin) and measures it
/// with wait4, which reports each stage's own peak RSS and CPU time.
fn measure(stages: Vec<&mut Command>) -> Result<Cost> {
    let start = Instant::now();
    let last = stages.len() - 1;
    let mut children = Vec::new();
    let mut input: Option<Stdio> = None;
    for (i, cmd) in stages.into_iter().enumerate() {
        if let Some(stdin) = input.take() {
            cmd.stdin(stdin);
        }
        if i < last {
            cmd.stdout(Stdio::piped());
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start `{}`", util::display(cmd)))?;
        input = child.stdout.take().map(Stdio::from);
        children.push((util::display(cmd), child));
    }
    let mut cost = Cost::default();
    for (name, child) in children {
        let (ok, usage) = wait4(&child)?;
        ensure!(ok, "`{name}` failed");
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        cost.cpu_s += secs(usage.ru_utime) + secs(usage.ru_stime);
        let rss = usage.ru_maxrss as f64 / 1024.0; // KiB on Linux
        cost.max_rss_mib = cost.max_rss_mib.max(rss);
        cost.sum_rss_mib += rss;
    }
    cost.wall_s = start.elapsed().as_secs_f64();
    Ok(cost)
}

/// From `profiler record`'s stderr: `symbolized N samples in X s`.
fn parse_symbolized(stderr: &str) -> Option<(u64, f64)> {
    let line = stderr.lines().find_map(|l| l.strip_prefix("symbolized "))?;
    let (n, rest) = line.split_once(" samples in ")?;
    Some((n.parse().ok()?, rest.strip_suffix(" s")?.parse().ok()?))
}

/// Sample-weighted mean of frames per stack in folded text (`a;b;c 12` lines).
fn mean_frames(folded: &str) -> f64 {
    let (mut frames, mut samples) = (0.0, 0.0);
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<f64>() else {
            continue;
        };
        frames += count * (stack.matches(';').count() + 1) as f64;
        samples += count;
    }
    if samples > 0.0 { frames / samples } else { 0.0 }
}

/// From `perf record`'s stderr: `[ perf record: Captured and wrote 1.2 MB x (N samples) ]`.
fn parse_perf_samples(stderr: &str) -> Option<u64> {
    let (_, rest) = stderr.rsplit_once('(')?;
    rest.split_once(" samples)")?.0.parse().ok()
}

struct Results {
    seconds: u64,
    frequency: u64,
    /// Extra `record` options of our recording (the bench's `-- ...`).
    record_args: Vec<String>,
    /// Frames per sample in our folded output: deeper stacks cost more to render.
    ours_frames: f64,
    ours_samples: u64,
    perf_samples: u64,
    /// Our symbolization at record time, s.
    record_symbolize_s: f64,
    ours: Cost,
    perf: Cost,
}

impl Results {
    fn speedup(&self) -> f64 {
        self.perf.wall_s / self.ours.wall_s
    }

    /// Counting our record-time symbolization as part of our cost.
    fn speedup_with_record(&self) -> f64 {
        self.perf.wall_s / (self.ours.wall_s + self.record_symbolize_s)
    }
}

fn print_table(r: &Results) {
    println!(
        "\nsymbolize: {} s at {} Hz, every CPU busy",
        r.seconds, r.frequency
    );
    if !r.record_args.is_empty() {
        println!("our record options: {}", r.record_args.join(" "));
    }
    let row = |metric: &str, ours: String, perf: String| {
        println!("{metric:<34} {ours:>14} {perf:>14}");
    };
    row("metric", "ours".into(), "perf+inferno".into());
    row(
        "samples",
        r.ours_samples.to_string(),
        r.perf_samples.to_string(),
    );
    row(
        "frames per sample, mean",
        format!("{:.1}", r.ours_frames),
        "-".into(),
    );
    row(
        "symbolize at record time, s",
        format!("{:.2}", r.record_symbolize_s),
        "-".into(),
    );
    row(
        "folded + svg, wall s",
        format!("{:.2}", r.ours.wall_s),
        format!("{:.2}", r.perf.wall_s),
    );
    row(
        "folded + svg, CPU s",
        format!("{:.2}", r.ours.cpu_s),
        format!("{:.2}", r.perf.cpu_s),
    );
    row(
        "peak RSS, largest process, MiB",
        format!("{:.0}", r.ours.max_rss_mib),
        format!("{:.0}", r.perf.max_rss_mib),
    );
    row(
        "peak RSS, all stages, MiB",
        format!("{:.0}", r.ours.sum_rss_mib),
        format!("{:.0}", r.perf.sum_rss_mib),
    );
    let met = if r.speedup() >= MIN_SPEEDUP {
        "met"
    } else {
        "NOT met"
    };
    println!(
        "speedup {:.1}x (target >= {MIN_SPEEDUP}x: {met}); {:.1}x counting record-time symbolization",
        r.speedup(),
        r.speedup_with_record()
    );
}

fn to_json(r: &Results) -> serde_json::Value {
    let cost = |c: &Cost| {
        json!({"wall_s": round(c.wall_s, 3), "cpu_s": round(c.cpu_s, 3),
               "max_rss_mib": round(c.max_rss_mib, 1), "sum_rss_mib": round(c.sum_rss_mib, 1)})
    };
    json!({
        "seconds": r.seconds,
        "frequency_hz": r.frequency,
        "record_args": r.record_args,
        "ours_frames_per_sample": round(r.ours_frames, 2),
        "ours_samples": r.ours_samples,
        "perf_samples": r.perf_samples,
        "record_symbolize_s": round(r.record_symbolize_s, 3),
        "ours_report": cost(&r.ours),
        "perf_script_inferno": cost(&r.perf),
        "speedup": round(r.speedup(), 2),
        "speedup_with_record_symbolize": round(r.speedup_with_record(), 2),
        "target_speedup": MIN_SPEEDUP,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sample_counts() {
        assert_eq!(
            parse_symbolized("recorded 5 samples\nsymbolized 1048576 samples in 2.125 s\n"),
            Some((1048576, 2.125))
        );
        assert_eq!(
            parse_perf_samples(
                "[ perf record: Woken up 9 times to write data ]\n\
                 [ perf record: Captured and wrote 312.5 MB perf.data (1101234 samples) ]\n"
            ),
            Some(1101234)
        );
        assert_eq!(parse_perf_samples("nothing"), None);
        assert!((mean_frames("a;b;c 3\na 1\nbad line\n") - 2.5).abs() < 1e-9);
    }
}
