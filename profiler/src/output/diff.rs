//! Two profiles compared: a differential flame graph (inferno: widths from AFTER, red where a
//! stack's share grew, blue where it shrank, BEFORE normalised to AFTER's total) and the
//! functions and processes whose share of samples changed most. Inputs are folded counts, so
//! captures and .folded files from any tool compare alike.
use std::{collections::HashMap, io};

use inferno::{differential, flamegraph};

use crate::profile::MAX_STACK_DEPTH;

/// Folded stacks: `root;outer;...;leaf` -> samples. The counts add up to at most
/// `MAX_FOLDED_TOTAL` (`parse_folded` checks), so no sum or difference over them wraps.
pub(crate) type Folded = HashMap<String, u64>;

/// Longest folded line read. Deep C++ stacks with inlining reach tens of KiB. The flame graph
/// draws a box (~200 bytes of SVG) per frame of each stack: a line of 120,000 one-letter frames
/// made a 25 MB SVG, so the depth is bounded as well (`MAX_STACK_DEPTH`, as in captures).
pub(crate) const MAX_FOLDED_LINE: usize = 1 << 20;
/// Most samples one folded profile may count in all (2^60, about 10^18: a million CPUs at
/// 1 kHz for 36 years). inferno's differential flame graph subtracts counts as signed 64-bit
/// integers (a count near 2^63 overflowed there), and shares are summed in f64.
pub(crate) const MAX_FOLDED_TOTAL: u64 = 1 << 60;
/// Longest frame name in a folded line (as a capture's strings, see `profile::MAX_STRING_BYTES`).
pub(crate) const MAX_FOLDED_FRAME: usize = crate::profile::MAX_STRING_BYTES;

/// Why folded text was refused; `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FoldedError {
    #[error("line {line}: longer than {MAX_FOLDED_LINE} bytes; is this folded stacks?")]
    LongLine { line: usize },
    #[error("line {line}: a frame name longer than {MAX_FOLDED_FRAME} bytes")]
    LongFrame { line: usize },
    #[error("line {line}: a stack deeper than {MAX_STACK_DEPTH} frames")]
    DeepStack { line: usize },
    #[error("line {line}: the count {count} does not fit 64 bits")]
    CountTooLarge { line: usize, count: String },
    #[error("line {line}: the counts add up past 2^60 (10^18 samples); is this folded stacks?")]
    TotalTooLarge { line: usize },
    #[error("no stacks with samples (lines of `frame;frame COUNT`)")]
    Empty,
}

/// Parses folded text (`stack COUNT` per line). Comments (`# ...`) and lines that are not
/// folded stacks (no count) are skipped, as inferno's flame graph skips them; what would silently distort the
/// comparison is refused: counts past 64 bits, lines or frames past the bounds, no stacks.
pub fn parse_folded(text: &str) -> Result<Folded, FoldedError> {
    let mut out = Folded::new();
    let mut total = 0u64;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.len() > MAX_FOLDED_LINE {
            return Err(FoldedError::LongLine { line: line_no });
        }
        // `# ` starts a comment, as inferno's flame graph reads it.
        if line.starts_with("# ") {
            continue;
        }
        let Some((stack, n)) = line.trim_end().rsplit_once(' ') else {
            continue;
        };
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let n: u64 = n.parse().map_err(|_| FoldedError::CountTooLarge {
            line: line_no,
            count: n.to_owned(),
        })?;
        if stack.split(';').any(|f| f.len() > MAX_FOLDED_FRAME) {
            return Err(FoldedError::LongFrame { line: line_no });
        }
        // The root (comm) is one more frame than a capture's stack holds.
        if stack.split(';').nth(MAX_STACK_DEPTH + 1).is_some() {
            return Err(FoldedError::DeepStack { line: line_no });
        }
        total = total
            .checked_add(n)
            .filter(|&t| t <= MAX_FOLDED_TOTAL)
            .ok_or(FoldedError::TotalTooLarge { line: line_no })?;
        // A stack with no samples adds nothing (and a profile of only those has no total
        // to compare shares against).
        if n > 0 {
            *out.entry(stack.to_owned()).or_default() += n;
        }
    }
    if out.is_empty() {
        return Err(FoldedError::Empty);
    }
    Ok(out)
}

