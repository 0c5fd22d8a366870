//! The capture file's encoding (profile/capture.rs): LEB128 integers (zigzag for signed),
//! length-prefixed strings, and a reader that checks every length against what is left and
//! charges every table to a memory budget, so a hostile file cannot make it allocate.
use std::io::{self, Read, Write};

use super::capture::MAX_STRING_BYTES;

pub(super) fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// LEB128 writer.
pub(crate) struct Writer<W: Write>(pub(crate) W);

impl<W: Write> Writer<W> {
    pub(crate) fn u(&mut self, mut v: u64) -> io::Result<()> {
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
    pub(crate) fn i(&mut self, v: i64) -> io::Result<()> {
        self.u(((v << 1) ^ (v >> 63)) as u64)
    }

    pub(super) fn s(&mut self, s: &str) -> io::Result<()> {
        self.u(s.len() as u64)?;
        self.0.write_all(s.as_bytes())
    }
}

/// Counts the compressed bytes read, for the expansion budget.
pub(super) struct Counting<R> {
    pub(super) inner: R,
    pub(super) n: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// LEB128 reader over the inflated body; every length is checked against what is left, and
/// every table is charged to `budget` (bytes the decoded profile may still take).
pub(crate) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) budget: u64,
}

impl<'a> Reader<'a> {
    /// A reader of `buf` whose decoded items may take `budget` bytes.
    pub(crate) fn new(buf: &'a [u8], budget: u64) -> Self {
        Self {
            buf,
            pos: 0,
            budget,
        }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn u(&mut self) -> io::Result<u64> {
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

    pub(crate) fn u32(&mut self) -> io::Result<u32> {
        u32::try_from(self.u()?).map_err(|_| corrupt("value does not fit 32 bits"))
    }

    pub(crate) fn i(&mut self) -> io::Result<i64> {
        let v = self.u()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// A count of items. Every item takes at least one byte, so a count larger than what is
    /// left is corrupt; what the items then take in memory is charged by `items`.
    pub(super) fn len(&mut self) -> io::Result<usize> {
        let n = self.u()?;
        if n > (self.buf.len() - self.pos) as u64 {
            Err(corrupt("implausible count"))
        } else {
            Ok(n as usize)
        }
    }

    /// Takes `bytes` from the budget; `OutOfMemory` (reported as `TooLarge`) when spent.
    pub(super) fn charge(&mut self, bytes: u64) -> io::Result<()> {
        self.budget = self
            .budget
            .checked_sub(bytes)
            .ok_or(io::ErrorKind::OutOfMemory)?;
        Ok(())
    }

    /// A count of `T`s about to be held in memory, charged to the budget.
    pub(super) fn items<T>(&mut self) -> io::Result<usize> {
        let n = self.len()?;
        self.charge(n as u64 * std::mem::size_of::<T>() as u64)?;
        Ok(n)
    }

    pub(super) fn s(&mut self) -> io::Result<String> {
        let n = self.len()?;
        if n > MAX_STRING_BYTES {
            return Err(corrupt(&format!(
                "a string of {n} bytes (at most {MAX_STRING_BYTES})"
            )));
        }
        self.charge(n as u64)?;
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("string is not UTF-8"))
    }
}
