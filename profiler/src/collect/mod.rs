//! Second stage: drain the sampler's ring buffer as samples arrive (tokio), intern their raw
//! stacks, and note what must be read while a process still lives: its exe, and where each
//! user address falls in its mappings (`process`). Symbolization comes after, from this.
mod process;

use std::{collections::HashMap, future::Future, time::Duration};

use aya::maps::{MapData, RingBuf};
use profiler_common::{COMM_LEN, SampleEvent, flags};
use tokio::io::unix::AsyncFd;

pub use process::{ProcessTable, UserFile, UserLoc};

/// A sample as received, with its stacks interned but not yet symbolized.
#[derive(Clone, Copy, Debug)]
pub struct RawSample {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    pub cgroup_id: u64,
    /// Index into `Collection::comms`.
    pub comm: u32,
    /// Index into `Collection::kstacks`.
    pub kstack: u32,
    /// Index into `Collection::ustacks`.
    pub ustack: u32,
}

/// Raw stacks stored once each. Addresses are leaf first; every frame but the leaf is a return
/// address, already moved back by one byte so it falls inside the call instruction.
#[derive(Default)]
pub struct StackTable<K> {
    ids: HashMap<K, u32>,
    pub stacks: Vec<K>,
}

impl<K: std::hash::Hash + Eq + Clone> StackTable<K> {
    fn intern(&mut self, key: K) -> u32 {
        let next = self.stacks.len() as u32;
        *self.ids.entry(key.clone()).or_insert_with(|| {
            self.stacks.push(key);
            next
        })
    }
}

/// Which samples the user wants, beyond the in-kernel pid filter.
#[derive(Clone, Debug, Default)]
pub struct CommFilter(pub Vec<String>);

impl CommFilter {
    fn wants(&self, comm: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|c| c == comm)
    }
}

/// Everything collected during a recording.
#[derive(Default)]
pub struct Collection {
    pub samples: Vec<RawSample>,
    pub comms: Vec<String>,
    comm_ids: HashMap<[u8; COMM_LEN], Option<u32>>,
    pub kstacks: StackTable<Box<[u64]>>,
    /// User stacks are per address space, so keyed by pid too.
    pub ustacks: StackTable<(u32, Box<[u64]>)>,
    pub processes: ProcessTable,
    /// Samples dropped by the comm filter.
    pub filtered: u64,
    pub kstack_failed: u64,
    pub ustack_failed: u64,
    filter: CommFilter,
}

impl Collection {
    pub fn new(filter: CommFilter) -> Self {
        Self { filter, ..Self::default() }
    }

    /// Reads everything in the ring buffer now.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            if item.len() < size_of::<SampleEvent>() {
                continue; // cannot happen with our own program; never trust a length blindly
            }
            // SAFETY: the record holds a SampleEvent written by our program (length checked);
            // read_unaligned because ring buffer records are only 8-byte aligned by convention.
            let ev = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<SampleEvent>()) };
            drop(item);
            self.add(&ev);
        }
    }

    fn add(&mut self, ev: &SampleEvent) {
        let Some(comm) = self.comm_id(&ev.comm) else {
            self.filtered += 1;
            return;
        };
        self.kstack_failed += u64::from(ev.flags & flags::KSTACK_FAILED != 0);
        self.ustack_failed += u64::from(ev.flags & flags::USTACK_FAILED != 0);
        let klen = (ev.kstack_len as usize).min(ev.kstack.len());
        let ulen = (ev.ustack_len as usize).min(ev.ustack.len());
        let kstack = self.kstacks.intern(callsites(&ev.kstack[..klen]));
        let user = callsites(&ev.ustack[..ulen]);
        self.processes.saw(ev.pid, &user);
        let ustack = self.ustacks.intern((ev.pid, user));
        self.samples.push(RawSample {
            time_ns: ev.time_ns,
            cpu: ev.cpu,
            pid: ev.pid,
            tid: ev.tid,
            cgroup_id: ev.cgroup_id,
            comm,
            kstack,
            ustack,
        });
    }

    /// Interns a comm; None when the comm filter rejects it (decided once per comm).
    fn comm_id(&mut self, raw: &[u8; COMM_LEN]) -> Option<u32> {
        if let Some(&id) = self.comm_ids.get(raw) {
            return id;
        }
        let comm = crate::util::comm_str(raw);
        let id = self.filter.wants(&comm).then(|| {
            self.comms.push(comm);
            self.comms.len() as u32 - 1
        });
        self.comm_ids.insert(*raw, id);
        id
    }

    /// Drains the ring buffer as data arrives until `stop` completes, resolving new user
    /// addresses against live processes every `tick` and calling `on_tick` (for progress).
    pub async fn run_until(
        &mut self,
        ring: &mut AsyncFd<RingBuf<MapData>>,
        stop: impl Future<Output = ()>,
        tick: Duration,
        mut on_tick: impl FnMut(&Collection),
    ) -> std::io::Result<()> {
        let mut ticker = tokio::time::interval(tick);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    self.drain(guard.get_inner_mut());
                    guard.clear_ready();
                }
                _ = ticker.tick() => {
                    self.processes.resolve_pending();
                    on_tick(self);
                }
                () = &mut stop => return Ok(()),
            }
        }
    }
}

/// Leaf first; return addresses moved back into their call instruction.
fn callsites(addrs: &[u64]) -> Box<[u64]> {
    addrs.iter().enumerate().map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) }).collect()
}