fn to_text(f: &Folded) -> String {
    let mut lines: Vec<String> = f.iter().map(|(s, n)| format!("{s} {n}")).collect();
    lines.sort();
    lines.join("\n") + "\n"
}

/// Writes the differential flame graph of BEFORE -> AFTER.
pub fn write_diff_svg(before: &Folded, after: &Folded, w: &mut impl io::Write) -> io::Result<()> {
    let mut three = Vec::new();
    let opts = differential::Options {
        normalize: true,
        strip_hex: false,
    };
    differential::from_readers(
        opts,
        to_text(before).as_bytes(),
        to_text(after).as_bytes(),
        &mut three,
    )?;
    let three = String::from_utf8_lossy(&three);
    let mut fg = flamegraph::Options::default();
    fg.title = "Differential flame graph (red: grew, blue: shrank)".into();
    fg.subtitle = Some(format!(
        "widths from AFTER ({} samples); BEFORE ({} samples) normalised to it",
        after.values().sum::<u64>(),
        before.values().sum::<u64>()
    ));
    fg.count_name = "samples".into();
    fg.deterministic = true;
    let lines: Vec<&str> = three.lines().filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return write!(
            w,
            r#"<?xml version="1.0" standalone="no"?><svg xmlns="http://www.w3.org/2000/svg" width="600" height="60"><text x="10" y="30">no samples in either profile</text></svg>"#
        );
    }
    flamegraph::from_lines(&mut fg, lines, w)
}

/// A name whose share of all samples changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub name: String,
    /// Share of BEFORE's samples, percent.
    pub before: f64,
    /// Share of AFTER's samples, percent.
    pub after: f64,
}

impl Change {
    /// Percentage points gained (negative: lost).
    pub(crate) fn delta(&self) -> f64 {
        self.after - self.before
    }
}

/// The biggest movers of each kind, largest |delta| first.
#[derive(Clone, Debug, Default)]
pub struct TopChanges {
    /// Leaf (self) share per function.
    pub self_share: Vec<Change>,
    /// Share of samples with the function anywhere on the stack.
    pub inclusive: Vec<Change>,
    /// Share per root frame (the process comm in our folded output).
    pub processes: Vec<Change>,
}

/// Shares per name for one profile: (self, inclusive, root), percent of its samples.
pub(crate) type Shares = [HashMap<String, f64>; 3];

/// Self (leaf), inclusive (anywhere below the root, once per stack) and root shares per name,
/// percent of `f`'s samples (also `report`'s top table).
pub(crate) fn shares(f: &Folded) -> Shares {
    let total = f.values().sum::<u64>().max(1) as f64;
    let mut out: Shares = Default::default();
    for (stack, &n) in f {
        let share = n as f64 * 100.0 / total;
        let frames: Vec<&str> = stack.split(';').collect();
        *out[2].entry(frames[0].to_owned()).or_default() += share;
        let below_root = &frames[1.min(frames.len())..];
        if let Some(leaf) = below_root.last() {
            *out[0].entry((*leaf).to_owned()).or_default() += share;
        }
        let mut seen = std::collections::HashSet::new();
        for fr in below_root.iter().filter(|fr| seen.insert(**fr)) {
            *out[1].entry((*fr).to_owned()).or_default() += share;
        }
    }
    out
}

