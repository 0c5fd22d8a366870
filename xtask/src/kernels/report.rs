//! Reads what a kernel's boot printed on the serial console (the MATRIX lines of init.sh) and
//! judges it: every smoke test passed, and the broken program was rejected by the verifier
//! with its complaint in the report.

use std::fmt::Write as _;

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
        t if t.starts_with("record") => "sample_cpu",
        "agent" => "sample_cpu",
        "doctor" | "doctor-v2" => "sample_cpu, churn_mkdir, churn_rmdir",
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
    for (key, value) in &boot.info {
        let _ = writeln!(text, "   {key}: {value}");
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
        assert!(text.contains("loaded: sample_cpu\n"), "{text}");
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
}
