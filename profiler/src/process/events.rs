//! Process facts besides the samples, as the collector reads them at each drain: the
//! kernel's side-band records (`kernel_records`) applied to the process table, the exit
//! statuses from the sampler's exit program, and which processes the unwinder must be told of.
use crate::util::{FxMap, FxSet};

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
    /// Processes the last records saw born and gone unsampled (`unseen_lives`).
    unseen: FxSet<u32>,
}

impl ProcessEvents {
    pub(crate) fn new(kernel: Option<KernelRecords>, exits: Option<RingBuf<MapData>>) -> Self {
        Self {
            kernel,
            exits,
            records: Vec::new(),
            unseen: FxSet::default(),
        }
    }

    /// The kernel's records of the last `read_into`, in time order.
    pub(crate) fn records(&self) -> &[KernelRecord] {
        &self.records
    }

    /// The processes of the last `read_into` that were born and exited within its records
    /// with no sample: nothing but their lifetimes is kept of them.
    pub(crate) fn unseen(&self) -> &FxSet<u32> {
        &self.unseen
    }

    /// A descriptor readable when the kernel's record rings fill (`KernelRecords::half_full`);
    /// None without them.
    pub(crate) fn half_full(&self) -> Option<std::os::fd::OwnedFd> {
        self.kernel.as_ref()?.half_full().ok()
    }

    /// Applies everything waiting to `table`; `sampled` holds the pids of the samples read
    /// with these records, from the ring as it was at `samples_read_ns` (CLOCK_MONOTONIC).
    pub(crate) fn read_into(
        &mut self,
        table: &mut ProcessTable,
        sampled: &FxSet<u32>,
        samples_read_ns: u64,
    ) {
        if let Some(k) = &mut self.kernel {
            self.records.clear();
            k.read(&mut self.records);
            k.take_wakes();
            unseen_lives(&self.records, sampled, samples_read_ns, &mut self.unseen);
            table.apply_except(&self.records, &self.unseen);
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
/// `KernelRecords::read` sorts them), sorted; into `exited`, every pid that exited, with the
/// time of its last exit. A pid that exits and is reused by a new process within `records`
/// counts as mapped when the new one maps files.
pub(crate) fn mapped_and_exited(
    records: &[KernelRecord],
    exited: &mut FxMap<u32, u64>,
) -> Vec<u32> {
    // pid -> whether its last record so far is its exit.
    let mut mapped: FxMap<u32, bool> = FxMap::default();
    for r in records {
        match r {
            KernelRecord::Map { pid, .. } => {
                mapped.insert(*pid, false);
            }
            KernelRecord::Exit { pid, time_ns } => {
                exited.insert(*pid, *time_ns);
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
    live
}

/// Into `out`, the pids whose whole life is in `records` (forked and exited there, the exit
/// their last record, before `samples_read_ns`: the samples were read before the records,
/// and a process that ran after that read may have samples waiting for the next drain) with
/// no sample in `sampled` and no child forked: under churn (60 new processes a second, most
/// living a few milliseconds between two drains a second apart) these are most processes, and their mappings, copied from the parent at the fork and
/// replaced at the exec, can serve no sample: only their lifetimes are kept.
pub(crate) fn unseen_lives(
    records: &[KernelRecord],
    sampled: &FxSet<u32>,
    samples_read_ns: u64,
    out: &mut FxSet<u32>,
) {
    // pid -> (forked here, exited, disqualified)
    let mut lives: FxMap<u32, (bool, bool, bool)> = FxMap::default();
    for r in records {
        match r {
            KernelRecord::Fork { pid, ppid, .. } => {
                let life = lives.entry(*pid).or_default();
                // A pid reused within the records: keep both lives.
                *life = (true, false, life.1 || life.2);
                lives.entry(*ppid).or_default().2 = true;
            }
            KernelRecord::Exit { pid, time_ns } => {
                let life = lives.entry(*pid).or_default();
                life.1 = true;
                life.2 |= *time_ns >= samples_read_ns;
            }
            KernelRecord::Map { pid, .. } | KernelRecord::Exec { pid, .. } => {
                let life = lives.entry(*pid).or_default();
                life.2 |= life.1; // a record after its exit: a reused pid
            }
            KernelRecord::Lost(_) => {}
        }
    }
    out.clear();
    out.extend(lives.into_iter().filter_map(|(pid, (born, gone, kept))| {
        (born && gone && !kept && !sampled.contains(&pid)).then_some(pid)
    }));
}

/// The pids of the sample records `batch[..ends]`.
pub(crate) fn sampled_pids(batch: &[u8], ends: &[usize]) -> FxSet<u32> {
    let at = std::mem::offset_of!(profiler_common::SampleHeader, pid);
    let mut start = 0;
    let mut pids = FxSet::default();
    for &end in ends {
        if let Some(b) = batch
            .get(start + at..start + at + 4)
            .filter(|_| start + at + 4 <= end)
        {
            pids.insert(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        }
        start = end;
    }
    pids
}
