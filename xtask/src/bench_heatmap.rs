//! `cargo xtask bench heatmap`: the heat-map page (`.html`) at scale and in a browser.
//!
//! 1. A synthetic capture the size of an hour at 99 Hz on 64 CPUs (22.8M samples, written by
//!    `profiler-lab synth`, tests/src/lab): wall time, CPU time and peak RSS of
//!    `profiler report big.capture -o big.html`, and the page's size.
//! 2. A real capture of this machine (`profiler record -d 60s`): the same for its page.
//! 3. Both pages in headless Chromium (`--dump-dom`): wall time, raw and minus the time of an
//!    empty page (browser start-up and teardown), checking that the page drew its heat map.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::bench_support::{Proc, catch_ctrl_c, prepare, round, wait4, write_json};
use crate::setup::Extras;
use crate::util;

/// Chromium runs per page; the median is reported.
const BROWSER_RUNS: usize = 3;
/// What the page writes into `#summary` once it has drawn the heat map.
const RENDERED: &str = "busy samples shown";

pub(crate) struct Options {
    pub hours: f64,
    pub cpus: u32,
    pub hz: u32,
    /// Length of the real recording.
    pub seconds: u64,
}

pub(crate) fn heatmap(opts: &Options) -> Result<()> {
    let (bin, out_dir) = prepare(Extras {
        tests: true, // chromium
        ..Extras::default()
    })?;
    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| util::which(name))
        .context("chromium not found: run `cargo xtask setup --tests`")?;
    // The synthetic capture is a few hundred MB: under target/, not /tmp.
    let work = out_dir.join("heatmap-work");
    fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    catch_ctrl_c();
    let result = measure(opts, &bin, &browser, &work);
    let _ = fs::remove_dir_all(&work);
    let r = result?;
    print_table(&r);
    let json = out_dir.join("heatmap.json");
    write_json(&json, &to_json(&r))?;
    Ok(())
}

/// Wall time, CPU time and peak RSS of one child process.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    wall_s: f64,
    cpu_s: f64,
    max_rss_mib: f64,
}

/// One page: how it was made, how big it is, how long Chromium takes on it.
#[derive(Clone, Debug, Default)]
struct Page {
    samples: u64,
    capture_bytes: u64,
    report: Cost,
    html_bytes: u64,
    /// Median `--dump-dom` wall time, s, and every run's.
    browser_s: f64,
    browser_runs: Vec<f64>,
    /// `#summary` as the browser left it.
    summary: String,
}

struct Results {
    hours: f64,
    cpus: u32,
    hz: u32,
    seconds: u64,
    host_cpus: usize,
    /// Synthesizing the big capture (not part of the result).
    synth: Cost,
    big: Page,
    real: Page,
    /// Median `--dump-dom` wall time of an empty page, s, and every run's.
    empty_s: f64,
    empty_runs: Vec<f64>,
    /// /proc/loadavg (1 min) before the run and before each timed step.
    loads: Vec<(String, f64)>,
}

