//! What this kernel offers the sampler, probed before anything loads: a missing feature the
//! profiler can live without becomes one clear line, one it needs becomes one clear error,
//! never a raw verifier dump. The kernel matrix (docs/kernels.md) checks these on old kernels.
use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported},
};

/// The probed features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KernelFeatures {
    /// BPF ring buffer (Linux 5.8): the one channel samples stream through; required.
    pub ring_buffer: bool,
    /// The bpf_loop helper (Linux 5.17), for loops the verifier need not unroll.
    pub bpf_loop: bool,
    /// The PROCMAP_QUERY ioctl on /proc/PID/maps (Linux 6.11): one mapping per query.
    pub procmap_query: bool,
}

impl KernelFeatures {
    /// Probes the running kernel (a map create and a tiny program load; milliseconds). A probe
    /// that errors counts as missing: the line it leads to says what that costs.
    pub(crate) fn probe() -> Self {
        Self {
            ring_buffer: is_map_supported(MapType::RingBuf).unwrap_or(false),
            bpf_loop: is_helper_supported(ProgramType::PerfEvent, BpfHelper::BPF_FUNC_loop)
                .unwrap_or(false),
            procmap_query: crate::process::procmap_query_supported(),
        }
    }

    /// `ring buffer yes, bpf_loop yes, PROCMAP_QUERY no`, for logs and the kernel matrix.
    pub(crate) fn summary(self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        format!(
            "ring buffer {}, bpf_loop {}, PROCMAP_QUERY {}",
            yes(self.ring_buffer),
            yes(self.bpf_loop),
            yes(self.procmap_query)
        )
    }

    /// One line per missing feature the profiler works without, saying what changes. A
    /// missing bpf_loop is said by the sampler's fallback (`variant::lost_lines`), which
    /// knows what was asked.
    pub(crate) fn degraded(self) -> Vec<&'static str> {
        let mut lines = Vec::new();
        if !self.procmap_query {
            lines.push(
                "this kernel has no PROCMAP_QUERY (Linux 6.11+): user addresses are mapped by \
                 reading /proc/PID/maps, which costs more CPU on busy hosts",
            );
        }
        lines
    }
}

/// Lines the verifier prints after its reason: statistics, and (6.x) the two register states
/// it compared when it found a loop.
const AFTER_THE_REASON: &[&str] = &[
    "processed ",
    "verification time",
    "stack depth",
    "cur state:",
    "old state:",
];

/// The verifier's reason for rejecting a program: the last line of its log that is not one of
/// `AFTER_THE_REASON`. Some kernels print the reason right after the instruction it is about,
/// on the same line (`14: (55) if r1 != 0x0 goto pc-2 infinite loop detected at insn 13`).
pub(crate) fn verifier_reason(log: &str) -> &str {
    log.lines()
        .map(str::trim)
        .rev()
        .find(|line| !line.is_empty() && !AFTER_THE_REASON.iter().any(|s| line.starts_with(s)))
        .unwrap_or("the verifier gave no reason")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_last_line_before_the_statistics() {
        let log = "0: R1=ctx() R10=fp0\n\
                   12: (05) goto pc-3\n\
                   infinite loop detected at insn 10\n\
                   verification time 37 usec\n\
                   stack depth 0\n\
                   processed 20 insns (limit 1000000) max_states_per_insn 0\n";
        assert_eq!(verifier_reason(log), "infinite loop detected at insn 10");
        // 6.12's shape (from the kernel matrix): the reason ends an instruction's line and the
        // compared states follow it.
        let log = "13: (79) r1 = *(u64 *)(r0 +0)         ; R1_w=scalar()\n\
                   14: (55) if r1 != 0xffffffff goto pc-2 infinite loop detected at insn 13\n\
                   cur state: R0=map_value(map=COUNTERS,ks=4,vs=8) R10=fp0\n\
                   old state: R0_r=map_value(map=COUNTERS,ks=4,vs=8) R10=fp0\n\
                   verification time 158899 usec\n\
                   stack depth 72+0\n\
                   processed 871 insns (limit 1000000) max_states_per_insn 4\n\n";
        assert_eq!(
            verifier_reason(log),
            "14: (55) if r1 != 0xffffffff goto pc-2 infinite loop detected at insn 13"
        );
        assert_eq!(verifier_reason("\n"), "the verifier gave no reason");
    }

    #[test]
    fn every_missing_optional_feature_is_one_line() {
        let all = KernelFeatures {
            ring_buffer: true,
            bpf_loop: true,
            procmap_query: true,
        };
        assert!(all.degraded().is_empty());
        let none = KernelFeatures {
            ring_buffer: false,
            bpf_loop: false,
            procmap_query: false,
        };
        let lines = none.degraded();
        assert_eq!(lines.len(), 1);
        assert!(lines.iter().all(|l| !l.contains('\n')));
        assert_eq!(
            none.summary(),
            "ring buffer no, bpf_loop no, PROCMAP_QUERY no"
        );
    }

    /// The probes agree with the running kernel's version (6.18 here and in CI: all three).
    #[test]
    fn the_probes_match_the_kernel_version() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the tests as root: probing BPF needs it"
            );
            eprintln!("skipping: probing BPF needs root");
            return;
        }
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut numbers = release.trim().split(['.', '-']).map(str::parse::<u32>);
        let version = (
            numbers.next().unwrap().unwrap(),
            numbers.next().unwrap().unwrap(),
        );
        let f = KernelFeatures::probe();
        let expected = KernelFeatures {
            ring_buffer: version >= (5, 8),
            bpf_loop: version >= (5, 17),
            procmap_query: version >= (6, 11),
        };
        assert_eq!(f, expected, "kernel {}: {}", release.trim(), f.summary());
    }
}
