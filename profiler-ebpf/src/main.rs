//! The sampler, first stage of the flow: a perf_event program run by the cpu-clock timer on
//! every CPU. It writes one `SampleEvent` (time, cpu, ids, comm, both stacks) per tick into
//! the ring buffer; nothing is aggregated here, because later views need every timestamp.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

// On the host this crate is an empty binary so that workspace-wide clippy/test work.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod churn;
mod exits;
#[cfg(target_arch = "bpf")]
mod python;
#[cfg(target_arch = "bpf")]
mod python_exec;
#[cfg(target_arch = "bpf")]
mod runq;
#[cfg(target_arch = "bpf")]
mod sampler;
#[cfg(target_arch = "bpf")]
mod unwind;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic; this is never called.
    loop {}
}
