//! The capture file (`.capture`): a self-contained, versioned, compact copy of a `Profile`, so
//! `profiler report` can re-render it on any machine. Layout in docs/capture-format.md:
//! an 8-byte magic, a little-endian u32 version, then a gzip stream of LEB128 varints.
use std::{
    io::{self, BufReader, BufWriter, Read, Write},
    path::Path,
};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};

use super::leb128::{Counting, Reader, Writer, corrupt};

use super::runq::{CpuWaits, Histogram, RunQueue, ThreadWaits};

use super::model::{
    Binary, Cgroup, Counters, Frame, FrameKind, Lifetime, Meta, Process, Profile, Sample, Stack,
};

pub const MAGIC: &[u8; 8] = b"PROFCAP\0";
/// Bumped on any change a reader of the previous version would misread.
/// 2: binaries (path, build id) and each frame's address and binary.
/// 3: process lifetimes (fork, exec, exit times and exit status) after the samples.
/// 4: the untimed ranges (`Meta::untimed`) and named counters (`Meta::named_counters`) after
/// the lifetimes.
/// 5: the run-queue waits (`Profile::runq`) after the named counters.
pub const CAPTURE_VERSION: u32 = 5;

// Bounds on what a capture may make the reader do (docs/capture-format.md, "Bounds"). A
// capture is a file a user hands us, possibly crafted: gzip alone inflates up to ~1000x.
/// The inflated body and the decoded profile may take at most this many times the bytes of
/// the compressed file (a real body inflates ~2-3x; decoded, about 9x: docs/capture-format.md)...
pub const MAX_EXPANSION: u64 = 64;
/// ...plus this much, so small files are not held to a tiny budget.
pub const BUDGET_FLOOR: u64 = 64 << 20;
/// Longest string (a frame name, a path): demangled C++ names run to a few KiB.
pub const MAX_STRING_BYTES: usize = 64 << 10;
/// Deepest stack: the kernel hands at most 2 x 127 addresses, inlining adds a few frames each.
pub const MAX_STACK_DEPTH: usize = 4096;
/// How far past the declared duration a sample may lie: samples still in the ring buffer when
/// the recording's clock was read are drained after it.
pub const END_SLACK_NS: u64 = 60_000_000_000;

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{path}")]
    Io { path: String, source: io::Error },
    /// A decoding error of the capture file at `path`.
    #[error("{path}")]
    In {
        path: String,
        source: Box<CaptureError>,
    },
    #[error("not a profiler capture (the file does not start with the capture magic)")]
    NotCapture,
    #[error(
        "capture format version {0} is newer than this profiler reads ({CAPTURE_VERSION}); use a newer profiler"
    )]
    NewerVersion(u32),
    #[error("the capture is corrupt or truncated: {0}")]
    Corrupt(String),
    #[error(
        "the capture expands to more than {MAX_EXPANSION} times its size (a gzip bomb or a corrupt count); captures the profiler writes stay far below that"
    )]
    TooLarge,
}

