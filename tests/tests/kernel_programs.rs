//! The kernel programs on this kernel: every one loads within the verification budget
//! (`profiler check`, the same figures the kernel matrix prints for its kernels), and when the
//! kernel refuses a sampler variant, record, the agent and the doctor load the next simpler
//! one with one line saying what is lost, count it, and go on (docs/kernels.md). Refusals are
//! forced with the `PROFILER_REFUSE` hook; the 5.10 kernel of the matrix refuses for real.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use profiler_tests::{
    Agent, TempDir, exclusive, has_chain, read_folded, report, require_bpf, run_profiler,
    run_profiler_env, samples, spawn_fixture,
};
use serde_json::Value;

/// A quarter of the verifier's limit of 1,000,000 processed instructions: what every program
/// may take, so that a stricter kernel or another compiler's code cannot reach the limit.
const BUDGET: u64 = profiler_common::VERIFIED_INSNS_BUDGET as u64;

/// A bound to catch a hang, not a timing assertion.
const TIMEOUT: Duration = Duration::from_secs(120);

const SAMPLERS: [&str; 4] = ["sample_cpu", "sample_tables", "sample_fp_py", "sample_fp"];

/// Whether this kernel reports verified instructions (bpf_prog_info.verified_insns, 5.16+).
fn kernel_counts_instructions() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release.trim().split(['.', '-']).map(str::parse::<u32>);
    let version = (
        numbers.next().unwrap().unwrap(),
        numbers.next().unwrap().unwrap(),
    );
    version >= (5, 16)
}

#[test]
fn every_program_loads_within_the_verification_budget() {
    if !require_bpf() {
        return;
    }
    let _guard = exclusive();
    let out = run_profiler(&["check", "--json"], TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "profiler check failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checks: Vec<Value> = serde_json::from_str(&stdout).expect("check --json is JSON");
    eprintln!("{stdout}");
    let name = |c: &Value| c["program"].as_str().unwrap_or_default().to_owned();
    let names: Vec<String> = checks.iter().map(name).collect();
    for sampler in SAMPLERS {
        assert!(
            names.iter().any(|n| n == sampler),
            "no {sampler} in {names:?}"
        );
    }
    for c in &checks {
        assert_eq!(c["loaded"], true, "{} refused: {}", name(c), c["refused"]);
        if kernel_counts_instructions() {
            let insns = c["verified_insns"]
                .as_u64()
                .unwrap_or_else(|| panic!("{}: no verified_insns on a 5.16+ kernel", name(c)));
            assert!(
                insns <= BUDGET,
                "{} took {insns} verified instructions, over the budget of {BUDGET}: the \
                 verifier must check each step of a walk once (docs/kernels.md)",
                name(c)
            );
        }
    }
    // The table's text says the same.
    let text = run_profiler(&["check"], TIMEOUT);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("budget: 250000"), "{text}");
    assert!(
        !text.contains("refused") && !text.contains("over the budget"),
        "{text}"
    );
}

/// One forced refusal and what must follow from it.
struct Case {
    refuse: &'static str,
    program: &'static str,
    table_walk: bool,
    python_walk: bool,
    /// The starts of the warning lines, in order.
    lines: &'static [&'static str],
}

const CASES: [Case; 3] = [
    Case {
        refuse: "sample_cpu",
        program: "sample_tables",
        table_walk: true,
        python_walk: false,
        lines: &["no Python frames: the kernel refused the Python walk (sample_cpu: "],
    },
    Case {
        refuse: "sample_cpu,sample_tables",
        program: "sample_fp_py",
        table_walk: false,
        python_walk: true,
        lines: &[
            "stacks by frame pointer only: the kernel refused the table walk (sample_tables: ",
        ],
    },
    Case {
        refuse: "sample_cpu,sample_tables,sample_fp_py",
        program: "sample_fp",
        table_walk: false,
        python_walk: false,
        lines: &[
            "stacks by frame pointer only: the kernel refused the table walk (sample_tables: ",
            "no Python frames: the kernel refused the Python walk (sample_fp_py: ",
        ],
    },
];

