//! What the table walk did, for the outputs, last step of the unwind data flow: the loader's
//! figures (`LoaderStats`) and the collector's per-reason counts of stacks cut short become
//! the capture's named counters (`report --stats`) and Prometheus text for the agent's
//! /metrics. Plain functions, so record and the agent share them.
use std::fmt::Write as _;

use profiler_common::unwind::{ByReason, reason};

/// What the loader did, for `--stats`, /metrics and the bench.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LoaderStats {
    /// Processes loaded (each once while it lives; a pid reused after an exit counts again).
    pub processes: u64,
    pub binaries_table: u64,
    pub binaries_fp: u64,
    /// Rows (as compiled) copied into the kernel over the recording (evicted and reloaded
    /// ones again).
    pub rows: u64,
    /// Binaries left to frame pointers because their table does not fit the budget at all.
    pub over_budget: u64,
    /// Binaries whose rows were freed to make room for another's.
    pub evicted: u64,
    /// Entries of UNWIND_ROWS (4 bytes each: rows and page indexes) in use now, and the
    /// array's length (`--unwind-memory` / 4).
    pub slots_now: u64,
    pub slots_capacity: u64,
    /// Distinct rules in UNWIND_RULES (4 bytes each, shared by every binary).
    pub rules: u64,
    /// Binaries left without a table (walked by frame pointer) because UNWIND_RULES had no
    /// room for their new rules.
    pub rules_full: u64,
    /// Bytes of the row array mapped into this process to write rows (in its RSS; the
    /// array's memory itself is the kernel's, `rows_capacity` rows).
    pub mapped_bytes: u64,
    /// Tables read from the disk cache instead of compiled.
    pub cache_hits: u64,
    /// Time spent compiling tables, ns.
    pub compile_ns: u64,
}

impl LoaderStats {
    /// Kernel memory the tables take now, bytes: their slices of UNWIND_ROWS (rows and page
    /// indexes) and the rules in UNWIND_RULES, each 4 bytes.
    pub(crate) fn table_bytes(&self) -> u64 {
        (self.slots_now + self.rules) * 4
    }

    /// The bytes UNWIND_ROWS holds (`--unwind-memory`).
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.slots_capacity * 4
    }
}

