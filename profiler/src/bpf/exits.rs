//! Process exits, user side of profiler-ebpf `exits`: attach the sched_process_exit program
//! (with the exit code's offset, `task::TaskOffsets`) and hand its ring buffer to the
//! collector (`collect::ProcessEvents`).
use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
    programs::RawTracePoint,
};
use profiler_common::exits::{MAP_EXITS, PROGRAM_EXIT};

use super::BpfError;

/// Attaches the exit program and takes its ring buffer.
pub(super) fn attach(ebpf: &mut Ebpf) -> Result<RingBuf<MapData>, BpfError> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(PROGRAM_EXIT)
        .ok_or(BpfError::Missing("exit program"))?
        .try_into()?;
    program.load()?;
    program.attach("sched_process_exit")?;
    Ok(RingBuf::try_from(
        ebpf.take_map(MAP_EXITS)
            .ok_or(BpfError::Missing("exit ring buffer"))?,
    )?)
}
