//! The loader's window onto the kernel's UNWIND_ROWS array, mapped only as far as rows are
//! used. The kernel maps every page of a BPF_F_MMAPABLE array at mmap time
//! (`array_map_mmap` -> `remap_vmalloc_range`), so one mmap of the whole array would put all
//! of `--unwind-memory` in the profiler's RSS however few rows are loaded. Instead the
//! address range is reserved without memory and the array is mapped into it chunk by chunk
//! (`array_map_mmap` takes any page offset whose range ends inside the array) as the row
//! allocator (`budget`, first-fit from row 0) reaches them. The array's bytes live in kernel
//! memory either way (allocated whole when the map is created); only the profiler's view of
//! them is partial.
use std::os::fd::RawFd;

/// Bytes mapped at a time: a multiple of every page size Linux uses up to 1 MiB, few enough
/// mappings for a 64 MiB array (64) and little RSS beyond the rows in use.
pub const CHUNK_BYTES: usize = 1 << 20;

pub(crate) struct RowsView {
    base: *mut u32,
    /// Reserved bytes: the array's length rounded up to a page, as the kernel checks it.
    len: usize,
    /// Whether each chunk is mapped to the array.
    mapped: Vec<bool>,
    /// The array's fd, kept open by the loader's `MapData` for the life of this view.
    fd: RawFd,
}

// SAFETY: the raw pointer is a mapping owned by this value alone.
unsafe impl Send for RowsView {}

impl Drop for RowsView {
    fn drop(&mut self) {
        // SAFETY: the range reserved in `new` (chunks mapped over it included), not used
        // after this.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl RowsView {
    /// Reserves the address range of an array of `capacity` entries (u32: kernel rows and
    /// page indexes, `kernel_rows`), mapping none of it.
    pub(crate) fn new(fd: RawFd, capacity: u32) -> std::io::Result<Self> {
        let page = crate::util::page_size();
        let len = (capacity as usize * size_of::<u32>()).next_multiple_of(page);
        // SAFETY: a fresh anonymous reservation: no access, no memory, no swap reserved.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            base: ptr.cast(),
            len,
            mapped: vec![false; len.div_ceil(CHUNK_BYTES)],
            fd,
        })
    }

    /// Entries `start..start + len` (inside the array), mapped writable: the chunks holding
    /// them are mapped first if they are not yet.
    pub(crate) fn rows_mut(&mut self, start: u32, len: u32) -> std::io::Result<&mut [u32]> {
        let from = start as usize * size_of::<u32>();
        let to = from + len as usize * size_of::<u32>();
        if to > self.len {
            return Err(std::io::Error::other(format!(
                "rows {start}+{len} beyond the unwind array of {} bytes",
                self.len
            )));
        }
        if to > from {
            for chunk in from / CHUNK_BYTES..to.div_ceil(CHUNK_BYTES) {
                self.map_chunk(chunk)?;
            }
        }
        // SAFETY: the range lies inside the reservation and is mapped shared to the array
        // (above); the loader holds `&mut self`, so no other slice of it is alive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(start as usize), len as usize) })
    }

    /// Bytes of the array mapped into this process (what its RSS carries for the rows).
    pub(crate) fn mapped_bytes(&self) -> u64 {
        let chunks = self.mapped.iter().filter(|m| **m).count();
        let last_short = if self.mapped.last() == Some(&true) {
            self.mapped.len() * CHUNK_BYTES - self.len
        } else {
            0
        };
        (chunks * CHUNK_BYTES - last_short) as u64
    }

    fn map_chunk(&mut self, chunk: usize) -> std::io::Result<()> {
        if self.mapped[chunk] {
            return Ok(());
        }
        let offset = chunk * CHUNK_BYTES;
        // The last chunk ends with the array (the kernel refuses a range past its end).
        let bytes = CHUNK_BYTES.min(self.len - offset);
        // SAFETY: MAP_FIXED over our own reservation (never over another mapping), at a
        // page-aligned offset whose range ends inside the array.
        let ptr = unsafe {
            libc::mmap(
                self.base.cast::<u8>().add(offset).cast(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        self.mapped[chunk] = true;
        Ok(())
    }
}
