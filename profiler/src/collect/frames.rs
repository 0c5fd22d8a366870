//! The sampler's stack words as the collector stores them: return addresses moved back into
//! their calls, the `[truncated: reason]` marker a cut walk leaves at a stack's root, and
//! Python's (code, instruction) pairs.
use profiler_common::python::PyFrame;

/// User "addresses" at and above this mark the root of a stack that a table walk cut short:
/// `TRUNCATED_MARK + unwind::reason` (in the kernel half, so never a user address).
const TRUNCATED_MARK: u64 = 0xffff_ffff_ffff_ff00;

/// The `[truncated: reason]` name of a marker address, None for a real address.
pub(crate) fn truncation_name(addr: u64) -> Option<String> {
    let code = addr.checked_sub(TRUNCATED_MARK)?;
    let names = profiler_common::unwind::reason::NAMES;
    Some(format!(
        "[truncated: {}]",
        names.get(code as usize).copied().unwrap_or("unknown")
    ))
}

/// Appends the marker of the reason (`unwind::reason`) the walk stopped for, if any.
pub(super) fn with_truncation_marker(user: Box<[u64]>, code: u32) -> Box<[u64]> {
    if code == 0 {
        return user;
    }
    let mut v = user.into_vec();
    v.push(TRUNCATED_MARK + u64::from(code));
    v.into_boxed_slice()
}

/// Native-endian u64 addresses, leaf first; return addresses moved back into their call
/// instruction so they symbolize to the caller even when the call is a function's last one.
pub(super) fn callsites(bytes: &[u8]) -> Box<[u64]> {
    callsites_of(
        bytes
            .chunks_exact(8)
            .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes"))),
    )
}

/// `callsites` of addresses already read.
pub(super) fn callsites_of(addrs: impl Iterator<Item = u64>) -> Box<[u64]> {
    addrs
        .enumerate()
        .map(|(i, a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect()
}

/// Python frames as the sampler wrote them: (code, instruction) u64 pairs.
pub(super) fn py_frames(bytes: &[u8]) -> Box<[PyFrame]> {
    bytes
        .chunks_exact(16)
        .map(|b| PyFrame {
            code: u64::from_ne_bytes(b[..8].try_into().expect("8 bytes")),
            instr: u64::from_ne_bytes(b[8..].try_into().expect("8 bytes")),
        })
        .collect()
}
