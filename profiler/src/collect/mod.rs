//! Second stage: drain the sampler's ring buffer as samples arrive (tokio) and intern their
//! raw stacks, handing the process facts that come with them (the kernel's records, exit
//! statuses, the addresses samples reach) to `process` while the processes still live.
//! Symbolization comes after, from what a cut hands on (`Collected`).
mod cgroup_paths;
mod collected;
mod copies;
mod filters;
mod frames;

use std::{collections::HashMap, future::Future, time::Duration};

use aya::maps::{MapData, RingBuf};
use profiler_common::{
    COMM_LEN, HEADER_BYTES, SampleHeader, flags, python::PyFrame, unwind::reason,
};
use tokio::io::unix::AsyncFd;

use cgroup_paths::CgroupPaths;
pub(crate) use collected::{Collected, Counts};
pub(crate) use filters::{CgroupFilter, CommFilter};
pub(crate) use frames::truncation_name;
use frames::{callsites, callsites_of, py_frames, with_truncation_marker};

use crate::process::{
    KernelRecord, NewProcessHook, ProcessEvent, ProcessEvents, ProcessTable, SpaceId, TableBounds,
    mapped_and_exited, sampled_pids,
};

/// Whole records read from a ring, back to back, with where each ends.
#[derive(Default)]
struct Records {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Records {
    /// Appends every record the ring holds now.
    fn read(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            self.bytes.extend_from_slice(&item);
            self.ends.push(self.bytes.len());
        }
    }

    /// Moves `other`'s records after these.
    fn append(&mut self, other: &mut Self) {
        let base = self.bytes.len();
        self.bytes.append(&mut other.bytes);
        self.ends.extend(other.ends.drain(..).map(|e| e + base));
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.bytes[start..end])
    }
}

/// A sample as received, with its stacks interned but not yet symbolized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawSample {
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
    /// Index into `Collection::pystacks` (an empty stack when the sample has none).
    pub pystack: u32,
}

/// Raw stacks stored once each. Addresses are leaf first; every frame but the leaf is a return
/// address, already moved back by one byte so it falls inside the call instruction.
pub(crate) type StackTable<K> = crate::util::Dense<K>;

/// The live collector: what was collected since the last cut, and the state that lives on
/// from one cut to the next (the process table, the kernel records, the Python tracker, the
/// filters). `cut` hands the collected part on as a `Collected`.
#[derive(Default)]
pub(crate) struct Collection {
    samples: Vec<RawSample>,
    comms: Vec<String>,
    comm_ids: HashMap<[u8; COMM_LEN], Option<u32>>,
    kstacks: StackTable<Box<[u64]>>,
    /// User stacks are per address space, so keyed by it too (pid, and which exec).
    ustacks: StackTable<(SpaceId, Box<[u64]>)>,
    /// Python frames (innermost first), per address space like user stacks: names are
    /// per generation of a process.
    pystacks: StackTable<(SpaceId, Box<[PyFrame]>)>,
    /// Detects, registers and names Python processes; None when Python frames are off.
    python: Option<crate::python::Tracker>,
    processes: ProcessTable,
    /// The kernel's process records and exit statuses, read before each batch of samples.
    events: ProcessEvents,
    /// CLOCK_MONOTONIC ns when the kernel's process records were last read: every exec and
    /// exit before it is known (Python naming checks its generations against it).
    records_read_ns: u64,
    /// The processes the last drain's records saw exit (pid, time of the last exit).
    exits: crate::util::FxMap<u32, u64>,
    /// Sample records read from the ring, waiting for the process records before them.
    batch: Records,
    /// Sample records read from the ring while a window's end waited (`hold`), added first
    /// by the next `drain`.
    held: Records,
    cgroup_paths: CgroupPaths,
    /// Since the last cut (`lost_records` is the process table's).
    counts: Counts,
    filter: CommFilter,
    cgroup_filter: CgroupFilter,
    /// Told of each process's first sample, of samples whose table walk found an address
    /// outside its loaded mappings, of new mappings and of exits (the table walk loads
    /// mappings there: `unwind::BackgroundLoader`).
    new_process_hook: Option<NewProcessHook>,
    /// Walks the stack copies of samples taken before their process's tables were in the
    /// kernel (`flags::STACK_COPY`); None without table walks.
    copies: Option<crate::unwind::CopyUnwinder>,
    /// Readable when the kernel's record rings fill (`ProcessEvents::half_full`), made at the
    /// first `run_until`.
    records_full: Option<AsyncFd<std::os::fd::OwnedFd>>,
}

