//! Reads of a Python process's memory (process_vm_readv, or a /proc/PID/mem handle pinned to
//! one image) and of the few CPython objects naming needs: str (PEP 393 compact forms), bytes,
//! ints.
use std::{io, os::unix::fs::FileExt as _, sync::Arc};

/// Longest string or byte string read from a target (names, paths, line tables).
const MAX_OBJECT_BYTES: usize = 1 << 20;

/// Another process's memory, read without stopping it.
#[derive(Clone, Debug)]
pub(crate) struct Mem {
    pub pid: u32,
    /// /proc/PID/mem opened at one moment: it reads the address space the process had then,
    /// and nothing once that space is gone (an exec or an exit), never the next image's.
    pinned: Option<Arc<std::fs::File>>,
}

impl Mem {
    /// Whatever image `pid` runs at each read.
    pub(crate) fn new(pid: u32) -> Self {
        Self { pid, pinned: None }
    }

    /// The image `pid` runs now, and only it (see `pinned`).
    pub(crate) fn pinned(pid: u32) -> io::Result<Self> {
        let file = std::fs::File::open(format!("/proc/{pid}/mem"))?;
        Ok(Self {
            pid,
            pinned: Some(Arc::new(file)),
        })
    }

    /// Fills `buf` from `addr` in the process; an unmapped address is an error.
    pub(crate) fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        if let Some(f) = &self.pinned {
            // The kernel answers 0 bytes (an UnexpectedEof here) once the image is gone.
            return f.read_exact_at(buf, addr);
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one local iovec covering `buf`, which lives across the call; the remote
        // one is only read by the kernel, on behalf of the other process.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid as libc::pid_t,
                &raw const local,
                1,
                &raw const remote,
                1,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        Ok(())
    }

    pub(crate) fn u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    pub(crate) fn u32(&self, addr: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    /// A NUL-terminated C string of at most `max` bytes.
    pub(crate) fn c_string(&self, addr: u64, max: usize) -> io::Result<String> {
        let mut b = vec![0u8; max];
        // The string may end near the end of a mapping: read less when the whole fails.
        if self.read(addr, &mut b).is_err() {
            b.truncate(32.min(max));
            self.read(addr, &mut b)?;
        }
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        Ok(String::from_utf8_lossy(&b[..end]).into_owned())
    }

    /// A `str` object: compact ASCII data follows the `PyASCIIObject` header
    /// (`ascii_size`), other compact kinds the `PyCompactUnicodeObject` one (`compact_size`).
    pub(crate) fn py_str(
        &self,
        obj: u64,
        ascii_size: u64,
        compact_size: u64,
    ) -> io::Result<String> {
        let mut head = [0u8; 40];
        self.read(obj, &mut head)?;
        let len = usize::try_from(u64::from_ne_bytes(head[16..24].try_into().expect("8")))
            .unwrap_or(usize::MAX);
        let state = u32::from_ne_bytes(head[32..36].try_into().expect("4"));
        let kind = ((state >> 2) & 7) as usize;
        let (compact, ascii) = ((state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
        if !compact || !matches!(kind, 1 | 2 | 4) || len.saturating_mul(kind) > MAX_OBJECT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a compact str",
            ));
        }
        let data = obj + if ascii { ascii_size } else { compact_size };
        let mut b = vec![0u8; len * kind];
        self.read(data, &mut b)?;
        Ok(match kind {
            1 => b.iter().map(|&c| char::from(c)).collect(),
            2 => char::decode_utf16(
                b.chunks_exact(2)
                    .map(|c| u16::from_ne_bytes(c.try_into().expect("2"))),
            )
            .map(|c| c.unwrap_or('\u{fffd}'))
            .collect(),
            _ => b
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_ne_bytes(c.try_into().expect("4")))
                        .unwrap_or('\u{fffd}')
                })
                .collect(),
        })
    }

    /// A `bytes` object's contents (`ob_size` at 16, the data at 32 on 3.8-3.13).
    pub(crate) fn py_bytes(&self, obj: u64) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.u64(obj + 16)?).unwrap_or(usize::MAX);
        if len > MAX_OBJECT_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bytes too long"));
        }
        let mut b = vec![0u8; len];
        self.read(obj + 32, &mut b)?;
        Ok(b)
    }
}
