//! Process facts from the kernel as they happen, the way perf gets them: a "dummy" software
//! perf event on every CPU that counts nothing but carries the kernel's side-band records —
//! executable mappings with their build id (MMAP2), exec (COMM with the exec bit), fork and
//! exit — in a memory-mapped ring buffer per CPU. The collector reads them before it resolves
//! the samples' addresses (`ProcessTable`), so no process can exit before its mappings are
//! known. Times are CLOCK_MONOTONIC, like the samples'.
use std::{io, os::fd::AsRawFd as _, os::fd::FromRawFd as _, os::fd::OwnedFd};

use profiler_common::perf::{self, EventAttr, attr_bit as bit};

use crate::util::page_size;

/// One side-band record, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KernelRecord {
    /// An executable mapping (PROT_EXEC) of a file.
    Map {
        pid: u32,
        time_ns: u64,
        start: u64,
        end: u64,
        /// Offset in the file of `start`, bytes.
        pgoff: u64,
        path: String,
        id: FileIdentity,
    },
    /// `pid` ran execve: its mappings are replaced (the new ones follow).
    Exec {
        pid: u32,
        time_ns: u64,
        comm: String,
    },
    /// A new process `pid` forked from `ppid` (threads are not reported).
    Fork { pid: u32, ppid: u32, time_ns: u64 },
    /// Process `pid` exited (its leader thread did).
    Exit { pid: u32, time_ns: u64 },
    /// The kernel dropped this many records: a ring buffer was full.
    Lost(u64),
}

/// What the kernel says identifies a mapped file: its build id when it could read it from
/// memory, else the device and inode.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FileIdentity {
    BuildId(BuildId),
    /// (device as `makedev(major, minor)`, inode).
    Inode(u64, u64),
}

/// A build id as MMAP2 carries it: at most 20 bytes, kept inline (one allocation fewer per
/// mapping record, several per new process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BuildId {
    len: u8,
    bytes: [u8; 20],
}

