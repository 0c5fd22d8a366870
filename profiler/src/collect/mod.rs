//! Second stage: drain the sampler's ring buffer as samples arrive (tokio), intern their raw
//! stacks, and note what must be read while a process still lives: its exe, and where each
//! user address falls in its mappings (`process`). Symbolization comes after, from this.
pub mod cgroup;
mod perfmap;
mod process;

use std::{collections::HashMap, future::Future, time::Duration};

use aya::maps::{MapData, RingBuf};
use profiler_common::{COMM_LEN, HEADER_BYTES, SampleHeader, flags};
use tokio::io::unix::AsyncFd;

pub use process::{ProcessTable, UserFile, UserLoc, procmap_query_supported};

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

/// `--cgroup` targets filtered here rather than in the kernel (cgroup v1 ones, or all of them
/// when v1 and v2 are mixed): a process is kept when /proc/PID/cgroup puts it in one of them
/// or below, decided at its first sample.
#[derive(Clone, Debug, Default)]
pub struct CgroupFilter {
    targets: Vec<cgroup::CgroupTarget>,
    decided: HashMap<u32, bool>,
}

impl CgroupFilter {
    pub fn new(targets: Vec<cgroup::CgroupTarget>) -> Self {
        Self {
            targets,
            decided: HashMap::new(),
        }
    }

    fn wants(&mut self, pid: u32) -> bool {
        if self.targets.is_empty() {
            return true;
        }
        let targets = &self.targets;
        *self.decided.entry(pid).or_insert_with(|| {
            // The idle task (pid 0) has no /proc entry; it is in every root cgroup.
            let text = match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                Ok(t) => t,
                Err(_) if pid == 0 => return targets.iter().any(|t| t.path == "/"),
                Err(_) => return false, // gone before we looked: cannot tell
            };
            targets.iter().any(|t| t.contains(&text))
        })
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
    /// Paths of the cgroup v2 ids samples carry ("" if the cgroup was gone); `resolve_cgroups`.
    pub cgroup_paths: HashMap<u64, String>,
    /// Samples dropped by the comm filter or the userspace cgroup filter.
    pub filtered: u64,
    pub kstack_failed: u64,
    pub ustack_failed: u64,
    filter: CommFilter,
    cgroup_filter: CgroupFilter,
}

impl Collection {
    pub fn new(filter: CommFilter) -> Self {
        Self {
            filter,
            ..Self::default()
        }
    }

    /// Keeps only samples of processes in these cgroups (see `CgroupFilter`).
    pub fn with_cgroup_filter(mut self, filter: CgroupFilter) -> Self {
        self.cgroup_filter = filter;
        self
    }

    /// Finds the path of every cgroup id seen so far.
    pub fn resolve_cgroups(&mut self) {
        let mut ids: Vec<u64> = self.samples.iter().map(|s| s.cgroup_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.retain(|id| self.cgroup_paths.get(id).is_none_or(|p| p.is_empty()));
        let found = cgroup::cgroup2_paths(&ids);
        for id in ids {
            self.cgroup_paths
                .insert(id, found.get(&id).cloned().unwrap_or_default());
        }
    }

    /// Reads everything in the ring buffer now.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            self.add(&item);
        }
    }

    /// One record: a `SampleHeader`, then the kernel and user addresses (profiler-common).
    fn add(&mut self, record: &[u8]) {
        let Some(head_bytes) = record.get(..HEADER_BYTES) else {
            return;
        };
        // SAFETY: HEADER_BYTES bytes of a SampleHeader written by our program; read_unaligned
        // because nothing promises the record's alignment.
        let h = unsafe { std::ptr::read_unaligned(head_bytes.as_ptr().cast::<SampleHeader>()) };
        let (klen, ulen) = (h.kstack_len as usize, h.ustack_len as usize);
        let Some(frames) = record.get(HEADER_BYTES..HEADER_BYTES + (klen + ulen) * 8) else {
            return; // cannot happen with our own program; never trust a length blindly
        };
        let Some(comm) = self.comm_id(&h.comm) else {
            self.filtered += 1;
            return;
        };
        if !self.cgroup_filter.wants(h.pid) {
            self.filtered += 1;
            return;
        }
        self.kstack_failed += u64::from(h.flags & flags::KSTACK_FAILED != 0);
        self.ustack_failed += u64::from(h.flags & flags::USTACK_FAILED != 0);
        let (kframes, uframes) = frames.split_at(klen * 8);
        let kstack = self.kstacks.intern(callsites(kframes));
        let user = callsites(uframes);
        self.processes.saw(h.pid, &user);
        let ustack = self.ustacks.intern((h.pid, user));
        self.samples.push(RawSample {
            time_ns: h.time_ns,
            cpu: h.cpu,
            pid: h.pid,
            tid: h.tid,
            cgroup_id: h.cgroup_id,
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
                    // Woken early: a new process (or a full buffer). Read its mappings now,
                    // while it surely lives.
                    self.processes.resolve_pending();
                }
                _ = ticker.tick() => {
                    // The sampler rarely wakes us (see profiler-ebpf): drain on the timer.
                    self.drain(ring.get_mut());
                    self.processes.resolve_pending();
                    on_tick(self);
                }
                () = &mut stop => return Ok(()),
            }
        }
    }
}

/// Native-endian u64 addresses, leaf first; return addresses moved back into their call
/// instruction so they symbolize to the caller even when the call is a function's last one.
fn callsites(bytes: &[u8]) -> Box<[u64]> {
    bytes
        .chunks_exact(8)
        .enumerate()
        .map(|(i, b)| {
            let a = u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            if i == 0 { a } else { a.saturating_sub(1) }
        })
        .collect()
}
