//! `profiler report` time-travel outputs on a synthetic capture with a known pattern: CPU 1
//! busy for the first 200 ms of every second (half user, half kernel leaf), CPU 0 idle, 100 Hz,
//! 3 s. Needs no privilege: the capture is written by the library, the real binary renders it.
use std::time::Duration;

use profiler_tests::{TempDir, chromium, expect_success, run_profiler};

#[path = "support/pattern.rs"]
mod pattern;
use pattern::write_pattern_capture;

fn report(args: &[&str]) -> String {
    let out = run_profiler(args, Duration::from_secs(60));
    expect_success(&out, "profiler report");
    String::from_utf8(out.stdout).unwrap()
}

/// The numbers of the flat `"key":[...]` array in the page's embedded JSON.
fn json_numbers(html: &str, key: &str) -> Vec<u64> {
    let start = html.find(&format!("\"{key}\":[")).expect(key) + key.len() + 4;
    let end = start + html[start..].find(']').unwrap();
    html[start..end]
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

#[test]
fn heat_map_page_and_cpu_table_match_the_pattern() {
    let dir = TempDir::new("heatmap");
    let (capture, html) = (dir.file("x.capture"), dir.file("h.html"));
    write_pattern_capture(&capture, "pattern", true);
    let stdout = report(&["report", &capture, "-o", &html, "--cpus"]);

    // The CPU table: 3 seconds, CPU 0 idle, CPU 1 at 20% = 10% usr + 10% sys.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("00:00:0"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    for (sec, row) in rows.iter().enumerate() {
        assert_eq!(
            row[1..],
            [&format!("{sec}s") as &str, "0%", "0/0", "20%", "10/10"],
            "{stdout}"
        );
    }
    assert!(stdout.contains("saturated: none"), "{stdout}");

    let page = std::fs::read_to_string(&html).unwrap();
    // Self-contained: nothing to fetch from the network, no external resources at all.
    for bad in ["http://", "https://", "src=", "href=", "@import", "url("] {
        assert!(!page.contains(bad), "the page contains {bad:?}");
    }
    assert_eq!(json_numbers(&page, "cpus"), [0, 1]);
    assert!(page.contains(r#""first_s":0,"cols":3,"rows":50,"hz":100,"#));
    // The grid, slices in time order (FlameScope row = 49 - slice): the first 200 ms of each
    // second, two samples per 20 ms slice; and the per-CPU strip, CPU 0 then CPU 1.
    let grid = json_numbers(&page, "grid");
    assert_eq!(grid.len(), 150);
    for (i, n) in grid.iter().enumerate() {
        assert_eq!(*n, if i % 50 < 10 { 2 } else { 0 }, "slice {i}");
    }
    assert_eq!(json_numbers(&page, "cpu_busy"), [0, 0, 0, 20, 20, 20]);
    assert_eq!(json_numbers(&page, "cpu_kernel"), [0, 0, 0, 10, 10, 10]);
    // Records [slice bucket, cpu, comm, cgroup, stack, count] at full resolution match too.
    assert!(page.contains(r#""bucket":1,"all_bucket":1,"#));
    let rec = json_numbers(&page, "rec");
    let mut cells = [0u64; 150];
    for r in rec.chunks(6) {
        assert_eq!(r[1], 1, "only CPU 1 is busy: {r:?}");
        cells[r[0] as usize] += r[5];
    }
    assert_eq!(cells[..], grid[..]);
}

#[test]
fn from_to_cut_every_output() {
    let dir = TempDir::new("from-to");
    let capture = dir.file("x.capture");
    write_pattern_capture(&capture, "pattern", true);
    let total = |folded: &str| -> u64 {
        let text = std::fs::read_to_string(folded).unwrap();
        text.lines()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    // 1.0 s..1.1 s: 10 ticks on 2 CPUs, as an offset and as UTC wall-clock time.
    for (from, to) in [("1s", "1100ms"), ("00:00:01", "2026-12-01T00:00:01.100Z")] {
        let (folded, perf) = (dir.file("cut.folded"), dir.file("cut.perf.txt"));
        let stdout = report(&[
            "report", &capture, "--from", from, "--to", to, "-o", &folded, "-o", &perf, "--cpus",
        ]);
        assert_eq!(total(&folded), 20, "--from {from} --to {to}");
        let perf = std::fs::read_to_string(&perf).unwrap();
        let headers: Vec<&str> = perf
            .lines()
            .filter(|l| l.ends_with(" cpu-clock:"))
            .collect();
        assert_eq!(headers.len(), 20);
        assert!(
            headers[0].starts_with("swapper/0 0/0 [000] 1796083201.000000: 1 cpu-clock:"),
            "{}",
            headers[0]
        );
        // One second in the table, CPU 1 at 10 busy samples of 100 expected.
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("00:00:01") && l.contains("10%")),
            "{stdout}"
        );
    }
    let out = run_profiler(
        &["report", &capture, "--from", "2s", "--to", "1s", "--cpus"],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--from must be before --to"));
    // A range past the end of the 3 s capture is an error that says how long it runs, not an
    // empty flame graph.
    let out = run_profiler(
        &[
            "report",
            &capture,
            "--from",
            "5s",
            "-o",
            &dir.file("late.folded"),
        ],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "--from 5s on a 3 s capture succeeded"
    );
    assert!(
        stderr.contains("--from 5s") && stderr.contains("3.0 s") && stderr.contains("00:00:03"),
        "{stderr}"
    );
}

/// Runs headless Chromium on `url` with `extra` flags; returns (stdout, stderr).
fn headless(
    browser: &std::path::Path,
    profile_dir: &str,
    extra: &[&str],
    url: &str,
) -> (String, String) {
    let mut cmd = std::process::Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        &format!("--user-data-dir={profile_dir}"),
    ])
    .args(extra)
    .arg(url)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("start chromium");
    let status = profiler_tests::wait_timeout(&mut child, Duration::from_secs(60));
    let out = child.wait_with_output().expect("chromium output");
    assert!(
        status.is_some_and(|s| s.success()),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The page in a real browser: `#select=1.0-1.2` runs the same selection code as a drag, and
/// the flame graph DOM must hold exactly the samples of 1.0 s..1.2 s (20 busy: 10 user in
/// `spin`, 10 kernel in `clear_page`). A screenshot is kept in tests/artifacts/.
#[test]
fn page_renders_a_selection_in_chromium() {
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("chromium");
    let (capture, html) = (dir.file("x.capture"), dir.file("h.html"));
    write_pattern_capture(&capture, "pattern", true);
    report(&["report", &capture, "-o", &html]);
    let url = format!("file://{html}#select=1.0-1.2");
    let (dom, log) = headless(&browser, &dir.file("chrome"), &["--dump-dom"], &url);
    assert!(!log.contains("Uncaught"), "JavaScript error:\n{log}");
    let frame = |name: &str| -> Vec<u64> {
        let needle = format!("data-name=\"{name}\" data-samples=\"");
        dom.match_indices(&needle)
            .map(|(i, _)| {
                let rest = &dom[i + needle.len()..];
                rest[..rest.find('"').unwrap()].parse().unwrap()
            })
            .collect()
    };
    assert_eq!(frame("all"), [20], "{dom}");
    assert_eq!(frame("busy"), [20]);
    assert_eq!(frame("spin"), [10]);
    assert_eq!(frame("clear_page"), [10]);
    assert!(
        frame("cpuidle_enter").is_empty(),
        "idle samples are not drawn"
    );
    assert!(dom.contains("1.000 s to 1.200 s"), "selection label");
    assert!(
        dom.contains("<td>busy</td><td>20</td><td>100.0</td>"),
        "top processes"
    );

    // Filters (the filtered code paths: records, not the exact grid): CPU 0 is all idle,
    // process `busy` on CPU 1 is everything.
    let filtered = |hash: &str| {
        let url = format!("file://{html}#select=1.0-1.2&{hash}");
        let (dom, log) = headless(&browser, &dir.file("chrome"), &["--dump-dom"], &url);
        assert!(
            !log.contains("Uncaught"),
            "JavaScript error with #{hash}:\n{log}"
        );
        dom
    };
    let dom = filtered("cpu=0");
    assert!(
        dom.contains("data-name=\"all\" data-samples=\"0\""),
        "{dom}"
    );
    assert!(dom.contains("0 busy samples shown"), "{dom}");
    let dom = filtered("cpu=1&comm=busy&cgroup=7");
    assert!(
        dom.contains("data-name=\"clear_page\" data-samples=\"10\""),
        "{dom}"
    );
    assert!(
        dom.contains("60 busy samples shown"),
        "filtered heat map total"
    );

    // 0.2 s..1.0 s holds no busy sample.
    let url = format!("file://{html}#select=0.2-1.0");
    let (dom, _) = headless(&browser, &dir.file("chrome"), &["--dump-dom"], &url);
    assert!(
        dom.contains("data-name=\"all\" data-samples=\"0\""),
        "{dom}"
    );

    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let png = artifacts.join("heatmap.png");
    let _ = std::fs::remove_file(&png);
    let shot = format!("--screenshot={}", png.display());
    headless(
        &browser,
        &dir.file("chrome"),
        &[&shot, "--window-size=1200,900"],
        &format!("file://{html}#select=0.0-1.2"),
    );
    // The picture of the 1200x900 window: the heat map and flame graph in many colours, not one blank
    // background (a page that failed to draw is white or black).
    let bytes =
        std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", png.display()));
    let s = profiler_tests::png_summary(&bytes)
        .unwrap_or_else(|e| panic!("{} does not decode: {e}", png.display()));
    eprintln!("screenshot {}: {s:?}", png.display());
    assert!(
        s.width == 1200 && s.height == 900 && s.colors >= 16 && s.non_background >= 0.05,
        "{}: {s:?}",
        png.display()
    );
}

/// Wall-clock times when clock time is not the offset: a capture starting at
/// 2026-12-01T16:59:58.750Z, so seconds, minutes and the hour roll over inside it and every
/// offset is 0.75 s away from a whole clock second.
#[test]
fn wall_clock_times_from_a_start_that_is_not_midnight() {
    let dir = TempDir::new("wall-clock");
    let capture = dir.file("x.capture");
    let start_s = 1_796_083_200 + 16 * 3600 + 59 * 60 + 58;
    pattern::write_pattern_capture_at(
        &capture,
        "late",
        true,
        start_s * 1_000_000_000 + 750_000_000,
    );

    // Clock-second rows labelled with the second each offset second starts in.
    let stdout = report(&["report", &capture, "--cpus"]);
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("16:") || l.starts_with("17:"))
        .map(|l| l.split_whitespace().take(2).collect())
        .collect();
    assert_eq!(
        rows,
        [["16:59:58", "0s"], ["16:59:59", "1s"], ["17:00:00", "2s"]],
        "{stdout}"
    );

    // 16:59:59.750..16:59:59.850 is offset 1.0 s..1.1 s: the same cut both ways.
    let cut = |from: &str, to: &str, name: &str| {
        let (folded, perf) = (
            dir.file(&format!("{name}.folded")),
            dir.file(&format!("{name}.perf.txt")),
        );
        report(&[
            "report", &capture, "--from", from, "--to", to, "-o", &folded, "-o", &perf,
        ]);
        let folded = std::fs::read_to_string(&folded).unwrap();
        let perf = std::fs::read_to_string(&perf).unwrap();
        (folded, perf)
    };
    let (by_offset, _) = cut("1s", "1100ms", "offset");
    let (by_clock, perf) = cut("16:59:59.750", "2026-12-01T16:59:59.850Z", "clock");
    let total: u64 = by_clock
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 20, "{by_clock}");
    assert_eq!(by_clock, by_offset, "clock and offset cuts differ");
    // perf script times are seconds since the epoch: the first sample of the cut at
    // start + 1.0 s.
    let first = perf.lines().find(|l| l.ends_with(" cpu-clock:")).unwrap();
    assert!(
        first.starts_with(&format!("swapper/0 0/0 [000] {}.750000: ", start_s + 1)),
        "{first}"
    );
    // A clock time 0.5 s before the capture's first sample is refused, not read as offset 0.
    let out = run_profiler(
        &[
            "report",
            &capture,
            "--from",
            "16:59:58.250",
            "-o",
            &dir.file("early.folded"),
        ],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("before the capture started"),
        "--from 0.5 s before the start: {stderr}"
    );

    let out = run_profiler(
        &[
            "report",
            &capture,
            "--from",
            "5s",
            "-o",
            &dir.file("late.folded"),
        ],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "--from 5s on a 3 s capture succeeded"
    );
    assert!(
        stderr.contains("16:59:58") && stderr.contains("17:00:01"),
        "the error names the capture's span in clock time: {stderr}"
    );
}
