//! Reads what a kernel's boot printed on the serial console (the MATRIX lines of init.sh) and
//! judges it: every smoke test passed, a sampler program loaded within the verifier budget,
//! and the broken program was rejected by the verifier with its complaint in the report.

use std::fmt::Write as _;

use profiler_common::program;

/// The suite's test that loads every BPF program of the object without attaching anything
/// (`profiler check --json`); init.sh turns its JSON into one `MATRIX-INFO verified` line per
/// program (`Verified`).
pub(super) const CHECK_TEST: &str = "check";

/// The most instructions the verifier may process for any program a kernel loads
/// (`verified_insns`, reported by Linux 5.16+): profiler-common's, as `profiler check` and the
/// tests use it.
pub(super) const VERIFIED_INSNS_BUDGET: u64 = profiler_common::VERIFIED_INSNS_BUDGET as u64;

/// The sampler variants (profiler::bpf::variant): on every kernel at least one must load.
const SAMPLERS: [&str; 4] = [
    program::FULL,
    program::TABLES,
    program::FP_PYTHON,
    program::FP,
];

/// The `MATRIX-INFO` key of `profiler check`'s figures.
const VERIFIED_KEY: &str = "verified";

/// One test's result as the guest reported it.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub test: String,
    pub passed: bool,
    pub detail: String,
    /// The failed command's stderr (a rejected program's verifier log is here).
    pub log: Vec<String>,
}

/// Everything one boot reported.
#[derive(Debug, Default)]
pub(super) struct Boot {
    /// `MATRIX-INFO key value` lines, in order.
    pub info: Vec<(String, String)>,
    pub outcomes: Vec<Outcome>,
    /// The guest reached the end of its suite (no hang, no panic on the way).
    pub ended: bool,
}

/// One program as `profiler check` loaded it, from the guest's
/// `MATRIX-INFO verified PROGRAM INSNS|- LOAD_MS loaded|refused: REASON`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Verified {
    pub program: String,
    /// Instructions the verifier processed; None when the kernel does not say (before 5.16)
    /// or the program was refused.
    pub insns: Option<u64>,
    /// Milliseconds the load took, as the guest printed it ("-" when unknown).
    pub load_ms: String,
    /// None: loaded. Some: the kernel's one-line reason for refusing it.
    pub refused: Option<String>,
}

impl Verified {
    fn parse(value: &str) -> Option<Self> {
        let mut words = value.splitn(4, ' ');
        let program = words.next()?.to_owned();
        let insns = match words.next()? {
            "-" => None,
            n => Some(n.parse().ok()?),
        };
        let load_ms = words.next()?.to_owned();
        let refused = match words.next()? {
            "loaded" => None,
            state => Some(state.strip_prefix("refused:")?.trim().to_owned()),
        };
        Some(Self {
            program,
            insns,
            load_ms,
            refused,
        })
    }

    /// Its cell in the tables: the instructions, `-` when loaded but not counted, `refused`.
    fn cell(&self) -> String {
        match (&self.refused, self.insns) {
            (Some(_), _) => "refused".to_owned(),
            (None, Some(n)) => n.to_string(),
            (None, None) => "-".to_owned(),
        }
    }
}

impl Boot {
    /// `profiler check`'s figures, each line parsed, or the line that could not be.
    pub(super) fn verified(&self) -> Vec<Result<Verified, String>> {
        self.info
            .iter()
            .filter(|(key, _)| key == VERIFIED_KEY)
            .map(|(_, value)| Verified::parse(value).ok_or_else(|| value.clone()))
            .collect()
    }
}

/// Parses the serial output. Lines may end in \r (the serial port's line discipline) and
/// kernel messages may come between them; anything that is not a MATRIX line is skipped.
pub(super) fn parse(serial: &str) -> Boot {
    let mut boot = Boot::default();
    for line in serial.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(rest) = line.strip_prefix("MATRIX-INFO ") {
            let (key, value) = rest.split_once(' ').unwrap_or((rest, ""));
            boot.info.push((key.to_owned(), value.to_owned()));
        } else if let Some(rest) = line.strip_prefix("MATRIX-LOG ") {
            let (test, text) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(o) = boot.outcomes.iter_mut().rev().find(|o| o.test == test) {
                o.log.push(text.to_owned());
            }
        } else if line == "MATRIX-END" {
            boot.ended = true;
        } else if let Some(rest) = line.strip_prefix("MATRIX ") {
            let mut words = rest.splitn(3, ' ');
            let test = words.next().unwrap_or_default().to_owned();
            let passed = words.next() == Some("PASS");
            let detail = words.next().unwrap_or_default().to_owned();
            boot.outcomes.push(Outcome {
                test,
                passed,
                detail,
                log: Vec::new(),
            });
        }
    }
    boot
}

