//! Which sampler program to load: the variants profiler-ebpf builds, the order they are tried
//! in, and the one line a user reads when the kernel refused what was asked. A kernel whose
//! verifier refuses the table walk (too large for it, a helper it lacks) still samples, by frame
//! pointer; the tool fails only when no variant at all loads.
use profiler_common::program;

/// What a sampler program walks besides the kernel stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Variant {
    /// User stacks by the unwind tables (`--unwind auto|dwarf`); else by frame pointer.
    pub tables: bool,
    /// Python frames of registered processes (`--python on`).
    pub python: bool,
}

/// Why a variant was not loaded: the verifier's one-line reason, or the feature it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub variant: Variant,
    pub reason: String,
}

/// Names of programs to treat as refused without asking the kernel (comma-separated), so the
/// tests can walk every step of the fallback on a kernel that accepts them all.
pub(crate) const REFUSE_ENV: &str = "PROFILER_REFUSE";

impl Variant {
    /// The program's name in the object (`profiler_common::program`).
    pub(crate) fn program(self) -> &'static str {
        match (self.tables, self.python) {
            (true, true) => program::FULL,
            (true, false) => program::TABLES,
            (false, true) => program::FP_PYTHON,
            (false, false) => program::FP,
        }
    }

    /// Every variant, most capable first.
    pub(crate) const ALL: [Variant; 4] = [
        Variant {
            tables: true,
            python: true,
        },
        Variant {
            tables: true,
            python: false,
        },
        Variant {
            tables: false,
            python: true,
        },
        Variant {
            tables: false,
            python: false,
        },
    ];

    /// The variants to try for what was asked, in order: the asked one, then each that gives
    /// up part of it (the table walk keeps its place before Python frames: whole stacks help
    /// every process, Python frames only Python's).
    pub(crate) fn fallbacks(self) -> impl Iterator<Item = Variant> {
        Self::ALL
            .into_iter()
            .filter(move |v| (self.tables || !v.tables) && (self.python || !v.python))
    }

    /// Whether its verifier needs bpf_loop (Linux 5.17): the table walk and the Python walk
    /// each run as a bpf_loop callback.
    pub(crate) fn needs_bpf_loop(self) -> bool {
        self.tables || self.python
    }

    /// Whether the test hook `PROFILER_REFUSE` names it.
    pub(crate) fn refused_by_env(self) -> bool {
        std::env::var(REFUSE_ENV)
            .is_ok_and(|names| names.split(',').any(|name| name.trim() == self.program()))
    }
}

/// One line per part of `asked` that `loaded` lacks: what is lost, why, and the flag that asks
/// for the smaller mode directly (no refused load first).
pub(crate) fn lost_lines(asked: Variant, loaded: Variant, refusals: &[Refusal]) -> Vec<String> {
    let why = |part: fn(Variant) -> bool| {
        refusals.iter().rev().find(|r| part(r.variant)).map_or_else(
            || "not tried".to_owned(),
            |r| format!("{}: {}", r.variant.program(), r.reason),
        )
    };
    let mut lines = Vec::new();
    if asked.tables && !loaded.tables {
        lines.push(format!(
            "stacks by frame pointer only: the kernel refused the table walk ({}); \
             --unwind fp chooses this mode without trying",
            why(|v| v.tables)
        ));
    }
    if asked.python && !loaded.python {
        lines.push(format!(
            "no Python frames: the kernel refused the Python walk ({}); \
             --python off chooses this mode without trying",
            why(|v| v.python)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: Variant = Variant::ALL[0];
    const TABLES: Variant = Variant::ALL[1];
    const FP_PYTHON: Variant = Variant::ALL[2];
    const FP: Variant = Variant::ALL[3];

    #[test]
    fn each_ask_falls_back_to_what_it_contains_down_to_frame_pointers() {
        let order = |v: Variant| v.fallbacks().map(Variant::program).collect::<Vec<_>>();
        assert_eq!(
            order(FULL),
            ["sample_cpu", "sample_tables", "sample_fp_py", "sample_fp"]
        );
        assert_eq!(order(TABLES), ["sample_tables", "sample_fp"]);
        assert_eq!(order(FP_PYTHON), ["sample_fp_py", "sample_fp"]);
        assert_eq!(order(FP), ["sample_fp"]);
        assert!(!FP.needs_bpf_loop());
        assert!(FULL.needs_bpf_loop() && TABLES.needs_bpf_loop() && FP_PYTHON.needs_bpf_loop());
    }

    #[test]
    fn a_lost_part_is_one_line_with_the_refusal_and_the_flag() {
        let refusals = [
            Refusal {
                variant: FULL,
                reason: "BPF program is too large. Processed 1000001 insn".to_owned(),
            },
            Refusal {
                variant: TABLES,
                reason: "BPF program is too large. Processed 1000001 insn".to_owned(),
            },
        ];
        let lines = lost_lines(FULL, FP_PYTHON, &refusals);
        assert_eq!(
            lines,
            [
                "stacks by frame pointer only: the kernel refused the table walk (sample_tables: \
              BPF program is too large. Processed 1000001 insn); --unwind fp chooses this mode \
              without trying"
            ]
        );
        let lines = lost_lines(FULL, FP, &refusals);
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1]
                .starts_with("no Python frames: the kernel refused the Python walk (sample_cpu: ")
        );
        assert!(lines[1].ends_with("--python off chooses this mode without trying"));
        assert!(lost_lines(FULL, FULL, &[]).is_empty());
    }
}