/// Writes `profile` to `path` (through a temporary file, so a crash never leaves half a file).
pub fn write_file(profile: &Profile, path: &Path) -> Result<(), CaptureError> {
    crate::util::write_atomic(path, |w| encode(profile, w)).map_err(|source| CaptureError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Reads a capture file.
pub fn read_file(path: &Path) -> Result<Profile, CaptureError> {
    let io_err = |source| CaptureError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = crate::util::open_regular(path).map_err(io_err)?;
    decode(&mut BufReader::new(file)).map_err(|e| CaptureError::In {
        path: path.display().to_string(),
        source: Box::new(e),
    })
}

/// Writes the header, then the body's sections in the order of docs/capture-format.md.
pub fn encode(p: &Profile, out: &mut impl Write) -> io::Result<()> {
    out.write_all(MAGIC)?;
    out.write_all(&CAPTURE_VERSION.to_le_bytes())?;
    // Varints are a few bytes each: buffer them, so the compressor sees large writes.
    let mut w = Writer(BufWriter::with_capacity(
        1 << 16,
        GzEncoder::new(out, Compression::new(6)),
    ));
    write_meta(&mut w, &p.meta)?;
    write_counters(&mut w, &p.meta.counters)?;
    write_strings(&mut w, &p.strings)?;
    write_binaries(&mut w, &p.binaries)?;
    write_frames(&mut w, &p.frames)?;
    write_stacks(&mut w, &p.stacks)?;
    write_processes(&mut w, &p.processes)?;
    write_cgroups(&mut w, &p.cgroups)?;
    write_samples(&mut w, &p.samples)?;
    write_lifetimes(&mut w, &p.lifetimes)?;
    write_untimed(&mut w, &p.meta.untimed)?;
    write_named_counters(&mut w, &p.meta.named_counters)?;
    write_runq(&mut w, p.runq.as_ref())?;
    w.0.into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .finish()?
        .flush()
}

pub fn decode(input: &mut impl Read) -> Result<Profile, CaptureError> {
    let mut head = [0u8; 12];
    input
        .read_exact(&mut head)
        .map_err(|_| CaptureError::NotCapture)?;
    if &head[..8] != MAGIC {
        return Err(CaptureError::NotCapture);
    }
    let version = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
    if version > CAPTURE_VERSION {
        return Err(CaptureError::NewerVersion(version));
    }
    // Inflate first, then parse from memory: reading varints byte by byte through the decoder
    // was the slowest part of `report`. Reading to the end also makes gzip check its CRC.
    // The budget grows with the compressed bytes read so far, so a bomb stops early.
    let budget = |compressed: u64| BUDGET_FLOOR + MAX_EXPANSION * (compressed + 12);
    let mut gz = GzDecoder::new(Counting { inner: input, n: 0 });
    let mut body = Vec::new();
    loop {
        let n = (&mut gz)
            .take(1 << 20)
            .read_to_end(&mut body)
            .map_err(|e| CaptureError::Corrupt(e.to_string()))?;
        if body.len() as u64 > budget(gz.get_ref().n) {
            return Err(CaptureError::TooLarge);
        }
        if n == 0 {
            break;
        }
    }
    let total = budget(gz.get_ref().n);
    let mut r = Reader {
        buf: &body,
        pos: 0,
        budget: total.saturating_sub(body.len() as u64),
    };
    let profile = read_body(&mut r, version).map_err(|e| {
        if e.kind() == io::ErrorKind::OutOfMemory {
            CaptureError::TooLarge
        } else {
            CaptureError::Corrupt(e.to_string())
        }
    })?;
    if r.pos != body.len() {
        return Err(CaptureError::Corrupt(
            "trailing data after the samples".into(),
        ));
    }
    Ok(profile)
}

/// Reads the body's sections in the order `encode` writes them; versions 1 to 3 lack the
/// sections (or fields) added since: version 1 frames have no address or binary (both read as
/// 0, "unknown"); before version 3 there are no lifetimes, before 4 no untimed ranges or named
/// counters.
fn read_body(r: &mut Reader<'_>, version: u32) -> io::Result<Profile> {
    let mut meta = read_meta(r)?;
    meta.counters = read_counters(r)?;
    let strings = read_strings(r)?;
    let binaries = if version >= 2 {
        read_binaries(r)?
    } else {
        vec![Binary::default()]
    };
    let frames = read_frames(r, version, strings.len(), binaries.len())?;
    let stacks = read_stacks(r, frames.len())?;
    let processes = read_processes(r)?;
    let cgroups = read_cgroups(r)?;
    let samples = read_samples(r, meta.duration_ns, strings.len(), stacks.len())?;
    let lifetimes = if version >= 3 {
        read_lifetimes(r)?
    } else {
        Vec::new()
    };
    if version >= 4 {
        meta.untimed = read_untimed(r)?;
        meta.named_counters = read_named_counters(r)?;
    }
    let runq = if version >= 5 { read_runq(r)? } else { None };
    Ok(Profile {
        meta,
        strings,
        frames,
        stacks,
        samples,
        processes,
        lifetimes,
        cgroups,
        binaries,
        runq,
    })
}

/// `id` when it indexes a table of `len` items, else the corrupt-file error `what`.
fn checked_id(id: u32, len: usize, what: &str) -> io::Result<u32> {
    if (id as usize) < len {
        Ok(id)
    } else {
        Err(corrupt(what))
    }
}

/// Meta: start (wall clock, then monotonic), duration, frequency, event, host, kernel and the
/// CPUs. The counters, untimed ranges and named counters are sections of their own.
fn write_meta(w: &mut Writer<impl Write>, meta: &Meta) -> io::Result<()> {
    let Meta {
        start_unix_ns,
        start_mono_ns,
        duration_ns,
        frequency_hz,
        event,
        hostname,
        kernel_release,
        cpus,
        counters: _,
        untimed: _,
        named_counters: _,
    } = meta;
    w.u(*start_unix_ns)?;
    w.u(*start_mono_ns)?;
    w.u(*duration_ns)?;
    w.u(u64::from(*frequency_hz))?;
    w.s(event)?;
    w.s(hostname)?;
    w.s(kernel_release)?;
    w.u(cpus.len() as u64)?;
    for &cpu in cpus {
        w.u(cpu.into())?;
    }
    Ok(())
}

fn read_meta(r: &mut Reader<'_>) -> io::Result<Meta> {
    let mut meta = Meta {
        start_unix_ns: r.u()?,
        start_mono_ns: r.u()?,
        duration_ns: r.u()?,
        frequency_hz: r.u32()?,
        event: r.s()?,
        hostname: r.s()?,
        kernel_release: r.s()?,
        ..Meta::default()
    };
    // Wall-clock times are start + offset, in u64 ns: the whole span must fit, with a day of
    // margin for the slack and the time-of-day arithmetic of `report --from/--to`.
    if meta
        .start_unix_ns
        .checked_add(meta.duration_ns)
        .and_then(|end| end.checked_add(86_400_000_000_000))
        .is_none()
    {
        return Err(corrupt(
            "start time plus duration overflows 64-bit nanoseconds",
        ));
    }
    let n = r.items::<u32>()?;
    meta.cpus = (0..n).map(|_| r.u32()).collect::<io::Result<_>>()?;
    Ok(meta)
}

fn write_counters(w: &mut Writer<impl Write>, counters: &Counters) -> io::Result<()> {
    let Counters {
        recorded,
        lost_ringbuf_full,
        filtered,
        kstack_failed,
        ustack_failed,
    } = counters;
    for c in [
        recorded,
        lost_ringbuf_full,
        filtered,
        kstack_failed,
        ustack_failed,
    ] {
        w.u(*c)?;
    }
    Ok(())
}

fn read_counters(r: &mut Reader<'_>) -> io::Result<Counters> {
    Ok(Counters {
        recorded: r.u()?,
        lost_ringbuf_full: r.u()?,
        filtered: r.u()?,
        kstack_failed: r.u()?,
        ustack_failed: r.u()?,
    })
}

fn write_strings(w: &mut Writer<impl Write>, strings: &[String]) -> io::Result<()> {
    w.u(strings.len() as u64)?;
    for s in strings {
        w.s(s)?;
    }
    Ok(())
}

fn read_strings(r: &mut Reader<'_>) -> io::Result<Vec<String>> {
    let n = r.items::<String>()?;
    (0..n).map(|_| r.s()).collect()
}

/// Binaries (version 2): path and build id.
fn write_binaries(w: &mut Writer<impl Write>, binaries: &[Binary]) -> io::Result<()> {
    w.u(binaries.len() as u64)?;
    for Binary { path, build_id } in binaries {
        w.s(path)?;
        w.s(build_id)?;
    }
    Ok(())
}

fn read_binaries(r: &mut Reader<'_>) -> io::Result<Vec<Binary>> {
    let n = r.items::<Binary>()?;
    (0..n)
        .map(|_| {
            Ok(Binary {
                path: r.s()?,
                build_id: r.s()?,
            })
        })
        .collect()
}

/// Frames: name and module (string ids), kind (0 kernel, 1 user), then (version 2) the
/// address and the binary id.
fn write_frames(w: &mut Writer<impl Write>, frames: &[Frame]) -> io::Result<()> {
    w.u(frames.len() as u64)?;
    for Frame {
        name,
        module,
        kind,
        addr,
        binary,
    } in frames
    {
        w.u((*name).into())?;
        w.u((*module).into())?;
        w.u(match kind {
            FrameKind::Kernel => 0,
            FrameKind::User => 1,
        })?;
        w.u(*addr)?;
        w.u((*binary).into())?;
    }
    Ok(())
}

fn read_frames(
    r: &mut Reader<'_>,
    version: u32,
    strings: usize,
    binaries: usize,
) -> io::Result<Vec<Frame>> {
    let n = r.items::<Frame>()?;
    let mut frames = Vec::with_capacity(n);
    for _ in 0..n {
        let name = checked_id(r.u32()?, strings, "string id out of range")?;
        let module = checked_id(r.u32()?, strings, "string id out of range")?;
        let kind = match r.u()? {
            0 => FrameKind::Kernel,
            1 => FrameKind::User,
            _ => return Err(corrupt("unknown frame kind")),
        };
        let (addr, binary) = if version >= 2 {
            (r.u()?, r.u32()?)
        } else {
            (0, 0)
        };
        // 0 is "no binary" even in a profile whose table is empty.
        if binary != 0 && binary as usize >= binaries {
            return Err(corrupt("binary id out of range"));
        }
        frames.push(Frame {
            name,
            module,
            kind,
            addr,
            binary,
        });
    }
    Ok(frames)
}

/// Stacks: frame ids, root first.
fn write_stacks(w: &mut Writer<impl Write>, stacks: &[Stack]) -> io::Result<()> {
    w.u(stacks.len() as u64)?;
    for Stack { frames } in stacks {
        w.u(frames.len() as u64)?;
        for &f in frames {
            w.u(f.into())?;
        }
    }
    Ok(())
}

fn read_stacks(r: &mut Reader<'_>, frames: usize) -> io::Result<Vec<Stack>> {
    let n = r.items::<Stack>()?;
    let mut stacks = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.items::<u32>()?;
        if len > MAX_STACK_DEPTH {
            return Err(corrupt(&format!(
                "a stack of {len} frames (at most {MAX_STACK_DEPTH})"
            )));
        }
        let ids = (0..len)
            .map(|_| {
                r.u32()
                    .and_then(|f| checked_id(f, frames, "frame id out of range"))
            })
            .collect::<io::Result<_>>()?;
        stacks.push(Stack { frames: ids });
    }
    Ok(stacks)
}

fn write_processes(w: &mut Writer<impl Write>, processes: &[Process]) -> io::Result<()> {
    w.u(processes.len() as u64)?;
    for Process {
        pid,
        comm,
        exe,
        cgroup,
        memory_cgroup,
        cpu_cgroup,
    } in processes
    {
        w.u((*pid).into())?;
        for text in [comm, exe, cgroup, memory_cgroup, cpu_cgroup] {
            w.s(text)?;
        }
    }
    Ok(())
}

fn read_processes(r: &mut Reader<'_>) -> io::Result<Vec<Process>> {
    let n = r.items::<Process>()?;
    (0..n)
        .map(|_| {
            Ok(Process {
                pid: r.u32()?,
                comm: r.s()?,
                exe: r.s()?,
                cgroup: r.s()?,
                memory_cgroup: r.s()?,
                cpu_cgroup: r.s()?,
            })
        })
        .collect()
}

fn write_cgroups(w: &mut Writer<impl Write>, cgroups: &[Cgroup]) -> io::Result<()> {
    w.u(cgroups.len() as u64)?;
    for Cgroup { id, path } in cgroups {
        w.u(*id)?;
        w.s(path)?;
    }
    Ok(())
}

fn read_cgroups(r: &mut Reader<'_>) -> io::Result<Vec<Cgroup>> {
    let n = r.items::<Cgroup>()?;
    (0..n)
        .map(|_| {
            Ok(Cgroup {
                id: r.u()?,
                path: r.s()?,
            })
        })
        .collect()
}

/// Samples: the time as a signed delta from the previous sample's, then cpu, pid, tid,
/// cgroup id, comm (a string id) and stack id.
fn write_samples(w: &mut Writer<impl Write>, samples: &[Sample]) -> io::Result<()> {
    w.u(samples.len() as u64)?;
    let mut prev = 0u64;
    for &Sample {
        offset_ns,
        cpu,
        pid,
        tid,
        cgroup_id,
        comm,
        stack,
    } in samples
    {
        // Samples are (nearly) in time order: deltas are small and varints short.
        w.i(offset_ns as i64 - prev as i64)?;
        prev = offset_ns;
        for v in [
            u64::from(cpu),
            pid.into(),
            tid.into(),
            cgroup_id,
            comm.into(),
            stack.into(),
        ] {
            w.u(v)?;
        }
    }
    Ok(())
}

/// Every time is checked against the capture's declared `duration_ns` (plus `END_SLACK_NS`).
fn read_samples(
    r: &mut Reader<'_>,
    duration_ns: u64,
    strings: usize,
    stacks: usize,
) -> io::Result<Vec<Sample>> {
    let n = r.items::<Sample>()?;
    let mut samples = Vec::with_capacity(n);
    let mut prev = 0i64;
    // Every per-second table (heat map, --cpus) spans the samples: one far outside the
    // declared duration would make them huge.
    let end = duration_ns.saturating_add(END_SLACK_NS);
    for _ in 0..n {
        prev = prev
            .checked_add(r.i()?)
            .ok_or_else(|| corrupt("sample time overflows"))?;
        let offset_ns = u64::try_from(prev).map_err(|_| corrupt("negative sample time"))?;
        if offset_ns > end {
            return Err(corrupt(&format!(
                "a sample {:.1} s after the start lies past the capture's end ({:.1} s)",
                offset_ns as f64 / 1e9,
                duration_ns as f64 / 1e9
            )));
        }
        let s = Sample {
            offset_ns,
            cpu: r.u32()?,
            pid: r.u32()?,
            tid: r.u32()?,
            cgroup_id: r.u()?,
            comm: checked_id(r.u32()?, strings, "string id out of range")?,
            stack: r.u32()?,
        };
        if s.stack as usize >= stacks {
            return Err(corrupt("stack id out of range"));
        }
        samples.push(s);
    }
    Ok(samples)
}

/// Lifetimes (version 3): pid, ppid, comm, exe, then fork, exec, exit and exit status, each
/// as value + 1, 0 for none.
fn write_lifetimes(w: &mut Writer<impl Write>, lifetimes: &[Lifetime]) -> io::Result<()> {
    w.u(lifetimes.len() as u64)?;
    for Lifetime {
        pid,
        ppid,
        comm,
        exe,
        fork_ns,
        exec_ns,
        exit_ns,
        exit_status,
    } in lifetimes
    {
        w.u((*pid).into())?;
        w.u((*ppid).into())?;
        w.s(comm)?;
        w.s(exe)?;
        for v in [*fork_ns, *exec_ns, *exit_ns, exit_status.map(u64::from)] {
            w.u(v.map_or(0, |v| v.saturating_add(1)))?;
        }
    }
    Ok(())
}

fn read_lifetimes(r: &mut Reader<'_>) -> io::Result<Vec<Lifetime>> {
    let n = r.len()?;
    (0..n)
        .map(|_| {
            let (pid, ppid, comm, exe) = (r.u32()?, r.u32()?, r.s()?, r.s()?);
            let mut opt = || r.u().map(|v| v.checked_sub(1));
            let (fork_ns, exec_ns, exit_ns) = (opt()?, opt()?, opt()?);
            let exit_status = opt()?
                .map(|s| u32::try_from(s).map_err(|_| corrupt("exit status too large")))
                .transpose()?;
            Ok(Lifetime {
                pid,
                ppid,
                comm,
                exe,
                fork_ns,
                exec_ns,
                exit_ns,
                exit_status,
            })
        })
        .collect()
}

/// Untimed ranges (version 4): from and to, offsets from the start.
fn write_untimed(w: &mut Writer<impl Write>, untimed: &[(u64, u64)]) -> io::Result<()> {
    w.u(untimed.len() as u64)?;
    for &(from, to) in untimed {
        w.u(from)?;
        w.u(to)?;
    }
    Ok(())
}

fn read_untimed(r: &mut Reader<'_>) -> io::Result<Vec<(u64, u64)>> {
    let n = r.items::<(u64, u64)>()?;
    (0..n).map(|_| Ok((r.u()?, r.u()?))).collect()
}

/// Named counters (version 4): name and value.
fn write_named_counters(
    w: &mut Writer<impl Write>,
    named_counters: &[(String, u64)],
) -> io::Result<()> {
    w.u(named_counters.len() as u64)?;
    for (name, value) in named_counters {
        w.s(name)?;
        w.u(*value)?;
    }
    Ok(())
}

fn read_named_counters(r: &mut Reader<'_>) -> io::Result<Vec<(String, u64)>> {
    let n = r.items::<(String, u64)>()?;
    (0..n).map(|_| Ok((r.s()?, r.u()?))).collect()
}

/// Run-queue waits (version 5): 0 when not traced, else 1, the switches and losses, the
/// per-CPU histograms (CPU, sum of waits, `BUCKETS` counts), the per-cgroup ones (id,
/// `BUCKETS` counts), then the threads.
fn write_runq(w: &mut Writer<impl Write>, runq: Option<&RunQueue>) -> io::Result<()> {
    let Some(rq) = runq else {
        return w.u(0);
    };
    w.u(1)?;
    w.u(rq.switches)?;
    w.u(rq.threads_lost)?;
    w.u(rq.cgroup_waits_lost)?;
    let histogram = |w: &mut Writer<_>, h: &Histogram| -> io::Result<()> {
        for b in 0..BUCKETS {
            w.u(h.get(b).copied().unwrap_or(0))?;
        }
        Ok(())
    };
    w.u(rq.cpus.len() as u64)?;
    for c in &rq.cpus {
        w.u(c.cpu.into())?;
        w.u(c.delay_ns)?;
        histogram(w, &c.histogram)?;
    }
    w.u(rq.cgroups.len() as u64)?;
    for (id, h) in &rq.cgroups {
        w.u(*id)?;
        histogram(w, h)?;
    }
    w.u(rq.threads.len() as u64)?;
    for t in &rq.threads {
        w.u(t.tid.into())?;
        w.u(t.pid.into())?;
        w.s(&t.comm)?;
        for v in [
            t.cgroup_id,
            t.runtime_ns,
            t.waits,
            t.preempted,
            t.delay_ns,
            t.max_delay_ns,
            t.max_end_ns,
        ] {
            w.u(v)?;
        }
        w.u(t.max_cpu.into())?;
    }
    Ok(())
}

const BUCKETS: usize = profiler_common::runq::BUCKETS;

fn read_runq(r: &mut Reader<'_>) -> io::Result<Option<RunQueue>> {
    if r.u()? == 0 {
        return Ok(None);
    }
    let mut rq = RunQueue {
        switches: r.u()?,
        threads_lost: r.u()?,
        cgroup_waits_lost: r.u()?,
        ..RunQueue::default()
    };
    let histogram =
        |r: &mut Reader<'_>| -> io::Result<Histogram> { (0..BUCKETS).map(|_| r.u()).collect() };
    let n = r.items::<(u64, [u64; BUCKETS + 1])>()?;
    rq.cpus = (0..n)
        .map(|_| {
            Ok(CpuWaits {
                cpu: r.u32()?,
                delay_ns: r.u()?,
                histogram: histogram(r)?,
            })
        })
        .collect::<io::Result<_>>()?;
    let n = r.items::<(u64, [u64; BUCKETS])>()?;
    rq.cgroups = (0..n)
        .map(|_| Ok((r.u()?, histogram(r)?)))
        .collect::<io::Result<_>>()?;
    let n = r.items::<ThreadWaits>()?;
    rq.threads = (0..n)
        .map(|_| {
            Ok(ThreadWaits {
                tid: r.u32()?,
                pid: r.u32()?,
                comm: r.s()?,
                cgroup_id: r.u()?,
                runtime_ns: r.u()?,
                waits: r.u()?,
                preempted: r.u()?,
                delay_ns: r.u()?,
                max_delay_ns: r.u()?,
                max_end_ns: r.u()?,
                max_cpu: r.u32()?,
            })
        })
        .collect::<io::Result<_>>()?;
    Ok(Some(rq))
}

#[cfg(test)]
mod tests;