/// The capture's named counters (`Meta::named_counters`). The per-reason counts of cut
/// stacks are not among them: the capture's stacks carry them (their `[truncated: reason]`
/// root frames), so `report --stats` counts them for any time slice.
pub(crate) fn named_counters(s: &LoaderStats) -> Vec<(String, u64)> {
    [
        ("unwind_table_bytes", s.table_bytes()),
        ("unwind_table_capacity_bytes", s.capacity_bytes()),
        ("unwind_rules", s.rules),
        ("unwind_rules_full", s.rules_full),
        ("unwind_table_mapped_bytes", s.mapped_bytes),
        ("unwind_rows_loaded", s.rows),
        ("unwind_processes", s.processes),
        ("unwind_binaries_table", s.binaries_table),
        ("unwind_binaries_frame_pointer", s.binaries_fp),
        ("unwind_over_budget", s.over_budget),
        ("unwind_evicted", s.evicted),
        ("unwind_cache_hits", s.cache_hits),
        ("unwind_compile_ms", s.compile_ns / 1_000_000),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The `reason` label of a truncation code: its name with underscores (`not_loaded`).
pub(crate) fn reason_label(code: usize) -> String {
    reason::NAMES
        .get(code)
        .copied()
        .unwrap_or("unknown")
        .replace(' ', "_")
}

/// The stack copies' figures since the start (docs/unwinding.md, Stack copies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CopyFigures {
    /// Samples the sampler sent with a copy of their user stack (`counter::STACK_COPIES`),
    /// of every process: the comm filter comes after.
    pub sent: u64,
    /// Samples that wanted a copy and were sent without (`counter::STACK_COPIES_REFUSED`).
    pub refused: u64,
    /// The collector's walks of copies (samples the filters kept), by the `unwind::reason`
    /// each stopped at (0: it reached the entry).
    pub walks: ByReason,
}

/// Prometheus text exposition (0.0.4) of the table walk: kernel memory of the tables now,
/// the budget, evictions, binaries by walk, `truncated` (cumulative samples cut short,
/// by `unwind::reason` code; index 0 unused) and the stack copies.
pub(crate) fn metrics_text(s: &LoaderStats, truncated: &ByReason, copies: &CopyFigures) -> String {
    let mut o = String::new();
    let mut metric = |name: &str, help: &str, kind: &str, series: &[(String, u64)]| {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} {kind}");
        for (labels, v) in series {
            if labels.is_empty() {
                let _ = writeln!(o, "{name} {v}");
            } else {
                let _ = writeln!(o, "{name}{{{labels}}} {v}");
            }
        }
    };
    metric(
        "profiler_unwind_table_bytes",
        "Kernel memory the unwind tables take now (4 bytes a row, page index and rule).",
        "gauge",
        &[(String::new(), s.table_bytes())],
    );
    metric(
        "profiler_unwind_table_capacity_bytes",
        "Kernel memory reserved for unwind tables (--unwind-memory).",
        "gauge",
        &[(String::new(), s.capacity_bytes())],
    );
    metric(
        "profiler_unwind_table_mapped_bytes",
        "Bytes of the unwind-table array mapped into the profiler to write rows (in its RSS).",
        "gauge",
        &[(String::new(), s.mapped_bytes)],
    );
    metric(
        "profiler_unwind_evictions_total",
        "Binaries whose table was evicted to make room for another's.",
        "counter",
        &[(String::new(), s.evicted)],
    );
    metric(
        "profiler_unwind_rules_full_total",
        "Binaries walked by frame pointer because the kernel's unwind rule table (65536 rules) had no room for their rules.",
        "counter",
        &[(String::new(), s.rules_full)],
    );
    metric(
        "profiler_unwind_binaries_total",
        "Binaries seen, by how their frames are walked.",
        "counter",
        &[
            ("walk=\"table\"".to_owned(), s.binaries_table),
            ("walk=\"frame_pointer\"".to_owned(), s.binaries_fp),
        ],
    );
    metric(
        "profiler_unwind_truncated_total",
        "Samples whose user stack the table walk cut short, by reason.",
        "counter",
        &by_reason(truncated),
    );
    metric(
        "profiler_unwind_stack_copies_total",
        "Samples sent with a copy of their user stack (their process's tables not in the kernel yet), of every process.",
        "counter",
        &[(String::new(), copies.sent)],
    );
    metric(
        "profiler_unwind_stack_copies_refused_total",
        "Samples that wanted a stack copy and were sent without (ring buffer half full, or the CPU's copy ration spent).",
        "counter",
        &[(String::new(), copies.refused)],
    );
    metric(
        "profiler_unwind_stack_copies_walked_total",
        "Stack copies walked by the profiler (of the samples its filters kept).",
        "counter",
        &[(String::new(), copies.walks.total())],
    );
    metric(
        "profiler_unwind_stack_copy_truncated_total",
        "Walks of stack copies that stopped before the entry, by reason.",
        "counter",
        &by_reason(&copies.walks),
    );
    o
}

/// One `reason` series per truncation code (index 0, not cut, left out): zero or not, so
/// rates work from the first scrape.
fn by_reason(counts: &ByReason) -> Vec<(String, u64)> {
    counts
        .cuts()
        .map(|(code, n)| (format!("reason=\"{}\"", reason_label(code)), n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_carry_every_reason_and_the_memory() {
        let s = LoaderStats {
            slots_now: 1500,
            rules: 500,
            slots_capacity: 8 << 20,
            evicted: 3,
            ..LoaderStats::default()
        };
        let copies = CopyFigures {
            sent: 9,
            refused: 4,
            walks: ByReason([6, 0, 0, 0, 1, 0, 0]),
        };
        let text = metrics_text(&s, &ByReason([0, 5, 0, 0, 2, 0, 1]), &copies);
        assert!(
            text.contains("\nprofiler_unwind_table_bytes 8000\n"),
            "{text}"
        );
        assert!(
            text.contains("profiler_unwind_evictions_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("profiler_unwind_truncated_total{reason=\"not_loaded\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("profiler_unwind_truncated_total{reason=\"unsupported_rule\"} 1\n"),
            "{text}"
        );
        // Every reason has its series, zero or not, so rates work from the first scrape.
        assert_eq!(text.matches("profiler_unwind_truncated_total{").count(), 6);
        for line in [
            "profiler_unwind_stack_copies_total 9\n",
            "profiler_unwind_stack_copies_refused_total 4\n",
            "profiler_unwind_stack_copies_walked_total 7\n",
            "profiler_unwind_stack_copy_truncated_total{reason=\"read_fault\"} 1\n",
            "profiler_unwind_stack_copy_truncated_total{reason=\"not_loaded\"} 0\n",
        ] {
            assert!(text.contains(line), "no {line:?} in {text}");
        }
        assert_eq!(
            text.matches("profiler_unwind_stack_copy_truncated_total{")
                .count(),
            6
        );
        let named = named_counters(&s);
        assert!(named.contains(&("unwind_table_bytes".to_owned(), 8000)));
        assert!(named.contains(&("unwind_evicted".to_owned(), 3)));
    }
}
