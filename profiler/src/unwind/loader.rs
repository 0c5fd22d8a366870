//! Feeds the kernel's table walk: compiles each binary's table once (keyed by device and
//! inode, so every process mapping it shares one copy), copies the rows into the mmaped
//! UNWIND_ROWS array, and writes each process's executable mappings into UNWIND_PROCS.
//! `Loader::load_process` takes a plain list of mappings, so /proc/PID/maps or the kernel's
//! MMAP2 records can feed it alike.
use std::{
    collections::HashMap,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use profiler_common::unwind::{
    MAX_MAPPINGS, ProcMappings, SEARCH_STEPS, UnwindMapping, UnwindRow, mapping,
};

use super::{UnwindMode, table};

/// One executable file mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingSpec {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// A path that reads the file now (e.g. through /proc/PID/root).
    pub path: PathBuf,
}

/// Where a binary's table sits in UNWIND_ROWS, or that it is walked by frame pointer.
#[derive(Clone, Copy, Debug)]
struct Binary {
    kind: u32,
    table_start: u32,
    table_len: u32,
}

/// What the loader did, for `--stats` and the bench.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoaderStats {
    pub processes: u64,
    pub binaries_table: u64,
    pub binaries_fp: u64,
    pub rows: u64,
    /// Binaries left to frame pointers because the row budget was used up.
    pub over_budget: u64,
    /// Time spent compiling tables, ns.
    pub compile_ns: u64,
}

pub struct Loader {
    mode: UnwindMode,
    rows: *mut UnwindRow,
    capacity: u32,
    used: u32,
    /// The mmap of UNWIND_ROWS, unmapped on drop (keeps the map's fd open too).
    _rows_map: MapData,
    map_len: usize,
    procs: BpfHashMap<MapData, u32, ProcMappings>,
    binaries: HashMap<(u64, u64), Binary>,
    loaded: std::collections::HashSet<u32>,
    pub stats: LoaderStats,
}

// SAFETY: the raw pointer is an mmap owned by this value alone.
unsafe impl Send for Loader {}

impl Drop for Loader {
    fn drop(&mut self) {
        // SAFETY: the region mapped in `new`, not used after this.
        unsafe { libc::munmap(self.rows.cast(), self.map_len) };
    }
}

impl Loader {
    /// Takes the two maps of the loaded sampler; `capacity` is UNWIND_ROWS's entry count.
    pub fn new(mode: UnwindMode, rows: Map, capacity: u32, procs: Map) -> std::io::Result<Self> {
        let Map::Array(rows) = rows else {
            return Err(std::io::Error::other("UNWIND_ROWS is not an array map"));
        };
        let map_len = (capacity as usize * size_of::<UnwindRow>()).next_multiple_of(4096);
        // SAFETY: mapping a BPF_F_MMAPABLE array map of exactly this size, shared.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&rows.fd().as_fd()),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let procs = BpfHashMap::try_from(procs).map_err(std::io::Error::other)?;
        Ok(Self {
            mode,
            rows: ptr.cast(),
            capacity,
            used: 0,
            _rows_map: rows,
            map_len,
            procs,
            binaries: HashMap::new(),
            loaded: std::collections::HashSet::new(),
            stats: LoaderStats::default(),
        })
    }

    /// Loads the executable mappings of `pid` (and the tables of binaries not loaded yet)
    /// into the kernel. From then on its samples are walked by table.
    pub fn load_process(&mut self, pid: u32, mappings: &[MappingSpec]) -> std::io::Result<()> {
        let mut value = ProcMappings {
            count: 0,
            _pad: 0,
            maps: [UnwindMapping::default(); MAX_MAPPINGS],
        };
        let mut sorted: Vec<&MappingSpec> = mappings.iter().collect();
        sorted.sort_by_key(|m| m.start);
        let mut n = 0;
        for m in sorted {
            if n == MAX_MAPPINGS {
                log::debug!("pid {pid}: more than {MAX_MAPPINGS} executable mappings");
                break;
            }
            let Some(entry) = self.mapping(m) else {
                continue;
            };
            value.maps[n] = entry;
            n += 1;
        }
        value.count = n as u32;
        self.procs
            .insert(pid, value, 0)
            .map_err(std::io::Error::other)?;
        // A process loaded again (by --pid, then at its first sample) counts once.
        self.loaded.insert(pid);
        self.stats.processes = self.loaded.len() as u64;
        log::debug!("pid {pid}: {n} executable mappings loaded for unwinding");
        Ok(())
    }

    /// Whether every binary of `mappings` has been compiled already (loading them is then
    /// a few syscalls, no table to build).
    pub fn knows_all(&self, mappings: &[MappingSpec]) -> bool {
        mappings.iter().all(|m| {
            std::fs::metadata(&m.path)
                .is_ok_and(|meta| self.binaries.contains_key(&(meta.dev(), meta.ino())))
        })
    }

