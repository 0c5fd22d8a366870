//! Process facts besides the samples, as the collector reads them at each drain: the
//! kernel's side-band records (`kernel_records`) applied to the process table, the exit
//! statuses from the sampler's exit program, and which processes the unwinder must be told of.
use std::collections::HashMap;

use aya::maps::{MapData, RingBuf};
use profiler_common::exits::ExitEvent;

use super::{KernelRecord, KernelRecords, ProcessTable};

/// Where process facts come from besides the samples: the kernel's records (mappings, exec,
/// fork, exit) and the exit statuses the sampler's exit program sends. Either may be missing
/// (an old kernel, no BTF): then /proc is read at a process's first sample, as before.
#[derive(Default)]
pub(crate) struct ProcessEvents {
    kernel: Option<KernelRecords>,
    exits: Option<RingBuf<MapData>>,
    records: Vec<KernelRecord>,
}

impl ProcessEvents {
    pub(crate) fn new(kernel: Option<KernelRecords>, exits: Option<RingBuf<MapData>>) -> Self {
        Self {
            kernel,
            exits,
            records: Vec::new(),
        }
    }

    /// The kernel's records of the last `read_into`, in time order.
    pub(super) fn records(&self) -> &[KernelRecord] {
        &self.records
    }

    /// Applies everything waiting to `table`.
    pub(super) fn read_into(&mut self, table: &mut ProcessTable) {
        if let Some(k) = &mut self.kernel {
            self.records.clear();
            k.read(&mut self.records);
            table.apply(&self.records);
        }
        if let Some(exits) = &mut self.exits {
            while let Some(item) = exits.next() {
                let Some(bytes) = item.get(..std::mem::size_of::<ExitEvent>()) else {
                    continue;
                };
                // SAFETY: an ExitEvent written by our program; unaligned read as the ring
                // promises no alignment.
                let e = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ExitEvent>()) };
                table.exited(e.pid, e.time_ns, e.status);
            }
        }
    }
}

/// The pids with new mappings that still live after `records` (in time order, as
/// `KernelRecords::read` sorts them), sorted; and every pid that exited, in order. A pid
/// that exits and is reused by a new process within `records` counts as mapped when the new
/// one maps files.
pub(super) fn mapped_and_exited(records: &[KernelRecord]) -> (Vec<u32>, Vec<u32>) {
    // pid -> whether its last record so far is its exit.
    let mut mapped: HashMap<u32, bool> = HashMap::new();
    let mut exited = Vec::new();
    for r in records {
        match r {
            KernelRecord::Map { pid, .. } => {
                mapped.insert(*pid, false);
            }
            KernelRecord::Exit { pid, .. } => {
                exited.push(*pid);
                if let Some(gone) = mapped.get_mut(pid) {
                    *gone = true;
                }
            }
            _ => {}
        }
    }
    let mut live: Vec<u32> = mapped
        .into_iter()
        .filter_map(|(pid, gone)| (!gone).then_some(pid))
        .collect();
    live.sort_unstable();
    (live, exited)
}