/// What a test shows about which BPF programs this kernel accepted.
pub(super) fn programs_of(test: &str) -> &'static str {
    match test {
        // Which sampler variant loaded is the kernel's choice; `check` names them all.
        t if t.starts_with("record") => "a sampler",
        "agent" => "a sampler",
        "runq" => "runq_switch",
        "doctor" | "doctor-v2" | "crashloop-v2" => "a sampler, churn_mkdir, churn_rmdir",
        _ => "",
    }
}

/// The verifier's words for the broken program's unbounded loop (which one depends on how
/// far the kernel's verifier gets before it gives up).
pub(super) const BROKEN_COMPLAINTS: &[&str] = &[
    "infinite loop detected",
    "back-edge from insn",
    "BPF program is too large",
    "too complex",
];

/// Judges one boot: returns the report text and the problems (empty = as expected).
/// `expected` are the tests that must pass; `broken` whether the broken build was inside.
pub(super) fn judge(
    label: &str,
    boot: &Boot,
    expected: &[String],
    broken: bool,
) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut problems = Vec::new();
    let _ = writeln!(text, "== {label}");
    // Each record says the same features and warnings: once is enough.
    let mut said: Vec<&(String, String)> = Vec::new();
    for info in boot.info.iter().filter(|(key, _)| key != VERIFIED_KEY) {
        if !said.contains(&info) {
            let _ = writeln!(text, "   {}: {}", info.0, info.1);
            said.push(info);
        }
    }
    if expected.iter().any(|t| t == CHECK_TEST) {
        problems.extend(judge_verified(label, boot, &mut text));
    }
    let mut loaded: Vec<&str> = Vec::new();
    for o in boot.outcomes.iter().filter(|o| o.passed) {
        for program in programs_of(&o.test).split(", ").filter(|p| !p.is_empty()) {
            if !loaded.contains(&program) {
                loaded.push(program);
            }
        }
    }
    let _ = writeln!(text, "   loaded: {}", list_or_none(&loaded));
    for o in &boot.outcomes {
        let expect_fail = o.test == "broken";
        let verdict = match (o.passed, expect_fail) {
            (true, false) => "PASS",
            (false, true) => "REJECTED (expected)",
            (true, true) => "LOADED (must be rejected)",
            (false, false) => "FAIL",
        };
        let _ = writeln!(text, "   {verdict:<19} {:<14} {}", o.test, o.detail);
        if !o.passed {
            // The verifier's log: its last lines say why (the whole log is in the serial log).
            let tail = o.log.len().saturating_sub(12);
            for line in &o.log[tail..] {
                let _ = writeln!(text, "{:23}| {line}", "");
            }
        }
        if o.passed == expect_fail {
            problems.push(format!("{label}: {} {}", o.test, verdict.to_lowercase()));
        }
        if expect_fail && !o.passed {
            let said = |s: &str| o.detail.contains(s) || o.log.iter().any(|l| l.contains(s));
            if !BROKEN_COMPLAINTS.iter().any(|c| said(c)) {
                problems.push(format!(
                    "{label}: the broken program's rejection carries no verifier complaint \
                     (none of {BROKEN_COMPLAINTS:?})"
                ));
            }
        }
    }
    let mut wanted: Vec<&str> = expected.iter().map(String::as_str).collect();
    if broken {
        wanted.push("broken");
    }
    for test in wanted {
        if !boot.outcomes.iter().any(|o| o.test == test) {
            problems.push(format!("{label}: {test} did not report"));
        }
    }
    if !boot.ended {
        problems.push(format!(
            "{label}: the guest did not finish its suite (hang or panic: see the serial log)"
        ));
    }
    (text, problems)
}