impl Collection {
    pub(crate) fn new(filter: CommFilter) -> Self {
        Self {
            filter,
            ..Self::default()
        }
    }

    /// Takes what was collected since the last cut (samples, stacks, comms, counts), with the
    /// process facts its addresses need (shared or copied), as a `Collected` that symbolizes
    /// on another thread; lifetimes become offsets from `start_mono_ns`, the span's start.
    /// The process table, the kernel records, the Python tracker and the filters stay here.
    pub(crate) fn cut(&mut self, start_mono_ns: u64) -> Collected {
        let mut counts = std::mem::take(&mut self.counts);
        counts.lost_records = std::mem::take(&mut self.processes.lost_records);
        let lifetimes = self.processes.take_lifetimes().to_profile(start_mono_ns);
        let mut window = Collected {
            samples: std::mem::take(&mut self.samples),
            comms: std::mem::take(&mut self.comms),
            kstacks: std::mem::take(&mut self.kstacks),
            ustacks: std::mem::take(&mut self.ustacks),
            pystacks: std::mem::take(&mut self.pystacks),
            counts,
            ..Collected::default()
        };
        // Comm ids index `comms`, which went with the window.
        self.comm_ids.clear();
        self.fill_window(&mut window);
        window.facts.lifetimes = lifetimes;
        window
            .facts
            .lifetimes
            .retain(|l| self.filter.wants(&l.comm));
        self.cgroup_paths.bound();
        window
    }

    /// The samples taken at or after `since_ns` (monotonic) as a `Collected` of their own,
    /// leaving this one as it is: a profile of part of a window (the agent's
    /// /debug/pprof/profile), without lifetimes or counts (they belong to the window).
    pub(crate) fn copy_since(&mut self, since_ns: u64) -> Collected {
        let mut copy = Collected {
            samples: self
                .samples
                .iter()
                .filter(|s| s.time_ns >= since_ns)
                .copied()
                .collect(),
            comms: self.comms.clone(),
            kstacks: self.kstacks.clone(),
            ustacks: self.ustacks.clone(),
            pystacks: self.pystacks.clone(),
            ..Collected::default()
        };
        self.fill_window(&mut copy);
        copy
    }

    /// What a cut needs besides its samples and stacks: the process facts its addresses
    /// need, its Python names and its cgroup paths.
    fn fill_window(&mut self, window: &mut Collected) {
        let addrs = window
            .ustacks
            .items()
            .iter()
            .flat_map(|(space, addrs)| addrs.iter().map(move |a| (*space, *a)));
        window.facts = self.processes.window_facts(addrs);
        if let Some(t) = &self.python {
            window.py_names = window
                .pystacks
                .items()
                .iter()
                .flat_map(|(space, frames)| {
                    frames.iter().map(move |f| {
                        (
                            *space,
                            f.code,
                            f.instr & !profiler_common::python::ENTRY_BIT,
                        )
                    })
                })
                .filter_map(|k| t.names().get(&k).map(|n| (k, n.clone())))
                .collect();
        }
        window.cgroup_paths = self
            .cgroup_paths
            .of(window.samples.iter().map(|s| s.cgroup_id));
    }