/// The warning lines of a run's stderr.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("warning: "))
        .filter(|l| l.starts_with("stacks by") || l.starts_with("no Python frames: the kernel"))
        .collect()
}

#[test]
fn record_falls_back_one_variant_at_a_time_with_a_line_and_a_counter() {
    if !require_bpf() {
        return;
    }
    let _guard = exclusive();
    let _fixture = spawn_fixture(Path::new(env!("FIXTURE_FX_CHAIN")), 120);
    for case in &CASES {
        let dir = TempDir::new("fallback");
        let (capture, folded) = (dir.file("x.capture"), dir.file("x.folded"));
        let out = run_profiler_env(
            &["record", "-d", "2s", "-o", &capture, "-o", &folded],
            &[("PROFILER_REFUSE", case.refuse)],
            TIMEOUT,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "refusing {}: {stderr}", case.refuse);
        let lines = warnings(&stderr);
        assert_eq!(
            lines.len(),
            case.lines.len(),
            "refusing {}: {stderr}",
            case.refuse
        );
        for (line, start) in lines.iter().zip(case.lines) {
            assert!(line.starts_with(start), "refusing {}: {line}", case.refuse);
        }
        // Sampling went on: fx-chain's frame-pointer chain is there.
        let (_, stacks) = read_folded(Path::new(&folded));
        let chained = samples(&stacks, |f| {
            has_chain(f, &["main", "a", "b", "c"], |frame, want| frame == want)
        });
        assert!(
            chained >= 20,
            "refusing {}: {chained} samples of main;a;b;c",
            case.refuse
        );
        let stats = report(&[&capture, "--stats"]);
        let stats = String::from_utf8_lossy(&stats.stdout);
        let refused = case.refuse.split(',').count();
        for want in [
            format!("sampler_programs_refused: {refused}"),
            format!("sampler_table_walk: {}", u8::from(case.table_walk)),
            format!("sampler_python_walk: {}", u8::from(case.python_walk)),
        ] {
            assert!(
                stats.contains(&want),
                "refusing {}: no {want} in\n{stats}",
                case.refuse
            );
        }
        eprintln!(
            "refusing {}: {} loaded, {lines:?}",
            case.refuse, case.program
        );
    }
}

#[test]
fn nothing_loads_is_one_error_naming_the_last_refusal() {
    if !require_bpf() {
        return;
    }
    let _guard = exclusive();
    let dir = TempDir::new("fallback-none");
    let out = run_profiler_env(
        &["record", "-d", "2s", "-o", &dir.file("x.folded")],
        &[("PROFILER_REFUSE", &SAMPLERS.join(","))],
        TIMEOUT,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("sample_fp"), "{stderr}");
}

#[test]
fn the_agent_and_the_doctor_start_on_what_loads() {
    if !require_bpf() {
        return;
    }
    let _guard = exclusive();
    let dir = TempDir::new("fallback-agent");
    let data = dir.file("data");
    let mut agent = Agent::start_env(
        &data,
        &["--window", "2s"],
        &[("PROFILER_REFUSE", "sample_cpu,sample_tables")],
        Stdio::null(),
    );
    let (status, body) = agent.get("/metrics");
    let metrics = String::from_utf8_lossy(&body);
    assert_eq!(status, 200);
    assert!(
        metrics.contains("profiler_sampler_program{program=\"sample_fp_py\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("profiler_sampler_programs_refused 2"),
        "{metrics}"
    );
    assert!(agent.stop().success());

    let out = run_profiler_env(
        &["doctor", "--duration", "2s", "--json", "--unwind", "auto"],
        &[("PROFILER_REFUSE", "sample_tables")],
        TIMEOUT,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    profiler_tests::doctor_findings(&out);
    let lines = warnings(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("stacks by frame pointer only: "),
        "{stderr}"
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("doctor --json is JSON");
    assert!(json.get("verdict").is_some(), "{json}");
}
