//! The folded format: one line per unique stack, `comm;outer;...;leaf COUNT`, root first.
//! Kernel frames carry the suffix `_[k]`. Frame names may contain spaces (Rust's
//! `<impl Trait for T>::f`), so the count is whatever follows the LAST space.

use std::path::Path;

/// One folded line: frames root first (`frames[0]` is the comm), and its sample count.
pub type Stack = (Vec<String>, u64);

/// Parses folded text. Blank lines are ignored; a malformed line panics with the line, since
/// for these tests it means the profiler broke the format.
pub fn parse_folded(text: &str) -> Vec<Stack> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a count: {line:?}"));
            let count: u64 = count
                .parse()
                .unwrap_or_else(|e| panic!("folded line count {count:?} ({e}): {line:?}"));
            let frames: Vec<String> = stack.split(';').map(str::to_owned).collect();
            assert!(
                frames.iter().all(|f| !f.is_empty()),
                "folded line with an empty frame: {line:?}"
            );
            (frames, count)
        })
        .collect()
}

/// Reads and parses a folded file; returns the text too, for failure messages.
pub fn read_folded(path: &Path) -> (String, Vec<Stack>) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading folded output {}: {e}", path.display()));
    let stacks = parse_folded(&text);
    (text, stacks)
}

/// The first `lines` lines of `text`, to show in assertion messages.
pub fn head(text: &str, lines: usize) -> String {
    let total = text.lines().count();
    let mut shown: Vec<&str> = text.lines().take(lines).collect();
    if total > lines {
        shown.push("...");
    }
    format!("{} lines of folded output:\n{}", total, shown.join("\n"))
}

/// Whether the frame is a kernel frame (folded suffix `_[k]`).
pub fn is_kernel(frame: &str) -> bool {
    frame.ends_with("_[k]")
}

/// Whether `frames` contains frames matching `chain` in that order, not necessarily
/// adjacent: the runtime may add frames (`__libc_start_call_main`, closures of
/// `std::rt::lang_start`) around the functions a test cares about.
pub fn has_chain(frames: &[String], chain: &[&str], matches: impl Fn(&str, &str) -> bool) -> bool {
    let mut wanted = chain.iter().peekable();
    for frame in frames {
        if wanted.peek().is_some_and(|w| matches(frame, w)) {
            wanted.next();
        }
    }
    wanted.peek().is_none()
}

/// Total sample count of the stacks for which `pred` holds.
pub fn samples(stacks: &[Stack], pred: impl Fn(&[String]) -> bool) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| pred(frames))
        .map(|(_, n)| n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(s: &str) -> Vec<String> {
        s.split(';').map(str::to_owned).collect()
    }

    #[test]
    fn parses_comm_frames_and_count() {
        let text = "fx-chain;main;a;b;c 42\n\nswapper/0;secondary_startup_64_[k];do_idle_[k] 7\n";
        let stacks = parse_folded(text);
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0], (frames("fx-chain;main;a;b;c"), 42));
        assert_eq!(stacks[1].0[0], "swapper/0");
        assert!(is_kernel(&stacks[1].0[2]));
        assert!(!is_kernel(&stacks[0].0[4]));
    }

    #[test]
    fn count_is_after_the_last_space() {
        let stacks = parse_folded("app;<impl Foo for Bar>::run;x 3\n");
        assert_eq!(stacks[0].0[1], "<impl Foo for Bar>::run");
        assert_eq!(stacks[0].1, 3);
    }

    #[test]
    #[should_panic(expected = "without a count")]
    fn line_without_count_panics() {
        parse_folded("fx-chain;main\n");
    }

    #[test]
    #[should_panic(expected = "count")]
    fn non_numeric_count_panics() {
        parse_folded("fx-chain;main abc\n");
    }

    #[test]
    fn chain_is_an_ordered_subsequence() {
        let eq = |f: &str, w: &str| f == w;
        let stack = frames("fx-chain;_start;__libc_start_call_main;main;a;b;c");
        assert!(has_chain(&stack, &["main", "a", "b", "c"], eq));
        assert!(has_chain(&stack, &["main", "c"], eq));
        assert!(!has_chain(&stack, &["main", "b", "a"], eq));
        assert!(!has_chain(
            &frames("fx-chain;main;a;c"),
            &["main", "a", "b", "c"],
            eq
        ));
        assert!(has_chain(&stack, &[], eq));
    }

    #[test]
    fn chain_with_suffix_matching() {
        let stack = frames(
            "fixture-rust;main;fixture_rust::rust_outer;fixture_rust::rust_middle;fixture_rust::rust_inner",
        );
        let ends = |f: &str, w: &str| f.ends_with(w);
        assert!(has_chain(
            &stack,
            &["rust_outer", "rust_middle", "rust_inner"],
            ends
        ));
    }

    #[test]
    fn samples_sums_matching_counts() {
        let stacks = parse_folded("p;a 2\np;b 3\np;a;k_[k] 5\n");
        assert_eq!(samples(&stacks, |f| f.iter().any(|x| x == "a")), 7);
        assert_eq!(samples(&stacks, |f| f.iter().any(|x| is_kernel(x))), 5);
        assert_eq!(samples(&stacks, |_| true), 10);
    }

    #[test]
    fn head_marks_truncation() {
        assert_eq!(
            head("x 1\ny 2\nz 3\n", 2),
            "3 lines of folded output:\nx 1\ny 2\n..."
        );
        assert_eq!(head("x 1\n", 5), "1 lines of folded output:\nx 1");
    }
}
