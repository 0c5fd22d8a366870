//! The capture file (`.capture`): a self-contained, versioned, compact copy of a `Profile`, so
//! `profiler report` can re-render it on any machine. Layout in docs/capture-format.md:
//! an 8-byte magic, a little-endian u32 version, then a gzip stream of LEB128 varints.
use std::{
    fs::File,
    io::{self, BufReader, BufWriter, Read, Write},
    path::Path,
};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};

use super::model::{
    Binary, Cgroup, Counters, Frame, FrameKind, Lifetime, Meta, Process, Profile, Sample, Stack,
};

pub const MAGIC: &[u8; 8] = b"PROFCAP\0";
/// Bumped on any change a reader of the previous version would misread.
/// 2: binaries (path, build id) and each frame's address and binary.
/// 3: process lifetimes (fork, exec, exit times and exit status) after the samples.
pub const CAPTURE_VERSION: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    /// A decoding error of the capture file at `path`.
    #[error("{path}: {source}")]
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
}

/// Writes `profile` to `path` (through a temporary file, so a crash never leaves half a file).
pub fn write_file(profile: &Profile, path: &Path) -> Result<(), CaptureError> {
    let io_err = |source| CaptureError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("capture.tmp");
    let mut out = BufWriter::new(File::create(&tmp).map_err(io_err)?);
    encode(profile, &mut out).map_err(io_err)?;
    out.into_inner()
        .map_err(|e| io_err(e.into_error()))?
        .sync_all()
        .map_err(io_err)?;
    std::fs::rename(&tmp, path).map_err(io_err)
}

/// Reads a capture file.
pub fn read_file(path: &Path) -> Result<Profile, CaptureError> {
    let io_err = |source| CaptureError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(io_err(io::Error::from(io::ErrorKind::IsADirectory)));
    }
    decode(&mut BufReader::new(file)).map_err(|e| CaptureError::In {
        path: path.display().to_string(),
        source: Box::new(e),
    })
}

pub fn encode(p: &Profile, out: &mut impl Write) -> io::Result<()> {
    out.write_all(MAGIC)?;
    out.write_all(&CAPTURE_VERSION.to_le_bytes())?;
    // Varints are a few bytes each: buffer them, so the compressor sees large writes.
    let mut w = Writer(BufWriter::with_capacity(
        1 << 16,
        GzEncoder::new(out, Compression::new(6)),
    ));
    let Meta {
        start_unix_ns,
        start_mono_ns,
        duration_ns,
        frequency_hz,
        event,
        hostname,
        kernel_release,
        cpus,
        counters,
    } = &p.meta;
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
    w.u(p.strings.len() as u64)?;
    for s in &p.strings {
        w.s(s)?;
    }
    w.u(p.binaries.len() as u64)?;
    for Binary { path, build_id } in &p.binaries {
        w.s(path)?;
        w.s(build_id)?;
    }
    w.u(p.frames.len() as u64)?;
    for Frame {
        name,
        module,
        kind,
        addr,
        binary,
    } in &p.frames
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
    w.u(p.stacks.len() as u64)?;
    for Stack { frames } in &p.stacks {
        w.u(frames.len() as u64)?;
        for &f in frames {
            w.u(f.into())?;
        }
    }
    w.u(p.processes.len() as u64)?;
    for Process {
        pid,
        comm,
        exe,
        cgroup,
        memory_cgroup,
        cpu_cgroup,
    } in &p.processes
    {
        w.u((*pid).into())?;
        for text in [comm, exe, cgroup, memory_cgroup, cpu_cgroup] {
            w.s(text)?;
        }
    }
    w.u(p.cgroups.len() as u64)?;
    for Cgroup { id, path } in &p.cgroups {
        w.u(*id)?;
        w.s(path)?;
    }
    w.u(p.samples.len() as u64)?;
    let mut prev = 0u64;
    for &Sample {
        offset_ns,
        cpu,
        pid,
        tid,
        cgroup_id,
        comm,
        stack,
    } in &p.samples
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
    w.u(p.lifetimes.len() as u64)?;
    for Lifetime {
        pid,
        ppid,
        comm,
        exe,
        fork_ns,
        exec_ns,
        exit_ns,
        exit_status,
    } in &p.lifetimes
    {
        w.u((*pid).into())?;
        w.u((*ppid).into())?;
        w.s(comm)?;
        w.s(exe)?;
        // Optional values as value + 1, 0 for none.
        for v in [*fork_ns, *exec_ns, *exit_ns, exit_status.map(u64::from)] {
            w.u(v.map_or(0, |v| v.saturating_add(1)))?;
        }
    }
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
    let mut body = Vec::new();
    GzDecoder::new(input)
        .read_to_end(&mut body)
        .map_err(|e| CaptureError::Corrupt(e.to_string()))?;
    let mut r = Reader { buf: &body, pos: 0 };
    let profile = read_body(&mut r, version).map_err(|e| CaptureError::Corrupt(e.to_string()))?;
    if r.pos != body.len() {
        return Err(CaptureError::Corrupt(
            "trailing data after the samples".into(),
        ));
    }
    Ok(profile)
}