impl BuildId {
    /// The first 20 bytes of `id` (the most MMAP2 holds).
    pub(crate) fn new(id: &[u8]) -> Self {
        let mut bytes = [0; 20];
        let len = id.len().min(20);
        bytes[..len].copy_from_slice(&id[..len]);
        Self {
            len: len as u8,
            bytes,
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

// Record types of the perf ring (linux/perf_event.h).
const RECORD_LOST: u32 = 2;
const RECORD_COMM: u32 = 3;
const RECORD_EXIT: u32 = 4;
const RECORD_FORK: u32 = 7;
const RECORD_MMAP2: u32 = 10;
const MISC_COMM_EXEC: u16 = 1 << 13;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// One CPU's dummy event and its ring buffer (`1 + 2^n` pages: a control page, then data).
struct CpuRing {
    fd: OwnedFd,
    base: *mut u8,
    map_len: usize,
    data_len: usize,
}

// SAFETY: the mapping is owned by this value alone; it is read and advanced only through
// `&mut self`.
unsafe impl Send for CpuRing {}

impl Drop for CpuRing {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `open` mapped; the fd closes after.
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}

/// The side-band readers on every CPU.
pub(crate) struct KernelRecords {
    rings: Vec<CpuRing>,
    /// An epoll set of the rings, readable once one of them is half full (`half_full`).
    epoll: OwnedFd,
    /// A record being reassembled when it wraps around the end of a ring.
    scratch: Vec<u8>,
    /// Scratch space of the sort into time order (`util::sort_stable_by_key`).
    order: Vec<(u64, u32)>,
}

/// perf_event_open(2) of `attr` system-wide on `cpu`.
fn open_event(attr: &EventAttr, cpu: u32) -> io::Result<OwnedFd> {
    // SAFETY: perf_event_open(2) with a fully initialised attr of the size it states.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            std::ptr::from_ref(attr),
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            perf::FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl KernelRecords {
    /// Opens the dummy event on each of `cpus` with `data_bytes` of ring each (a power of two
    /// multiple of the page size). Needs CAP_PERFMON (or root) for system-wide events.
    pub(crate) fn open(cpus: &[u32], data_bytes: usize) -> io::Result<Self> {
        let page = page_size();
        let data_len = data_bytes.max(page).next_power_of_two();
        let mut attr = EventAttr {
            sample_type: perf::SAMPLE_TID | perf::SAMPLE_TIME,
            flags: bit::DISABLED
                | bit::MMAP
                | bit::MMAP2
                | bit::BUILD_ID
                | bit::COMM
                | bit::COMM_EXEC
                | bit::TASK
                | bit::SAMPLE_ID_ALL
                | bit::USE_CLOCKID
                | bit::WATERMARK,
            // The collector reads on its own timer and when samples wake it; a ring half
            // full wakes it too (`half_full`), before a burst of processes overflows it.
            wakeup_watermark: u32::try_from(data_len / 2).unwrap_or(u32::MAX),
            clockid: libc::CLOCK_MONOTONIC,
            ..EventAttr::software(perf::COUNT_SW_DUMMY)
        };
        let mut rings = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let fd = match open_event(&attr, cpu) {
                // Build ids in mmap records came with Linux 5.12; an older kernel refuses the
                // bit, and its records name files by device and inode instead.
                Err(e) if rings.is_empty() && e.raw_os_error() == Some(libc::EINVAL) => {
                    log::info!(
                        "mmap records without build ids (Linux 5.12+): files are identified \
                         by device and inode"
                    );
                    attr.flags &= !bit::BUILD_ID;
                    open_event(&attr, cpu)?
                }
                other => other?,
            };
            let map_len = page + data_len;
            // SAFETY: mapping the event's ring as perf_event_open(2) describes; writable so
            // that we can move data_tail (the kernel then never overwrites unread records).
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            rings.push(CpuRing {
                fd,
                base: base.cast(),
                map_len,
                data_len,
            });
        }
        // SAFETY: epoll_create1(2) has no preconditions; the new descriptor is ours.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor we own.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        for ring in &rings {
            let mut event = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 0,
            };
            // SAFETY: adding an open descriptor of ours to our epoll set.
            let added = unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    ring.fd.as_raw_fd(),
                    &raw mut event,
                )
            };
            if added < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        for ring in &rings {
            // SAFETY: PERF_EVENT_IOC_ENABLE on our own event.
            if unsafe { libc::ioctl(ring.fd.as_raw_fd(), perf_ioc_enable(), 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Self {
            rings,
            epoll,
            scratch: Vec::new(),
            order: Vec::new(),
        })
    }

    /// A descriptor that polls readable once some CPU's ring is half full: a reader that
    /// drains on a long timer (the agent's) waits on it too, so a burst of new processes is
    /// read before the kernel has to drop records. Call `take_wakes` after each read.
    pub(crate) fn half_full(&self) -> io::Result<OwnedFd> {
        self.epoll.try_clone()
    }

    /// Consumes the rings' pending wake-ups, so `half_full` polls readable again only at the
    /// next ring to fill.
    pub(crate) fn take_wakes(&self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: epoll_wait(2) on our epoll set into a buffer of the length given; timeout 0.
        while unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), 8, 0) } == 8 {}
    }

    /// Decodes every record waiting on every CPU, in time order, into `out`.
    pub(crate) fn read(&mut self, out: &mut Vec<KernelRecord>) {
        let first = out.len();
        for ring in &mut self.rings {
            ring.read(&mut self.scratch, out);
        }
        // CPUs' rings interleave: a fork on one CPU precedes the child's exec on another.
        crate::util::sort_stable_by_key(&mut out[first..], KernelRecord::time_ns, &mut self.order);
    }
}

impl KernelRecord {
    fn time_ns(&self) -> u64 {
        match self {
            Self::Map { time_ns, .. }
            | Self::Exec { time_ns, .. }
            | Self::Fork { time_ns, .. }
            | Self::Exit { time_ns, .. } => *time_ns,
            Self::Lost(_) => 0,
        }
    }
}

impl CpuRing {
    fn read(&mut self, scratch: &mut Vec<u8>, out: &mut Vec<KernelRecord>) {
        // struct perf_event_mmap_page: data_head at 1024, data_tail at 1032.
        // SAFETY: both are u64 fields of the mapped control page, shared with the kernel,
        // accessed atomically with the orderings the ABI asks for.
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "the control page is page-aligned, so offsets 1024 and 1032 are 8-aligned"
        )]
        let (head, tail) = unsafe {
            (
                &*self.base.add(1024).cast::<std::sync::atomic::AtomicU64>(),
                &*self.base.add(1032).cast::<std::sync::atomic::AtomicU64>(),
            )
        };
        let end = head.load(std::sync::atomic::Ordering::Acquire);
        let mut pos = tail.load(std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the data area follows the control page and is data_len bytes long.
        let data = unsafe {
            std::slice::from_raw_parts(self.base.add(page_size()).cast_const(), self.data_len)
        };
        let mask = self.data_len as u64 - 1;
        while end.saturating_sub(pos) >= 8 {
            let at = (pos & mask) as usize;
            let size = u16::from_ne_bytes([
                data[(at + 6) & mask as usize],
                data[(at + 7) & mask as usize],
            ]) as usize;
            if size < 8 || end - pos < size as u64 {
                break; // cannot happen with a sane kernel; never trust a length blindly
            }
            let record: &[u8] = if at + size <= data.len() {
                &data[at..at + size]
            } else {
                scratch.clear();
                scratch.extend_from_slice(&data[at..]);
                scratch.extend_from_slice(&data[..size - (data.len() - at)]);
                scratch
            };
            if let Some(r) = decode(record) {
                out.push(r);
            }
            pos += size as u64;
        }
        tail.store(pos, std::sync::atomic::Ordering::Release);
    }
}