    /// Samples collected since the last cut.
    pub(crate) fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// What was dropped or cut short since the last cut, and the process records lost.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            lost_records: self.processes.lost_records,
            ..self.counts
        }
    }

    /// Reads the kernel's process records and exit statuses from these before each batch.
    pub(crate) fn with_events(mut self, events: ProcessEvents) -> Self {
        self.events = events;
        self
    }

    /// Names Python frames with this tracker.
    pub(crate) fn with_python(mut self, tracker: crate::python::Tracker) -> Self {
        self.python = Some(tracker);
        self
    }

    /// The Python tracker, when Python frames are on.
    pub(crate) fn python(&self) -> Option<&crate::python::Tracker> {
        self.python.as_ref()
    }

    /// Resolves everything seen so far that must be read while its process lives: user
    /// addresses (mappings), Python processes and frames, JIT names (perf maps, read on a
    /// blocking thread: they are the processes' own files), and cgroup paths.
    pub(crate) async fn resolve(&mut self) -> std::io::Result<()> {
        self.processes.resolve_pending();
        self.resolve_python();
        self.processes.name_jit_code().await?;
        self.cgroup_paths
            .resolve(self.samples.iter().map(|s| s.cgroup_id));
        Ok(())
    }

    /// Forgets exited processes (and the Python names of generations that exec'd or
    /// exited); starts the table afresh when it outgrows `bounds` (then returns true: names
    /// cached by file id must go too). Call after a cut: the window took what it needs.
    pub(crate) fn prune(&mut self, bounds: TableBounds) -> bool {
        // One listing of /proc, not a stat of /proc/PID for each pid in the tables: under
        // churn those are mostly processes gone since the last window (600 a window at 60 new
        // processes a second), each stat of a missing path a failed lookup. The tables are
        // keyed by process (thread-group) id, which is what /proc lists. No new pid can enter
        // the tables meanwhile: this thread fills them.
        let listed: Option<std::collections::HashSet<u32>> =
            crate::util::proc_pids().ok().map(Iterator::collect);
        let mut alive: HashMap<u32, bool> = HashMap::new();
        let mut is_alive = |pid: u32| {
            *alive.entry(pid).or_insert_with(|| match &listed {
                Some(listed) => listed.contains(&pid),
                None => std::path::Path::new(&format!("/proc/{pid}")).exists(),
            })
        };
        let reset = self.processes.prune(&mut is_alive, bounds);
        // Generations are numbered by the mappings table: what it forgets (or, reset,
        // numbers afresh) the Python names must forget too, or a reused number would find
        // them.
        if let Some(t) = self.python.as_mut() {
            t.forget_gone(|pid| reset || !is_alive(pid));
        }
        reset
    }

    /// Keeps only samples of processes in these cgroups (see `CgroupFilter`).
    /// Tells `hook` of each new process's first sample, its mappings and its exit
    /// (`unwind::ProcessEvent`).
    pub(crate) fn on_new_process(mut self, hook: NewProcessHook) -> Self {
        self.new_process_hook = Some(hook);
        self
    }

    pub(crate) fn with_cgroup_filter(mut self, filter: CgroupFilter) -> Self {
        self.cgroup_filter = filter;
        self
    }

    /// When `drain` last finished reading the ring (CLOCK_MONOTONIC ns).
    pub(crate) fn drained_at_ns(&self) -> u64 {
        self.records_read_ns
    }

    /// Reads everything in the ring buffer now: the samples, then the kernel's process
    /// records, then the samples are added. Every record a sample depends on (the mapping
    /// its code is in, its process's exec) was written before it, so it is read by then.
    pub(crate) fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        // Held records first.
        batch.append(&mut self.held);
        batch.read(ring);
        self.records_read_ns = crate::util::monotonic_ns();
        let sampled = sampled_pids(&batch.bytes, &batch.ends);
        self.events
            .read_into(&mut self.processes, &sampled, self.records_read_ns);
        self.tell_python_ends();
        self.tell_mappings();
        for record in batch.iter() {
            self.add(record);
        }
        self.batch = batch;
        self.add_deferred(false);
        // After the samples: a process's last samples come before its exit record.
        if let Some(hook) = self.new_process_hook.as_mut() {
            for &pid in self.exits.keys() {
                hook(ProcessEvent::Exited { pid });
            }
        }
    }

    /// Tells the Python tracker of every exec and exit just read: the generation that ended
    /// must not be walked or named with the next one's image.
    fn tell_python_ends(&mut self) {
        let Some(tracker) = self.python.as_mut() else {
            return;
        };
        let unseen = self.events.unseen();
        for r in self.events.records() {
            let (pid, time_ns) = match r {
                // Never sampled: the tracker never heard of it, nor will.
                KernelRecord::Exec { pid, .. }
                | KernelRecord::Exit { pid, .. }
                | KernelRecord::Map { pid, .. }
                    if unseen.contains(pid) =>
                {
                    continue;
                }
                KernelRecord::Exec { pid, time_ns, .. } | KernelRecord::Exit { pid, time_ns } => {
                    (*pid, *time_ns)
                }
                // A generation sampled before it mapped its interpreter (a libpython that
                // ld.so or dlopen maps after the first sample): detect it now.
                KernelRecord::Map {
                    pid, time_ns, path, ..
                } if crate::process::interpreter_named(path) => {
                    tracker.mapped_interpreter(self.processes.space_at(*pid, *time_ns));
                    continue;
                }
                _ => continue,
            };
            // An exec's time starts the new generation: the one before it ended.
            let ended = self.processes.space_at(pid, time_ns.saturating_sub(1));
            tracker.ended(pid, ended, time_ns);
        }
    }

    /// Tells the hook of every process whose mappings the records just read changed (with
    /// its whole space, when the records hold all of it); keeps the exits in `exits`. One
    /// whose exit the same records hold is not told: under churn most new processes live
    /// and die between two drains, and loading them cost a map update and a removal each.
    fn tell_mappings(&mut self) {
        self.exits.clear();
        let Some(hook) = self.new_process_hook.as_mut() else {
            return;
        };
        let mapped = mapped_and_exited(self.events.records(), &mut self.exits);
        // Never handed to the loader (gone before any sample or drain): nothing to forget.
        let unseen = self.events.unseen();
        self.exits.retain(|pid, _| !unseen.contains(pid));
        for pid in mapped {
            let mappings = self.processes.unwind_mappings(pid, u64::MAX);
            hook(ProcessEvent::Mapped { pid, mappings });
        }
    }

    /// Tells the unwind loader's hook of a sample of a process it has not seen, or whose walk
    /// left its loaded mappings (`stale`), with the user addresses the walk reached.
    fn tell_sampled(&mut self, h: &SampleHeader, uframes: &[u8], stale: bool) {
        if let Some(hook) = self.new_process_hook.as_mut()
            && h.pid != 0
            && (stale || !self.processes.knows(h.pid))
        {
            hook(ProcessEvent::Sampled {
                pid: h.pid,
                gone: self.exits.get(&h.pid).is_some_and(|&t| t >= h.time_ns),
                reached: callsites(uframes).into_vec(),
                // Now, not at the sample: the entry is for samples to come, and one from before
                // an exec read now would replace the mappings `tell_mappings` just gave.
                mappings: self.processes.unwind_mappings(h.pid, u64::MAX),
            });
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
        let plen = h.py_len as usize;
        let frames_end = HEADER_BYTES + (klen + ulen + 2 * plen) * 8;
        let Some(frames) = record.get(HEADER_BYTES..frames_end) else {
            return; // cannot happen with our own program; never trust a length blindly
        };
        let Some(comm) = self.comm_id(&h.comm) else {
            self.counts.filtered += 1;
            return;
        };
        if !self.cgroup_filter.wants(h.pid) {
            self.counts.filtered += 1;
            return;
        }
        let cut = (h.flags & flags::UNWIND_REASON_MASK) >> flags::UNWIND_REASON_SHIFT;
        // A walk that left the loaded mappings: read too early (before ld.so mapped the
        // libraries), or a library dlopened since. The hook reads them again (not too often).
        self.tell_sampled(
            &h,
            &frames[klen * 8..(klen + ulen) * 8],
            cut == reason::NO_MAPPING,
        );
        // Taken before the process's tables were in the kernel: walk the copy of its stack
        // (now, or once its tables are compiled: the record waits, `add_deferred`).
        let mut walked = None;
        if h.flags & flags::STACK_COPY != 0
            && let Some(unwinder) = self.copies.as_mut()
        {
            let mappings = self.processes.unwind_mappings(h.pid, h.time_ns);
            match unwinder.offer(record, frames_end, h.pid, mappings) {
                crate::unwind::copied::Offer::Deferred => return,
                crate::unwind::copied::Offer::Walked(frames, why) => {
                    self.counts.copy_walks.add(why);
                    walked = Some((frames, why));
                }
            }
        }
        self.counts.kstack_failed += u64::from(h.flags & flags::KSTACK_FAILED != 0);
        self.counts.ustack_failed += u64::from(h.flags & flags::USTACK_FAILED != 0);
        let (kframes, rest) = frames.split_at(klen * 8);
        let (uframes, pframes) = rest.split_at(ulen * 8);
        let kstack = self.kstacks.intern(callsites(kframes));
        let mut user = callsites(uframes);
        let mut user_cut = cut;
        // Left the kernel's entry at an address the records map (a library ld.so mapped after
        // the entry was written), its copy refused: not loaded yet. "No mapping" is for none.
        if cut == reason::NO_MAPPING
            && walked.is_none()
            && user
                .last()
                .is_some_and(|&pc| self.processes.maps_address(h.pid, h.time_ns, pc))
        {
            user_cut = reason::NOT_LOADED;
        }
        // The frame-pointer walk stays when it went further (a table missing here).
        if let Some((frames, why)) = walked
            && (why == reason::NONE || frames.len() > user.len())
        {
            user = callsites_of(frames.into_iter());
            user_cut = why;
        }
        self.counts.unwind_truncated.add(user_cut);
        let space = self.processes.saw(h.pid, h.time_ns, &user);
        let user = with_truncation_marker(user, user_cut);
        let ustack = self.ustacks.intern((space, user));
        let python = py_frames(pframes);
        self.counts.py_truncated += u64::from(h.py_flags != 0);
        if let Some(tracker) = &mut self.python {
            let table = &self.processes;
            tracker.saw(space, &python, || table.may_run_python(space));
        }
        let pystack = self.pystacks.intern((space, python));
        self.samples.push(RawSample {
            time_ns: h.time_ns,
            cpu: h.cpu,
            pid: h.pid,
            tid: h.tid,
            cgroup_id: h.cgroup_id,
            comm,
            kstack,
            ustack,
            pystack,
        });
    }

    /// Registers new Python processes and names new Python frames (they must still live).
    fn resolve_python(&mut self) {
        if let Some(t) = &mut self.python {
            let table = &self.processes;
            t.resolve_pending(|pid, time| table.space_at(pid, time), self.records_read_ns);
        }
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
    pub(crate) async fn run_until(
        &mut self,
        ring: &mut AsyncFd<RingBuf<MapData>>,
        stop: impl Future<Output = ()>,
        tick: Duration,
        on_tick: impl FnMut(&Collection),
    ) -> std::io::Result<()> {
        let records_full = self.records_full.take().or_else(|| {
            let fd = self.events.half_full()?;
            // SAFETY: the AsyncFd owns its descriptor (a dup of the epoll set) until it drops.
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
        });
        let result = self
            .drain_until(ring, records_full.as_ref(), stop, tick, on_tick)
            .await;
        self.records_full = records_full;
        result
    }

    async fn drain_until(
        &mut self,
        ring: &mut AsyncFd<RingBuf<MapData>>,
        records_full: Option<&AsyncFd<std::os::fd::OwnedFd>>,
        stop: impl Future<Output = ()>,
        tick: Duration,
        mut on_tick: impl FnMut(&Collection),
    ) -> std::io::Result<()> {
        let mut ticker = crate::util::Ticker::new(tick)?;
        tokio::pin!(stop);
        // At once, then every `tick` (as a tokio interval ticks).
        let mut first = Some(());
        loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    self.drain(guard.get_inner_mut());
                    guard.clear_ready();
                    // Woken early: a new process (or a full buffer). Its mappings come from
                    // the kernel's records now; only processes from before the recording are
                    // read from /proc, which is best done while they surely live.
                    // Python first: a new Python process's samples lack frames until then.
                    self.resolve_python();
                    self.processes.resolve_pending();
                }
                guard = async {
                    match records_full {
                        Some(fd) => fd.readable().await,
                        None => std::future::pending().await,
                    }
                } => {
                    // Cleared first: a ring filling while we drain wakes us again.
                    guard?.clear_ready();
                    self.drain(ring.get_mut());
                    self.resolve_python();
                    self.processes.resolve_pending();
                }
                r = async {
                    match first.take() {
                        Some(()) => Ok(()),
                        None => ticker.tick().await,
                    }
                } => {
                    r?;
                    // The sampler rarely wakes us (see profiler-ebpf): drain on the timer.
                    self.drain(ring.get_mut());
                    self.processes.resolve_pending();
                    self.resolve_python();
                    on_tick(self);
                }
                () = &mut stop => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests;
