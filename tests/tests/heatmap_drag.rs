//! The heat map page in a real browser, used the way a person uses it: Playwright drives
//! Debian's Chromium (tests/browser/drag.mjs), drags the mouse over the busy cells of the heat
//! map and reads the flame graph back from the DOM. The page is opened from disk and must make
//! no network request; the screenshot is kept as tests/artifacts/heatmap-drag.png.
//!
//! The capture is synthetic and deterministic: process `busy` runs `main;spin` on CPU 1 for
//! the first 200 ms of every second of 3 s at 100 Hz; CPU 0 and the rest of CPU 1 are idle.
//! Needs node, npm (for `npm ci` if tests/browser/node_modules is missing) and chromium:
//! `cargo xtask setup --tests` installs them. Without them the test is skipped, but under
//! CI=true it fails.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::{TempDir, chromium, expect_success, run_profiler, tool, wait_timeout};

#[path = "support/pattern.rs"]
mod pattern;

/// Runs `cmd` to completion within `timeout`; returns (success, stdout, stderr).
fn run(cmd: &mut Command, what: &str, timeout: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let status = wait_timeout(&mut child, timeout);
    let out = child.wait_with_output().expect("collect output");
    (
        status.is_some_and(|s| s.success()),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Chromium, with node and tests/browser/node_modules (installed with `npm ci` from the lock
/// file if missing), or None after `cannot_run`.
fn browser_tools(browser_dir: &Path) -> Option<PathBuf> {
    tool("node", "nodejs")?;
    let chromium = chromium()?;
    if browser_dir.join("node_modules/playwright-core").is_dir() {
        return Some(chromium);
    }
    tool("npm", "npm")?;
    let (ok, stdout, stderr) = run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(browser_dir),
        "npm ci",
        Duration::from_secs(300),
    );
    assert!(ok, "`npm ci` in tests/browser failed:\n{stdout}\n{stderr}");
    Some(chromium)
}

#[test]
fn dragging_over_the_heat_map_renders_the_flame_graph() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let browser_dir = root.join("browser");
    let Some(chromium) = browser_tools(&browser_dir) else {
        return;
    };
    let dir = TempDir::new("heatmap-drag");
    let (capture, html) = (dir.file("x.capture"), dir.file("h.html"));
    pattern::write_pattern_capture(&capture, "drag", false);
    let out = run_profiler(&["report", &capture, "-o", &html], Duration::from_secs(60));
    expect_success(&out, "profiler report");

    let artifacts = root.join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let png = artifacts.join("heatmap-drag.png");
    let _ = std::fs::remove_file(&png);

    // 3 columns (seconds) of 50 rows (20 ms slices, the end of the second at the top): the
    // middle column from its bottom row (1.00 s) up to row 40 of 50 (slice 1.18-1.20 s), i.e.
    // exactly the 200 ms burst of second 1: 20 samples, all `main;spin`.
    let (ok, stdout, stderr) = run(
        Command::new("node")
            .arg(browser_dir.join("drag.mjs"))
            .args([html.as_str(), png.to_str().unwrap(), "main", "spin", "busy"])
            .args(["--from", "0.5,0.99", "--to", "0.5,0.81"])
            .arg("--chromium")
            .arg(&chromium),
        "node tests/browser/drag.mjs",
        Duration::from_secs(120),
    );
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    let result: serde_json::Value = match line.map(serde_json::from_str) {
        Some(Ok(v)) => v,
        _ => panic!("drag.mjs printed no JSON result:\n{stdout}\n{stderr}"),
    };
    assert!(ok, "drag.mjs failed: {result:#}\n{stderr}");
    assert_eq!(result["ok"], true, "{result:#}");
    assert_eq!(result["requests"], serde_json::json!([]), "{result:#}");
    assert_eq!(result["errors"], serde_json::json!([]), "{result:#}");

    // Exactly the dragged range's samples, and nothing idle.
    let frames = &result["frames"];
    for (name, n) in [("all", 20), ("busy", 20), ("main", 20), ("spin", 20)] {
        assert_eq!(frames[name], n, "frame {name}: {result:#}");
    }
    assert!(frames.get("cpuidle_enter").is_none(), "{result:#}");
    let label = result["label_after"].as_str().unwrap_or_default();
    assert!(
        label.starts_with("1.000 s to 1.200 s") && label.contains("20 samples"),
        "selection label {label:?}"
    );
    assert_ne!(result["label_before"], result["label_after"]);
    assert_eq!(result["hash"], "#select=1.000-1.200", "{result:#}");
    assert_eq!(
        result["top"],
        serde_json::json!([["busy", "20", "100.0"]]),
        "{result:#}"
    );
    // The picture of the 1200-wide viewport, the full page tall: the heat map and flame graph in many colours, not one blank
    // background (a page that failed to draw is white or black).
    let bytes =
        std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", png.display()));
    let s = profiler_tests::png_summary(&bytes)
        .unwrap_or_else(|e| panic!("{} does not decode: {e}", png.display()));
    eprintln!("screenshot {}: {s:?}", png.display());
    assert!(
        s.width == 1200 && s.height >= 900 && s.colors >= 16 && s.non_background >= 0.05,
        "{}: {s:?}",
        png.display()
    );
}