    /// The kernel entry for one mapping; None for a file that cannot be read as ELF.
    fn mapping(&mut self, m: &MappingSpec) -> Option<UnwindMapping> {
        let file = std::fs::File::open(&m.path).ok()?;
        let meta = file.metadata().ok()?;
        // SAFETY: a read-only view. A file rewritten in place under us gives a wrong table
        // (walks stop early), not unsafety; a file truncated under us would raise SIGBUS,
        // a risk accepted: running executables refuse writes (ETXTBSY) and
        // package managers replace libraries by rename, not truncation.
        let data = unsafe { memmap(&file, meta.len())? };
        let bias = table::mapping_bias(&data, m.start, m.file_offset)?;
        let key = (meta.dev(), meta.ino());
        let binary = match self.binaries.get(&key) {
            Some(b) => *b,
            None => {
                let b = self.load_binary(&m.path, &data);
                self.binaries.insert(key, b);
                b
            }
        };
        Some(UnwindMapping {
            start: m.start,
            end: m.end,
            bias,
            table_start: binary.table_start,
            table_len: binary.table_len,
            kind: binary.kind,
            _pad: 0,
        })
    }

    fn load_binary(&mut self, path: &Path, data: &[u8]) -> Binary {
        let fp = Binary {
            kind: mapping::FRAME_POINTER,
            table_start: 0,
            table_len: 0,
        };
        let started = std::time::Instant::now();
        let compiled = table::compile(data);
        self.stats.compile_ns += started.elapsed().as_nanos() as u64;
        let table = match compiled {
            Ok(t) => t,
            Err(e) => {
                log::debug!(
                    "{}: no unwind table: {}",
                    path.display(),
                    crate::util::chain(&e)
                );
                self.stats.binaries_fp += 1;
                return fp;
            }
        };
        let by_fp = table.rows.is_empty()
            || (self.mode == UnwindMode::Auto && table.keeps_frame_pointers());
        let len = table.rows.len() as u32;
        if by_fp {
            self.stats.binaries_fp += 1;
            return fp;
        }
        if len > 1 << SEARCH_STEPS || self.capacity - self.used < len {
            log::debug!(
                "{}: {len} rows do not fit the unwind memory",
                path.display()
            );
            self.stats.over_budget += 1;
            self.stats.binaries_fp += 1;
            return fp;
        }
        // SAFETY: rows [used, used + len) lie inside the mapped array (checked above), and
        // no kernel walk reads them before a mapping points at them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                table.rows.as_ptr(),
                self.rows.add(self.used as usize),
                len as usize,
            );
        }
        let b = Binary {
            kind: mapping::TABLE,
            table_start: self.used,
            table_len: len,
        };
        self.used += len;
        self.stats.rows += u64::from(len);
        self.stats.binaries_table += 1;
        b
    }
}

/// A read-only view of a file's bytes.
struct Mmap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl std::ops::Deref for Mmap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable at `ptr` for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: the region mapped in `memmap`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// # Safety
/// The file must not be truncated while the view lives.
unsafe fn memmap(file: &std::fs::File, len: u64) -> Option<Mmap> {
    let len = usize::try_from(len).ok().filter(|l| *l > 0)?;
    // SAFETY: a private read-only mapping of an open file.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(file),
            0,
        )
    };
    (ptr != libc::MAP_FAILED).then_some(Mmap { ptr, len })
}

/// The executable file mappings of a live process, from /proc/PID/maps, with paths that
/// read the files through /proc/PID/root (its own mount namespace).
pub fn proc_mappings(pid: u32) -> std::io::Result<Vec<MappingSpec>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&text, &format!("/proc/{pid}/root")))
}

fn parse_maps(text: &str, root: &str) -> Vec<MappingSpec> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode)) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            continue;
        };
        let path = words.collect::<Vec<_>>().join(" ");
        if !perms.contains('x') || !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(file_offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        out.push(MappingSpec {
            start,
            end,
            file_offset,
            path: PathBuf::from(format!("{root}{path}")),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_become_exec_file_mappings() {
        let text = "\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 123 /usr/bin/xz
55d0c0001000-55d0c0010000 r-xp 00001000 fe:01 123 /usr/bin/xz
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]
7f0000002000-7f0000003000 r-xp 00002000 fe:01 9 /opt/my lib.so
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
";
        let maps = parse_maps(text, "/proc/7/root");
        assert_eq!(
            maps,
            vec![
                MappingSpec {
                    start: 0x55d0_c000_1000,
                    end: 0x55d0_c001_0000,
                    file_offset: 0x1000,
                    path: "/proc/7/root/usr/bin/xz".into(),
                },
                MappingSpec {
                    start: 0x7f00_0000_2000,
                    end: 0x7f00_0000_3000,
                    file_offset: 0x2000,
                    path: "/proc/7/root/opt/my lib.so".into(),
                },
            ]
        );
    }
}