/// Prints `profiler check`'s figures as a table and returns the problems: a loaded program
/// over `VERIFIED_INSNS_BUDGET`, no sampler loaded, a line that cannot be read.
fn judge_verified(label: &str, boot: &Boot, text: &mut String) -> Vec<String> {
    let mut problems = Vec::new();
    let _ = writeln!(
        text,
        "   verified by `profiler check` (budget {VERIFIED_INSNS_BUDGET} instructions):"
    );
    let _ = writeln!(
        text,
        "     {:<16} {:>9} {:>8}",
        "program", "insns", "load ms"
    );
    let mut sampler_loaded = false;
    for v in boot.verified() {
        let v = match v {
            Ok(v) => v,
            Err(line) => {
                problems.push(format!("{label}: unreadable `verified` line: {line}"));
                continue;
            }
        };
        let state = match &v.refused {
            None => "loaded".to_owned(),
            Some(reason) => format!("refused: {reason}"),
        };
        let _ = writeln!(
            text,
            "     {:<16} {:>9} {:>8}  {state}",
            v.program,
            v.insns.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            v.load_ms
        );
        if v.refused.is_none() {
            sampler_loaded |= SAMPLERS.contains(&v.program.as_str());
            if let Some(n) = v.insns.filter(|&n| n > VERIFIED_INSNS_BUDGET) {
                problems.push(format!(
                    "{label}: {} needs {n} verified instructions, over the budget of \
                     {VERIFIED_INSNS_BUDGET}",
                    v.program
                ));
            }
        }
    }
    if !sampler_loaded {
        problems.push(format!(
            "{label}: `profiler check` loaded no sampler program (none of {})",
            SAMPLERS.join(", ")
        ));
    }
    problems
}

/// Every program's verified instructions on every kernel (`-`: loaded, not counted by that
/// kernel; `refused`: not loaded; blank: not reported), one row per program; empty when no
/// kernel reported any.
pub(super) fn verified_table(boots: &[(&str, Boot)]) -> String {
    let mut programs: Vec<String> = Vec::new();
    for (_, boot) in boots {
        for v in boot.verified().into_iter().flatten() {
            if !programs.contains(&v.program) {
                programs.push(v.program);
            }
        }
    }
    if programs.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "== verified instructions per program (`profiler check`; budget \
         {VERIFIED_INSNS_BUDGET}; -: loaded, the kernel does not count them)\n"
    );
    let _ = write!(text, "   {:<16}", "program");
    for (name, _) in boots {
        let _ = write!(text, " {name:>9}");
    }
    text.push('\n');
    for program in &programs {
        let _ = write!(text, "   {program:<16}");
        for (_, boot) in boots {
            let cell = boot
                .verified()
                .into_iter()
                .flatten()
                .find(|v| &v.program == program)
                .map(|v| v.cell())
                .unwrap_or_default();
            let _ = write!(text, " {cell:>9}");
        }
        text.push('\n');
    }
    text
}