/// One record: `struct perf_event_header` then the body, then (sample_id_all with TID|TIME)
/// pid, tid and time in its last 16 bytes.
fn decode(r: &[u8]) -> Option<KernelRecord> {
    let u16_at = |at: usize| Some(u16::from_ne_bytes(r.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_ne_bytes(r.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_ne_bytes(r.get(at..at + 8)?.try_into().ok()?));
    let (kind, misc) = (u32_at(0)?, u16_at(4)?);
    let time_ns = u64_at(r.len().checked_sub(8)?)?;
    let trailer = r.len().checked_sub(16)?;
    let cstr = |from: usize| -> Option<String> {
        let bytes = r.get(from..trailer)?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
    };
    match kind {
        RECORD_MMAP2 => {
            // pid, tid, addr, len, pgoff, {maj, min, ino, ino_generation | build id}, prot,
            // flags, filename.
            let (pid, start, len, pgoff) = (u32_at(8)?, u64_at(16)?, u64_at(24)?, u64_at(32)?);
            let prot = u32_at(64)?;
            if prot & libc::PROT_EXEC as u32 == 0 {
                return None;
            }
            let id = if misc & MISC_MMAP_BUILD_ID != 0 {
                let n = usize::from(*r.get(40)?).min(20);
                FileIdentity::BuildId(BuildId::new(r.get(44..44 + n)?))
            } else {
                let dev = libc::makedev(u32_at(40)?, u32_at(44)?);
                FileIdentity::Inode(dev, u64_at(48)?)
            };
            Some(KernelRecord::Map {
                pid,
                time_ns,
                start,
                end: start.checked_add(len)?,
                pgoff,
                path: cstr(72)?,
                id,
            })
        }
        RECORD_COMM if misc & MISC_COMM_EXEC != 0 => {
            // pid is the tgid: a thread other than the leader that execs takes its place.
            Some(KernelRecord::Exec {
                pid: u32_at(8)?,
                time_ns,
                comm: cstr(16)?,
            })
        }
        RECORD_FORK | RECORD_EXIT => {
            // pid, ppid, tid, ptid, time.
            let (pid, ppid, tid) = (u32_at(8)?, u32_at(12)?, u32_at(16)?);
            if pid != tid {
                return None; // a thread, not a process
            }
            Some(if kind == RECORD_FORK {
                KernelRecord::Fork { pid, ppid, time_ns }
            } else {
                KernelRecord::Exit { pid, time_ns }
            })
        }
        RECORD_LOST => Some(KernelRecord::Lost(u64_at(16)?)),
        _ => None,
    }
}

/// `_IO('$', 0)`.
const fn perf_ioc_enable() -> libc::Ioctl {
    0x2400 as libc::Ioctl
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the kernel lays it out: header, `body`, then pid, tid, time.
    fn record(kind: u32, misc: u16, body: &[u8], time_ns: u64) -> Vec<u8> {
        let size = 8 + body.len() + 16;
        let mut r = Vec::with_capacity(size);
        r.extend(kind.to_ne_bytes());
        r.extend(misc.to_ne_bytes());
        r.extend((size as u16).to_ne_bytes());
        r.extend(body);
        r.extend(7u32.to_ne_bytes());
        r.extend(7u32.to_ne_bytes());
        r.extend(time_ns.to_ne_bytes());
        r
    }

    fn mmap2(prot: u32, ident: [u8; 24], path: &str) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [7u32, 8] {
            b.extend(v.to_ne_bytes());
        }
        for v in [0x1000u64, 0x2000, 0x3000] {
            b.extend(v.to_ne_bytes()); // addr, len, pgoff
        }
        b.extend(ident);
        b.extend(prot.to_ne_bytes());
        b.extend(2u32.to_ne_bytes()); // MAP_PRIVATE
        let mut name = path.as_bytes().to_vec();
        name.resize(path.len().next_multiple_of(8).max(8), 0);
        b.extend(name);
        b
    }

    /// `half_full` polls readable once new processes fill half of a ring, and not before:
    /// the agent's long drain timer relies on it. Privileged (system-wide perf events):
    /// skipped without the right, failed instead under CI=true.
    #[test]
    fn a_half_full_ring_wakes_the_reader() {
        let cpus = aya::util::online_cpus().expect("online CPUs");
        let mut k = match KernelRecords::open(&cpus, 4 * page_size()) {
            Ok(k) => k,
            Err(e) => {
                assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{e}");
                eprintln!("skipped: cannot open system-wide perf events: {e}");
                return;
            }
        };
        let fd = k.half_full().expect("a copy of the epoll descriptor");
        let readable = |timeout_ms: i32| {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one valid pollfd.
            unsafe { libc::poll(&raw mut p, 1, timeout_ms) > 0 }
        };
        let mut out = Vec::new();
        k.read(&mut out);
        k.take_wakes();
        assert!(!readable(0), "readable with the rings just read");
        // Each process writes ~500 bytes of records (fork, exec, mappings, exit): several
        // times a half ring (8 KiB) on every CPU.
        for _ in 0..200 {
            std::process::Command::new("true")
                .status()
                .expect("run true");
        }
        assert!(readable(5000), "no wake-up with the rings half full");
        k.read(&mut out);
        k.take_wakes();
        assert!(out.len() > 100, "only {} records", out.len());
    }

    #[test]
    fn decodes_mappings_with_build_id_or_inode() {
        let mut with_id = [0u8; 24];
        with_id[0] = 3;
        with_id[4..7].copy_from_slice(&[0xde, 0xad, 0xbe]);
        let r = record(
            RECORD_MMAP2,
            MISC_MMAP_BUILD_ID,
            &mmap2(5, with_id, "/bin/x"),
            42,
        );
        assert_eq!(
            decode(&r),
            Some(KernelRecord::Map {
                pid: 7,
                time_ns: 42,
                start: 0x1000,
                end: 0x3000,
                pgoff: 0x3000,
                path: "/bin/x".into(),
                id: FileIdentity::BuildId(BuildId::new(&[0xde, 0xad, 0xbe])),
            })
        );
        let mut inode = [0u8; 24];
        inode[0..4].copy_from_slice(&8u32.to_ne_bytes());
        inode[4..8].copy_from_slice(&1u32.to_ne_bytes());
        inode[8..16].copy_from_slice(&99u64.to_ne_bytes());
        let r = record(RECORD_MMAP2, 0, &mmap2(5, inode, "/lib/y.so"), 43);
        let Some(KernelRecord::Map { id, path, .. }) = decode(&r) else {
            panic!("not a mapping");
        };
        assert_eq!(id, FileIdentity::Inode(libc::makedev(8, 1), 99));
        assert_eq!(path, "/lib/y.so");
        // Not executable: not ours.
        let r = record(RECORD_MMAP2, 0, &mmap2(3, inode, "/data"), 44);
        assert_eq!(decode(&r), None);
    }

    #[test]
    fn decodes_exec_fork_and_exit_of_processes_not_threads() {
        let mut comm = Vec::new();
        for v in [7u32, 7] {
            comm.extend(v.to_ne_bytes());
        }
        comm.extend(b"fx-burn\0");
        let exec = record(RECORD_COMM, MISC_COMM_EXEC, &comm, 5);
        assert_eq!(
            decode(&exec),
            Some(KernelRecord::Exec {
                pid: 7,
                time_ns: 5,
                comm: "fx-burn".into()
            })
        );
        // A rename (prctl) is no exec.
        assert_eq!(decode(&record(RECORD_COMM, 0, &comm, 5)), None);
        let task = |pid: u32, ppid: u32, tid: u32| {
            let mut b = Vec::new();
            for v in [pid, ppid, tid, ppid] {
                b.extend(v.to_ne_bytes());
            }
            b.extend(0u64.to_ne_bytes());
            b
        };
        assert_eq!(
            decode(&record(RECORD_FORK, 0, &task(10, 1, 10), 6)),
            Some(KernelRecord::Fork {
                pid: 10,
                ppid: 1,
                time_ns: 6
            })
        );
        assert_eq!(decode(&record(RECORD_FORK, 0, &task(10, 10, 11), 6)), None);
        assert_eq!(
            decode(&record(RECORD_EXIT, 0, &task(10, 1, 10), 9)),
            Some(KernelRecord::Exit {
                pid: 10,
                time_ns: 9
            })
        );
        // Truncated records are dropped, not misread.
        assert_eq!(decode(&exec[..12]), None);
    }
}