/// Reads versions 1 and 2 too: version 1 frames have no address or binary (both read as 0,
/// "unknown"); before version 3 there are no lifetimes.
fn read_body(r: &mut Reader<'_>, version: u32) -> io::Result<Profile> {
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
    let n = r.len()?;
    meta.cpus = (0..n).map(|_| r.u32()).collect::<io::Result<_>>()?;
    meta.counters = Counters {
        recorded: r.u()?,
        lost_ringbuf_full: r.u()?,
        filtered: r.u()?,
        kstack_failed: r.u()?,
        ustack_failed: r.u()?,
    };
    let n = r.len()?;
    let strings: Vec<String> = (0..n).map(|_| r.s()).collect::<io::Result<_>>()?;
    let string = |id: u32| -> io::Result<u32> {
        if (id as usize) < strings.len() {
            Ok(id)
        } else {
            Err(corrupt("string id out of range"))
        }
    };
    let binaries: Vec<Binary> = if version >= 2 {
        let n = r.len()?;
        (0..n)
            .map(|_| {
                Ok(Binary {
                    path: r.s()?,
                    build_id: r.s()?,
                })
            })
            .collect::<io::Result<_>>()?
    } else {
        vec![Binary::default()]
    };
    let n = r.len()?;
    let mut frames = Vec::with_capacity(n);
    for _ in 0..n {
        let name = string(r.u32()?)?;
        let module = string(r.u32()?)?;
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
        if binary != 0 && binary as usize >= binaries.len() {
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
    let n = r.len()?;
    let mut stacks = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.len()?;
        let ids = (0..len)
            .map(|_| {
                r.u32().and_then(|f| {
                    if (f as usize) < frames.len() {
                        Ok(f)
                    } else {
                        Err(corrupt("frame id out of range"))
                    }
                })
            })
            .collect::<io::Result<_>>()?;
        stacks.push(Stack { frames: ids });
    }
    let n = r.len()?;
    let processes = (0..n)
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
        .collect::<io::Result<_>>()?;
    let n = r.len()?;
    let cgroups = (0..n)
        .map(|_| {
            Ok(Cgroup {
                id: r.u()?,
                path: r.s()?,
            })
        })
        .collect::<io::Result<_>>()?;
    let n = r.len()?;
    let mut samples = Vec::with_capacity(n);
    let mut prev = 0i64;
    for _ in 0..n {
        prev += r.i()?;
        let s = Sample {
            offset_ns: u64::try_from(prev).map_err(|_| corrupt("negative sample time"))?,
            cpu: r.u32()?,
            pid: r.u32()?,
            tid: r.u32()?,
            cgroup_id: r.u()?,
            comm: string(r.u32()?)?,
            stack: r.u32()?,
        };
        if s.stack as usize >= stacks.len() {
            return Err(corrupt("stack id out of range"));
        }
        samples.push(s);
    }
    let lifetimes = if version >= 3 {
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
            .collect::<io::Result<_>>()?
    } else {
        Vec::new()
    };
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
    })
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// LEB128 writer.
struct Writer<W: Write>(W);

impl<W: Write> Writer<W> {
    fn u(&mut self, mut v: u64) -> io::Result<()> {
        let mut buf = [0u8; 10];
        let mut n = 0;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                buf[n] = byte;
                n += 1;
                break;
            }
            buf[n] = byte | 0x80;
            n += 1;
        }
        self.0.write_all(&buf[..n])
    }

    /// Zigzag, so small negative numbers stay short.
    fn i(&mut self, v: i64) -> io::Result<()> {
        self.u(((v << 1) ^ (v >> 63)) as u64)
    }

    fn s(&mut self, s: &str) -> io::Result<()> {
        self.u(s.len() as u64)?;
        self.0.write_all(s.as_bytes())
    }
}

/// LEB128 reader over the inflated body; every length is checked against what is left.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u(&mut self) -> io::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or(io::ErrorKind::UnexpectedEof)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint too long"))
    }

    fn u32(&mut self) -> io::Result<u32> {
        u32::try_from(self.u()?).map_err(|_| corrupt("value does not fit 32 bits"))
    }

    fn i(&mut self) -> io::Result<i64> {
        let v = self.u()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// A count of items. Every item takes at least one byte, so a count larger than what is
    /// left is corrupt: a bad file cannot make us allocate more than its own size.
    fn len(&mut self) -> io::Result<usize> {
        let n = self.u()?;
        if n > (self.buf.len() - self.pos) as u64 {
            Err(corrupt("implausible count"))
        } else {
            Ok(n as usize)
        }
    }

    fn s(&mut self) -> io::Result<String> {
        let n = self.len()?;
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("string is not UTF-8"))
    }
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