fn measure(opts: &Options, bin: &Path, browser: &Path, work: &Path) -> Result<Results> {
    let mut loads = vec![("start".to_owned(), load1())];
    let seconds = (opts.hours * 3600.0).round() as u64;
    ensure!(seconds > 0, "--hours gives less than a second");
    let big_capture = work.join("big.capture");
    println!(
        "synthesizing {seconds} s at {} Hz on {} CPUs ({} samples)",
        opts.hz,
        opts.cpus,
        seconds * u64::from(opts.hz) * u64::from(opts.cpus)
    );
    let (synth, synth_out) = timed(
        Command::new(crate::lab::build(true)?)
            .args(["synth", "--cpus", &opts.cpus.to_string()])
            .args(["--hz", &opts.hz.to_string()])
            .args(["--seconds", &seconds.to_string(), "-o"])
            .arg(&big_capture),
    )?;
    print!("{synth_out}");
    let mut big = Page {
        samples: stat(bin, &big_capture)?,
        capture_bytes: size(&big_capture)?,
        ..Page::default()
    };
    let big_html = work.join("big.html");
    println!("profiler report big.capture -o big.html");
    loads.push(("report big".into(), load1()));
    big.report = report(bin, &big_capture, &big_html)?;
    big.html_bytes = size(&big_html)?;

    println!("recording this machine for {} s", opts.seconds);
    let real_capture = work.join("real.capture");
    let mut rec = Command::new(bin);
    rec.args(["record", "-d", &format!("{}s", opts.seconds), "-o"])
        .arg(&real_capture)
        .stderr(Stdio::null());
    Proc::spawn(&mut rec)?.wait_success(Duration::from_secs(opts.seconds + 600))?;
    let mut real = Page {
        samples: stat(bin, &real_capture)?,
        capture_bytes: size(&real_capture)?,
        ..Page::default()
    };
    let real_html = work.join("real.html");
    println!("profiler report real.capture -o real.html");
    loads.push(("report real".into(), load1()));
    real.report = report(bin, &real_capture, &real_html)?;
    real.html_bytes = size(&real_html)?;

    println!("chromium --headless --dump-dom: empty page, real.html, big.html");
    let empty = work.join("empty.html");
    fs::write(
        &empty,
        "<!doctype html><html><head><title>empty</title></head><body></body></html>\n",
    )?;
    let profile_dir = work.join("chromium-profile");
    // The first start creates the profile directory: not timed.
    dump_dom(browser, &profile_dir, &empty)?;
    loads.push(("chromium".into(), load1()));
    let mut empty_runs = Vec::new();
    for _ in 0..BROWSER_RUNS {
        empty_runs.push(dump_dom(browser, &profile_dir, &empty)?.0);
    }
    for (page, html) in [(&mut real, &real_html), (&mut big, &big_html)] {
        for _ in 0..BROWSER_RUNS {
            let (secs, dom) = dump_dom(browser, &profile_dir, html)?;
            page.summary = summary(&dom).with_context(|| {
                format!(
                    "{} did not draw its heat map (no `{RENDERED}` in #summary of the dumped DOM)",
                    html.display()
                )
            })?;
            page.browser_runs.push(secs);
        }
        page.browser_s = median(&page.browser_runs);
    }
    Ok(Results {
        hours: opts.hours,
        cpus: opts.cpus,
        hz: opts.hz,
        seconds: opts.seconds,
        host_cpus: thread::available_parallelism().map_or(1, usize::from),
        synth,
        big,
        real,
        empty_s: median(&empty_runs),
        empty_runs,
        loads,
    })
}

fn size(path: &Path) -> Result<u64> {
    Ok(fs::metadata(path)
        .with_context(|| format!("{} was not written", path.display()))?
        .len())
}

/// Samples in a capture, from `profiler report --stats`.
fn stat(bin: &Path, capture: &Path) -> Result<u64> {
    let text = util::output(Command::new(bin).arg("report").arg(capture).arg("--stats"))?;
    util::field(&text, "samples")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no `samples:` line in {text}"))
}

fn report(bin: &Path, capture: &Path, html: &Path) -> Result<Cost> {
    let (cost, _) = timed(
        Command::new(bin)
            .arg("report")
            .arg(capture)
            .arg("-o")
            .arg(html),
    )?;
    Ok(cost)
}

/// Runs `cmd` to completion; its cost (wait4: its own CPU time and peak RSS) and stdout.
fn timed(cmd: &mut Command) -> Result<(Cost, String)> {
    let name = util::display(cmd);
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{name}`"))?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        std::io::Read::read_to_string(&mut stdout, &mut out)?;
    }
    let (ok, usage) = wait4(&child)?;
    let wall_s = start.elapsed().as_secs_f64();
    ensure!(ok, "`{name}` failed; see its messages above");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        Cost {
            wall_s,
            cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
            max_rss_mib: usage.ru_maxrss as f64 / 1024.0, // KiB on Linux
        },
        out,
    ))
}

/// Headless Chromium on `html` with networking off; its wall time, s, and the dumped DOM.
fn dump_dom(browser: &Path, profile_dir: &Path, html: &Path) -> Result<(f64, String)> {
    let dom_file = html.with_extension("dom");
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ])
    .arg(format!("--user-data-dir={}", profile_dir.display()))
    .arg("--dump-dom")
    .arg(format!("file://{}", html.display()))
    .stdin(Stdio::null())
    .stdout(File::create(&dom_file)?)
    .stderr(Stdio::null());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{}`", util::display(&cmd)))?;
    let limit = Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "chromium did not finish {} within {limit:?}; killed it",
                html.display()
            );
        }
        thread::sleep(Duration::from_millis(5));
    };
    let secs = start.elapsed().as_secs_f64();
    ensure!(
        status.success(),
        "chromium failed on {} ({status})",
        html.display()
    );
    let dom = fs::read_to_string(&dom_file)?;
    Ok((secs, dom))
}