fn list_or_none(items: &[&str]) -> String {
    if items.is_empty() {
        "nothing".to_owned()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERIAL: &str = "[    0.000000] Linux version 6.1.0\r\n\
        MATRIX-INFO kernel 6.1.0-57-cloud-amd64\r\n\
        MATRIX record-fp PASS 12 stacks, main;a;b;c found\r\n\
        [    3.1] random kernel line\r\n\
        MATRIX doctor FAIL error: cannot start\r\n\
        MATRIX-LOG doctor first line\r\n\
        MATRIX broken FAIL the kernel's verifier rejected sample_cpu\r\n\
        MATRIX-LOG broken 12: (05) goto pc-3\r\n\
        MATRIX-LOG broken infinite loop detected at insn 10\r\n\
        MATRIX-END\r\n";

    fn expected(tests: &[&str]) -> Vec<String> {
        tests.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn serial_lines_become_outcomes_with_their_logs() {
        let boot = parse(SERIAL);
        assert!(boot.ended);
        assert_eq!(
            boot.info,
            [("kernel".into(), "6.1.0-57-cloud-amd64".into())]
        );
        let tests: Vec<(&str, bool)> = boot
            .outcomes
            .iter()
            .map(|o| (o.test.as_str(), o.passed))
            .collect();
        assert_eq!(
            tests,
            [("record-fp", true), ("doctor", false), ("broken", false)]
        );
        assert_eq!(boot.outcomes[1].log, ["first line"]);
        assert_eq!(boot.outcomes[2].log.len(), 2);
    }

    #[test]
    fn a_failed_test_and_a_missing_one_are_problems_the_broken_rejection_is_not() {
        let boot = parse(SERIAL);
        let (text, problems) = judge(
            "6.1",
            &boot,
            &expected(&["record-fp", "doctor", "agent"]),
            true,
        );
        assert_eq!(
            problems,
            ["6.1: doctor fail", "6.1: agent did not report"],
            "{text}"
        );
        assert!(text.contains("infinite loop detected"), "{text}");
        assert!(text.contains("loaded: a sampler\n"), "{text}");
    }

    #[test]
    fn a_rejection_without_the_verifier_complaint_is_a_problem() {
        let boot = parse("MATRIX broken FAIL error: something else\nMATRIX-END\n");
        let (_, problems) = judge("6.12", &boot, &[], true);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no verifier complaint"));
    }

    #[test]
    fn a_broken_program_that_loads_and_a_hang_are_problems() {
        let boot = parse("MATRIX broken PASS loaded, though it must not\n");
        let (_, problems) = judge("host", &boot, &[], true);
        assert_eq!(
            problems,
            [
                "host: broken loaded (must be rejected)",
                "host: the guest did not finish its suite (hang or panic: see the serial log)"
            ]
        );
    }

    const CHECKED: &str = "MATRIX-INFO kernel 6.12.57+deb12-cloud-amd64\n\
        MATRIX-INFO verified sample_cpu 312000 1840 loaded\n\
        MATRIX-INFO verified sample_tables 27000 310 loaded\n\
        MATRIX-INFO verified sample_fp_py - 12 refused: number of funcs in func_info doesn't match\n\
        MATRIX-INFO verified churn_mkdir 12 1 loaded\n\
        MATRIX check PASS exit 0\n\
        MATRIX-END\n";

    #[test]
    fn verified_lines_are_parsed_with_unknown_counts_and_reasons() {
        let boot = parse(CHECKED);
        let verified: Vec<Verified> = boot.verified().into_iter().map(Result::unwrap).collect();
        assert_eq!(verified.len(), 4);
        assert_eq!(verified[0].insns, Some(312_000));
        assert_eq!(verified[0].load_ms, "1840");
        assert_eq!(
            verified[2],
            Verified {
                program: "sample_fp_py".into(),
                insns: None,
                load_ms: "12".into(),
                refused: Some("number of funcs in func_info doesn't match".into()),
            }
        );
        let bad = parse("MATRIX-INFO verified sample_cpu many 1 loaded\n");
        assert_eq!(bad.verified(), [Err("sample_cpu many 1 loaded".to_owned())]);
    }

    #[test]
    fn a_loaded_program_over_the_budget_is_a_problem_a_refused_one_is_not() {
        let boot = parse(CHECKED);
        let (text, problems) = judge("6.12", &boot, &expected(&["check"]), false);
        assert_eq!(
            problems,
            ["6.12: sample_cpu needs 312000 verified instructions, over the budget of 250000"],
            "{text}"
        );
        assert!(text.contains("sample_fp_py") && text.contains("refused: number of funcs"));
        // The figures are a table, not raw info lines.
        assert!(!text.contains("verified: "), "{text}");
    }

    #[test]
    fn no_sampler_loaded_is_a_problem_even_when_others_loaded() {
        let boot = parse(
            "MATRIX-INFO verified sample_fp - 30 refused: too many args\n\
             MATRIX-INFO verified churn_mkdir - 2 loaded\n\
             MATRIX check FAIL exit 1\n\
             MATRIX-END\n",
        );
        let (_, problems) = judge("5.10", &boot, &expected(&["check"]), false);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(
            problems[0],
            "5.10: `profiler check` loaded no sampler program (none of sample_cpu, sample_tables, sample_fp_py, sample_fp)"
        );
        assert_eq!(problems[1], "5.10: check fail");
        // Without the check in the suite (the host's broken-only run) nothing is asked of it.
        let (_, problems) = judge("host", &parse("MATRIX-END\n"), &[], false);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn the_table_has_a_row_per_program_and_a_column_per_kernel() {
        let old = parse(
            "MATRIX-INFO verified sample_cpu - 5 refused: no bpf_loop\n\
             MATRIX-INFO verified sample_fp - 40 loaded\n",
        );
        let new = parse(CHECKED);
        let table = verified_table(&[("5.10", old), ("6.12", new)]);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0], ["program", "5.10", "6.12"]);
        assert_eq!(rows[1], ["sample_cpu", "refused", "312000"]);
        assert_eq!(rows[2], ["sample_fp", "-"], "{table}");
        assert_eq!(rows[3], ["sample_tables", "27000"]);
        assert_eq!(verified_table(&[("6.1", parse("MATRIX-END\n"))]), "");
    }

    #[test]
    fn the_same_info_from_every_record_is_printed_once() {
        let line = "MATRIX-INFO features ring buffer yes, bpf_loop no, PROCMAP_QUERY no\n";
        let boot = parse(&format!("{line}{line}{line}MATRIX-END\n"));
        let (text, _) = judge("5.10", &boot, &[], false);
        assert_eq!(text.matches("bpf_loop no").count(), 1, "{text}");
    }
}