/// The `n` largest changes of each kind between two profiles.
pub fn top_changes(before: &Folded, after: &Folded, n: usize) -> TopChanges {
    let [b_self, b_incl, b_root] = shares(before);
    let [a_self, a_incl, a_root] = shares(after);
    let rank = |b: &HashMap<String, f64>, a: &HashMap<String, f64>| {
        let mut names: Vec<&String> = b.keys().chain(a.keys()).collect();
        names.sort();
        names.dedup();
        let mut v: Vec<Change> = names
            .into_iter()
            .map(|name| Change {
                name: name.clone(),
                before: b.get(name).copied().unwrap_or(0.0),
                after: a.get(name).copied().unwrap_or(0.0),
            })
            .filter(|c| c.delta().abs() >= 0.005)
            .collect();
        v.sort_by(|x, y| y.delta().abs().total_cmp(&x.delta().abs()));
        v.truncate(n);
        v
    };
    TopChanges {
        self_share: rank(&b_self, &a_self),
        inclusive: rank(&b_incl, &a_incl),
        processes: rank(&b_root, &a_root),
    }
}

/// The changes as text tables.
pub(crate) fn format_top(t: &TopChanges) -> String {
    let mut o = String::new();
    for (title, v) in [
        ("functions, self (leaf) share", &t.self_share),
        ("functions, inclusive share", &t.inclusive),
        ("processes", &t.processes),
    ] {
        o.push_str(&format!(
            "{title}:\n  {:>8} {:>8} {:>8}  name\n",
            "before%", "after%", "delta"
        ));
        for c in v {
            o.push_str(&format!(
                "  {:>8.2} {:>8.2} {:>+8.2}  {}\n",
                c.before,
                c.after,
                c.delta(),
                c.name
            ));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_hot_function_tops_the_list() {
        let before = parse_folded("app;main;work 50\napp;main;idle 50\n").unwrap();
        let after = parse_folded("app;main;work 50\napp;main;idle 50\napp;main;hot 100\n").unwrap();
        let t = top_changes(&before, &after, 5);
        assert_eq!(t.self_share[0].name, "hot");
        assert!((t.self_share[0].delta() - 50.0).abs() < 1e-9);
        assert_eq!(t.processes.len(), 0, "one process, same share");
        let mut svg = Vec::new();
        write_diff_svg(&before, &after, &mut svg).unwrap();
        assert!(String::from_utf8(svg).unwrap().contains("hot"));
    }

    #[test]
    fn overflowing_counts_long_lines_and_empty_input_are_errors() {
        let max = u64::MAX;
        assert!(matches!(
            parse_folded("a;b 18446744073709551616\n"),
            Err(FoldedError::CountTooLarge { line: 1, .. })
        ));
        assert_eq!(
            parse_folded(&format!("a;b {max}\na;c {max}\n")),
            Err(FoldedError::TotalTooLarge { line: 1 })
        );
        let most = format!("a;b {}\na;c 1\n", MAX_FOLDED_TOTAL - 1);
        assert_eq!(parse_folded(&most).unwrap()["a;c"], 1);
        let past = format!("a;b {}\na;c 2\n", MAX_FOLDED_TOTAL - 1);
        assert_eq!(
            parse_folded(&past),
            Err(FoldedError::TotalTooLarge { line: 2 })
        );
        let long = format!("a;{} 1\n", "x".repeat(MAX_FOLDED_LINE));
        assert_eq!(parse_folded(&long), Err(FoldedError::LongLine { line: 1 }));
        let deep = format!("a;{}b 1\n", "f;".repeat(MAX_STACK_DEPTH));
        assert_eq!(parse_folded(&deep), Err(FoldedError::DeepStack { line: 1 }));
        let ok = format!("a;{}b 1\n", "f;".repeat(MAX_STACK_DEPTH - 1));
        assert!(parse_folded(&ok).is_ok());
        let frame = format!("a;{};b 1\n", "x".repeat(MAX_FOLDED_FRAME + 1));
        assert_eq!(
            parse_folded(&frame),
            Err(FoldedError::LongFrame { line: 1 })
        );
        for empty in ["", "\n\n", "# only a comment 1\n", "a;b 0\n"] {
            assert_eq!(parse_folded(empty), Err(FoldedError::Empty), "{empty:?}");
        }
    }
}
