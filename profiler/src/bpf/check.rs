//! `profiler check`: every program of the object loaded into the running kernel, none
//! attached, with what the verifier said of each: whether it loaded, the instructions it
//! processed (`verified_insns`, Linux 5.16+) and how long the load took. The load-time values
//! are the most any run asks (`Settings::worst_case`), so a figure here bounds every run's.
//! The kernel matrix and the budget test read it (docs/kernels.md).
use std::time::Instant;

use aya::programs::{Program, ProgramInfo};

use super::{BpfError, Settings, load_object, rejected};

use profiler_common::VERIFIED_INSNS_BUDGET;

/// What the kernel did with one program.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ProgramCheck {
    pub(crate) program: String,
    pub(crate) loaded: bool,
    /// None where the kernel does not report it (before 5.16) or the program did not load.
    pub(crate) verified_insns: Option<u32>,
    pub(crate) load_ms: u64,
    /// The verifier's one-line reason, when it refused the program.
    pub(crate) refused: Option<String>,
}

/// Loads each program of the object, in the object's order.
pub(crate) fn check_programs() -> Result<Vec<ProgramCheck>, BpfError> {
    let mut ebpf = load_object(&Settings::worst_case())?;
    let mut checks = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let started = Instant::now();
        let (result, info) = match program {
            Program::PerfEvent(p) => (p.load(), p.info().ok()),
            Program::RawTracePoint(p) => (p.load(), p.info().ok()),
            other => {
                log::warn!("{name}: a {:?} program, not checked", other.prog_type());
                continue;
            }
        };
        let load_ms = started.elapsed().as_millis() as u64;
        checks.push(match result {
            Ok(()) => ProgramCheck {
                verified_insns: info
                    .as_ref()
                    .and_then(ProgramInfo::verified_instruction_count),
                program: name.to_owned(),
                loaded: true,
                load_ms,
                refused: None,
            },
            Err(e) => ProgramCheck {
                refused: Some(match rejected(name, e) {
                    BpfError::Rejected { reason, .. } => reason,
                    other => crate::util::chain(&other),
                }),
                program: name.to_owned(),
                loaded: false,
                verified_insns: None,
                load_ms,
            },
        });
    }
    // The sampler's variants first, most capable first; the rest by name.
    checks.sort_by_key(|c| {
        let variant = super::variant::Variant::ALL
            .iter()
            .position(|v| v.program() == c.program);
        (variant.unwrap_or(usize::MAX), c.program.clone())
    });
    Ok(checks)
}

impl ProgramCheck {
    /// Whether it is one of the sampler's variants (`profiler_common::program`).
    pub(crate) fn is_sampler(&self) -> bool {
        super::variant::Variant::ALL
            .iter()
            .any(|v| v.program() == self.program)
    }

    /// Loaded, within `VERIFIED_INSNS_BUDGET` where the kernel tells.
    pub(crate) fn within_budget(&self) -> bool {
        self.verified_insns
            .is_none_or(|n| n <= VERIFIED_INSNS_BUDGET)
    }
}