/// The text of `<span id="summary">` if it says the heat map was drawn.
fn summary(dom: &str) -> Option<String> {
    let open = r#"<span id="summary">"#;
    let start = dom.find(open)? + open.len();
    let text = &dom[start..start + dom[start..].find('<')?];
    text.contains(RENDERED).then(|| text.to_owned())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

fn load1() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

fn print_table(r: &Results) {
    println!(
        "\nheatmap: synthetic {} h at {} Hz on {} CPUs; real {} s of this host ({} CPUs)",
        r.hours, r.hz, r.cpus, r.seconds, r.host_cpus
    );
    println!(
        "synthesized in {:.1} s ({:.0} MiB peak RSS; not part of the result)",
        r.synth.wall_s, r.synth.max_rss_mib
    );
    let row = |metric: &str, big: String, real: String| {
        println!("{metric:<36} {big:>16} {real:>16}");
    };
    let (b, l) = (&r.big, &r.real);
    row("metric", "synthetic".into(), "real".into());
    row("samples", b.samples.to_string(), l.samples.to_string());
    row("capture, MiB", mib(b.capture_bytes), mib(l.capture_bytes));
    let f2 = |v: f64| format!("{v:.2}");
    row(
        "report -o .html, wall s",
        f2(b.report.wall_s),
        f2(l.report.wall_s),
    );
    row(
        "report -o .html, CPU s",
        f2(b.report.cpu_s),
        f2(l.report.cpu_s),
    );
    row(
        "report -o .html, peak RSS MiB",
        format!("{:.0}", b.report.max_rss_mib),
        format!("{:.0}", l.report.max_rss_mib),
    );
    row(
        "HTML, bytes",
        b.html_bytes.to_string(),
        l.html_bytes.to_string(),
    );
    row("HTML, MiB", mib(b.html_bytes), mib(l.html_bytes));
    row(
        "chromium --dump-dom, s (median)",
        f2(b.browser_s),
        f2(l.browser_s),
    );
    row(
        "  minus empty page, s",
        f2(b.browser_s - r.empty_s),
        f2(l.browser_s - r.empty_s),
    );
    let runs = |v: &[f64]| {
        v.iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "chromium runs, s: empty [{}], real [{}], synthetic [{}]",
        runs(&r.empty_runs),
        runs(&l.browser_runs),
        runs(&b.browser_runs)
    );
    println!(
        "page summary: real \"{}\"; synthetic \"{}\"",
        l.summary, b.summary
    );
    let loads: Vec<String> = r.loads.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
    println!("load average (1 min) before: {}", loads.join(", "));
}

fn to_json(r: &Results) -> serde_json::Value {
    let cost = |c: &Cost| {
        json!({"wall_s": round(c.wall_s, 3), "cpu_s": round(c.cpu_s, 3),
               "max_rss_mib": round(c.max_rss_mib, 1)})
    };
    let list = |v: &[f64]| v.iter().map(|s| round(*s, 3)).collect::<Vec<f64>>();
    let page = |p: &Page| {
        json!({
            "samples": p.samples,
            "capture_bytes": p.capture_bytes,
            "report": cost(&p.report),
            "html_bytes": p.html_bytes,
            "chromium_s": round(p.browser_s, 3),
            "chromium_minus_empty_s": round(p.browser_s - r.empty_s, 3),
            "chromium_runs_s": list(&p.browser_runs),
            "summary": p.summary,
        })
    };
    let loads: serde_json::Map<String, serde_json::Value> = (r.loads.iter())
        .map(|(k, v)| (k.clone(), json!(round(*v, 2))))
        .collect();
    json!({
        "synthetic": {"hours": r.hours, "cpus": r.cpus, "hz": r.hz},
        "real_seconds": r.seconds,
        "host_cpus": r.host_cpus,
        "synthesize": cost(&r.synth),
        "big": page(&r.big),
        "real": page(&r.real),
        "chromium_empty_s": round(r.empty_s, 3),
        "chromium_empty_runs_s": list(&r.empty_runs),
        "load1_before": loads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_only_when_drawn() {
        let dom = r#"<div><span id="summary">12 busy samples shown; max 3 per cell</span></div>"#;
        assert_eq!(
            summary(dom).as_deref(),
            Some("12 busy samples shown; max 3 per cell")
        );
        assert_eq!(summary(r#"<span id="summary"></span>"#), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
