//! Compiled unwind tables kept on disk, between the table compiler (`table`) and the
//! `loader`: a binary's table is compiled once per machine, not once per recording or agent
//! start. Files are keyed by the binary's GNU build id (a hash of its bytes when it has none),
//! hold the id of the profiler build that compiled them (another build may compile
//! differently: its files miss), are written atomically, and the directory is kept under a
//! size bound (least recently used files go). A cache file is untrusted input: it is read
//! only when owned by us and writable by no one else, bounded in size, checksummed, and its
//! rows checked (sorted, known kinds) before the kernel sees them.
use std::{
    collections::HashSet,
    fs::File,
    io::{self, Read as _},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, PoisonError},
};

use profiler_common::unwind::{UnwindRow, kind};

use super::table::Table;

const MAGIC: &[u8; 8] = b"PROFUNW\0";
/// Bumped on any change of the layout below (2: the padding gaps after the rows).
const VERSION: u32 = 2;
const HEADER: usize = 56;
/// Most rows a cached table may claim (128 MiB of them as cached): a bound on what a
/// damaged or hostile file makes us allocate, far above any real binary's.
const MAX_ROWS: usize = 1 << 24;
/// Kinds a row may have (`profiler_common::unwind::kind`).
const KINDS: [u8; 7] = [
    kind::NONE,
    kind::CFA_RSP,
    kind::CFA_RBP,
    kind::PLT,
    kind::STOP,
    kind::UNSUPPORTED,
    kind::SIGNAL,
];
/// Default bound of the directory: a few hundred binaries' tables.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Room a table write leaves free on the cache's disk: this, or a quarter of a smaller disk.
const KEEP_FREE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    #[error("not an unwind table cache file (bad magic or version)")]
    NotCache,
    #[error("cache file of {0} bytes does not match its row count")]
    Length(usize),
    #[error("cache file holds {0} rows, more than the kernel walk searches")]
    TooManyRows(usize),
    #[error("cache file compiled by another profiler build")]
    OtherBuild,
    #[error("cache file checksum mismatch (corrupt)")]
    Checksum,
    #[error("cache file row {0} is out of order or of an unknown kind")]
    BadRow(usize),
    #[error("cache file padding entry {0} is out of order or names no gap row")]
    BadPadding(usize),
}

/// The on-disk bytes of `table`, compiled by the profiler build `compiler`.
pub fn encode(table: &Table, compiler: &[u8; 20]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + table.rows.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(table.rows.len() as u32).to_le_bytes());
    out.extend_from_slice(&(table.fdes as u64).to_le_bytes());
    out.extend_from_slice(&(table.rbp_fdes as u64).to_le_bytes());
    out.extend_from_slice(compiler);
    out.extend_from_slice(&[0; 4]); // checksum, below
    for r in &table.rows {
        out.extend_from_slice(&r.pc.to_le_bytes());
        out.extend_from_slice(&r.cfa_off.to_le_bytes());
        out.extend_from_slice(&r.rbp_off.to_le_bytes());
        out.push(r.kind);
    }
    out.extend_from_slice(&(table.padding.len() as u32).to_le_bytes());
    for pc in &table.padding {
        out.extend_from_slice(&pc.to_le_bytes());
    }
    let crc = checksum(&out);
    out[52..56].copy_from_slice(&crc.to_le_bytes());
    out
}

/// crc32 of everything but the checksum field.
fn checksum(bytes: &[u8]) -> u32 {
    let mut h = flate2::Crc::new();
    h.update(&bytes[..52]);
    h.update(&bytes[HEADER..]);
    h.sum()
}

/// The table in `bytes`, if they are a sound cache file written by the build `compiler`.
pub fn decode(bytes: &[u8], compiler: &[u8; 20]) -> Result<Table, CacheError> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC || bytes[8..12] != VERSION.to_le_bytes() {
        return Err(CacheError::NotCache);
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let n = u32_at(12) as usize;
    if n > MAX_ROWS {
        return Err(CacheError::TooManyRows(n));
    }
    // The rows, then the padding gaps: a count and as many pcs (at most one per row).
    let body = HEADER + n * 8;
    let pads = match bytes.get(body..body + 4) {
        Some(c) => u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize,
        None => return Err(CacheError::Length(bytes.len())),
    };
    if pads > n || bytes.len() != body + 4 + pads * 4 {
        return Err(CacheError::Length(bytes.len()));
    }
    if bytes[32..52] != compiler[..] {
        return Err(CacheError::OtherBuild);
    }
    if u32_at(52) != checksum(bytes) {
        return Err(CacheError::Checksum);
    }
    let (fdes, rbp_fdes) = (u64_at(16), u64_at(24));
    let mut rows = Vec::with_capacity(n);
    for (i, r) in bytes[HEADER..body].chunks_exact(8).enumerate() {
        let row = UnwindRow {
            pc: u32::from_le_bytes(r[..4].try_into().expect("4 bytes")),
            cfa_off: u16::from_le_bytes([r[4], r[5]]),
            rbp_off: i8::from_le_bytes([r[6]]),
            kind: r[7],
        };
        let sorted = rows.last().is_none_or(|p: &UnwindRow| p.pc < row.pc);
        if !sorted || !KINDS.contains(&row.kind) {
            return Err(CacheError::BadRow(i));
        }
        rows.push(row);
    }
    if rbp_fdes > fdes || fdes > u64::from(u32::MAX) {
        return Err(CacheError::BadRow(0));
    }
    let mut padding: Vec<u32> = Vec::with_capacity(pads);
    for (i, c) in bytes[body + 4..].chunks_exact(4).enumerate() {
        let pc = u32::from_le_bytes(c.try_into().expect("4 bytes"));
        let sorted = padding.last().is_none_or(|p| *p < pc);
        // A gap row, not the last: the last row's range has no end, and the kernel's form
        // would leave the code before it without one.
        let gap = rows
            .binary_search_by_key(&pc, |r| r.pc)
            .is_ok_and(|at| rows[at].kind == kind::NONE && at + 1 < rows.len());
        if !sorted || !gap {
            return Err(CacheError::BadPadding(i));
        }
        padding.push(pc);
    }
    #[allow(
        clippy::needless_update,
        reason = "Table may gain fields the cache does not keep"
    )]
    Ok(Table {
        rows,
        fdes: fdes as usize,
        rbp_fdes: rbp_fdes as usize,
        padding,
        ..Table::default()
    })
}

/// The cache key of an ELF image: `b<build id>` or, without one, `h<length, crc32 and
/// SipHash of the bytes>` (96 bits of hash and the length: a false match would mis-unwind).
/// The bytes are hashed a few MB at a time, each let go of once hashed (`Image::done_with`),
/// and once per file identity while the profiler runs: librustc_driver, 150 MB, has no build
/// id, and every new rustc process that maps it asks for its table.
pub(crate) fn key(image: &impl super::table::Image) -> String {
    use object::Object as _;
    let build_id = object::File::parse(&**image)
        .ok()
        .and_then(|f| f.build_id().ok().flatten().map(<[u8]>::to_vec))
        .filter(|id| !id.is_empty() && id.len() <= 64);
    if let Some(id) = build_id {
        return format!("b{}", crate::util::hex(&id));
    }
    /// Identities hashed, at most this many (then forgotten all at once).
    const HASHED_MAX: usize = 1024;
    static HASHED: std::sync::Mutex<std::collections::BTreeMap<[i64; 5], String>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let identity = image.identity();
    if let Some(id) = identity
        && let Some(known) = HASHED.lock().ok().and_then(|h| h.get(&id).cloned())
    {
        return known;
    }
    let key = content_key(image);
    if let (Some(id), Ok(mut hashed)) = (identity, HASHED.lock()) {
        if hashed.len() >= HASHED_MAX {
            hashed.clear();
        }
        hashed.insert(id, key.clone());
    }
    key
}

/// `h<length, crc32 and SipHash of the bytes>`.
fn content_key(image: &impl super::table::Image) -> String {
    use std::hash::Hasher as _;
    // DefaultHasher::new() has fixed keys: the same bytes hash the same in every run of one
    // build (another build may differ: its files miss, as they would anyway). Both hash a
    // stream: bytes written in parts hash as if written at once.
    let mut sip = std::collections::hash_map::DefaultHasher::new();
    let mut crc = flate2::Crc::new();
    let mut at = 0;
    for part in image.chunks(super::table::RELEASE_EVERY) {
        sip.write(part);
        crc.update(part);
        image.done_with(at..at + part.len());
        at += part.len();
    }
    format!("h{:x}-{:08x}-{:016x}", image.len(), crc.sum(), sip.finish())
}

/// A directory of cache files.
#[derive(Debug, Clone)]
pub struct TableCache {
    dir: PathBuf,
    max_bytes: u64,
    compiler: [u8; 20],
    /// Keys of the tables being compiled now, shared by every clone (`compiling`).
    compiling: Arc<(Mutex<HashSet<String>>, Condvar)>,
}

/// A table being compiled by this thread (`TableCache::compiling`); the key is free again,
/// and the threads waiting for it woken, when it drops.
pub struct Compiling<'a> {
    cache: &'a TableCache,
    key: String,
}

impl Drop for Compiling<'_> {
    fn drop(&mut self) {
        let (keys, done) = &*self.cache.compiling;
        keys.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
        done.notify_all();
    }
}

impl TableCache {
    /// The cache in `dir` (created, mode 0700), bounded to `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            compiler: own_build_id(),
            compiling: Arc::default(),
        })
    }

    /// Waits while another thread compiles the table of cache key `key`, then holds the key
    /// until the guard drops. Two threads compile tables (the loader's pool for the kernel,
    /// the stack-copy thread for the copies of the same processes' first samples) and at a
    /// recording's start both want the same binaries at once: the second now reads what the
    /// first put here instead of compiling it again.
    pub fn compiling(&self, key: &str) -> Compiling<'_> {
        let (keys, done) = &*self.compiling;
        let mut held = keys.lock().unwrap_or_else(PoisonError::into_inner);
        while held.contains(key) {
            held = done.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        held.insert(key.to_owned());
        Compiling {
            cache: self,
            key: key.to_owned(),
        }
    }

    /// The default directory of `profiler record`: $XDG_CACHE_HOME or ~/.cache, then
    /// `profiler/unwind-tables`.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| Path::new(&h).join(".cache"))
            })?;
        Some(base.join("profiler").join("unwind-tables"))
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.unw"))
    }

    /// The cached table of the binary with cache key `key` (see `key`), if there is a sound one.
    pub fn get(&self, key: &str) -> Option<Table> {
        let path = self.path(key);
        let file = crate::util::open_regular(&path).ok()?;
        let meta = file.metadata().ok()?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        // Written by us, and by no one else since.
        if meta.uid() != euid || meta.mode() & 0o022 != 0 {
            log::debug!("{}: not ours alone; ignored", path.display());
            return None;
        }
        if meta.len() > (HEADER + MAX_ROWS * 8) as u64 {
            return None;
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take((HEADER + MAX_ROWS * 8) as u64)
            .read_to_end(&mut bytes)
            .ok()?;
        match decode(&bytes, &self.compiler) {
            Ok(table) => {
                // Recently used: the size bound removes the oldest files first.
                if let Ok(f) = File::options().write(true).open(&path) {
                    let _ = f.set_modified(std::time::SystemTime::now());
                }
                Some(table)
            }
            Err(e) => {
                log::debug!("{}: {e}; compiled again", path.display());
                None
            }
        }
    }

    /// Stores `table` as the binary `key`'s, then keeps the directory under its bound.
    pub fn put(&self, key: &str, table: &Table) {
        use std::io::Write as _;
        let bytes = encode(table, &self.compiler);
        if bytes.len() as u64 > self.max_bytes {
            return;
        }
        let path = self.path(key);
        // The disk's room goes to the agent's store first (its tables are kept beside its
        // windows, and the copy thread compiles every binary of the host's processes at its
        // start): a table that would leave less than `KEEP_FREE` of the disk free is not
        // kept (compiled again next time). Filled by tables, a small data disk left the
        // store no room once the disk had some again (tests/tests/agent.rs, full disk).
        if let Some((free, size)) = crate::util::disk_space(&self.dir)
            && free.saturating_sub(bytes.len() as u64) < (size / 4).min(KEEP_FREE)
        {
            log::debug!(
                "{}: not cached, it would leave less than a quarter of the disk or 1 GiB free",
                path.display()
            );
            return;
        }
        if let Err(e) = crate::util::write_atomic(&path, |w| w.write_all(&bytes)) {
            log::debug!(
                "{}: cannot write the unwind table cache: {e}",
                path.display()
            );
            return;
        }
        self.prune();
    }

    /// Removes the least recently used cache files until the directory is within its bound.
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".unw"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// The GNU build id of this profiler's executable (zero padded to 20 bytes), or, without
/// one, a hash of its length and modification time: tables compiled by another build miss.
fn own_build_id() -> [u8; 20] {
    let mut out = [0u8; 20];
    let Ok(exe) = File::open("/proc/self/exe") else {
        return out;
    };
    match crate::process::file_build_id(&exe) {
        Some(id) => {
            let n = id.len().min(20);
            out[..n].copy_from_slice(&id[..n]);
        }
        None => {
            let m = exe.metadata().ok();
            let stamp = m.map_or(0, |m| m.len() ^ (m.mtime() as u64).rotate_left(32));
            out[..8].copy_from_slice(&stamp.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("Debian's libc");
        super::super::table::compile(&libc).expect("libc compiles")
    }

    #[test]
    fn round_trip_and_every_kind_of_damage_is_refused() {
        let t = table();
        let id = [7u8; 20];
        let bytes = encode(&t, &id);
        let back = decode(&bytes, &id).expect("round trip");
        assert_eq!(back.rows, t.rows);
        assert_eq!((back.fdes, back.rbp_fdes), (t.fdes, t.rbp_fdes));
        assert!(t.padding.len() > 1000, "libc's padding gaps");
        assert_eq!(back.padding, t.padding);
        assert_eq!(
            decode(&bytes, &[8u8; 20]).err(),
            Some(CacheError::OtherBuild)
        );
        assert_eq!(decode(&bytes[..40], &id).err(), Some(CacheError::NotCache));
        assert_eq!(
            decode(&bytes[..bytes.len() - 1], &id).err(),
            Some(CacheError::Length(bytes.len() - 1))
        );
        let mut flipped = bytes.clone();
        flipped[HEADER + 100] ^= 1;
        assert_eq!(decode(&flipped, &id).err(), Some(CacheError::Checksum));
        // A row out of order with a valid checksum (a crafted file): refused all the same.
        let mut swapped = t.rows.clone();
        swapped.swap(10, 11);
        let crafted = encode(
            &Table {
                rows: swapped,
                ..Table::default()
            },
            &id,
        );
        assert_eq!(decode(&crafted, &id).err(), Some(CacheError::BadRow(11)));
        // A padding entry that is no gap row (a crafted file): refused.
        let crafted = encode(
            &Table {
                rows: t.rows.clone(),
                padding: vec![t.padding[0], t.padding[0] + 1],
                ..Table::default()
            },
            &id,
        );
        assert_eq!(decode(&crafted, &id).err(), Some(CacheError::BadPadding(1)));
        // Nor the last row (a NONE row too, but with no end to its range).
        let last = t.rows.last().expect("rows").pc;
        let crafted = encode(
            &Table {
                rows: t.rows.clone(),
                padding: vec![t.padding[0], last],
                ..Table::default()
            },
            &id,
        );
        assert_eq!(decode(&crafted, &id).err(), Some(CacheError::BadPadding(1)));
        let mut huge = bytes.clone();
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&huge, &id),
            Err(CacheError::TooManyRows(_))
        ));
    }

    #[test]
    fn keys_are_build_ids_or_content_hashes() {
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert!(key(&libc).starts_with('b'), "{}", key(&libc));
        let a = key(&b"no elf here".to_vec());
        assert!(a.starts_with('h'));
        assert_ne!(a, key(&b"no elf herf".to_vec()));
        assert_eq!(a, key(&b"no elf here".to_vec()));
        // Hashed in parts, keyed as when hashed at once (the keys of caches written before).
        use std::hash::Hasher as _;
        let big: Vec<u8> = (0..2 * super::super::table::RELEASE_EVERY + 5)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut sip = std::collections::hash_map::DefaultHasher::new();
        sip.write(&big);
        let mut crc = flate2::Crc::new();
        crc.update(&big);
        let at_once = format!("h{:x}-{:08x}-{:016x}", big.len(), crc.sum(), sip.finish());
        assert_eq!(key(&big), at_once);
    }

    #[test]
    fn files_are_read_back_and_the_directory_stays_bounded() {
        let dir = tempfile::Builder::new()
            .prefix("unw-cache-")
            .tempdir()
            .unwrap();
        let t = table();
        let one = encode(&t, &[0; 20]).len() as u64;
        // Room for two tables.
        let cache = TableCache::open(dir.path(), one * 2 + one / 2).unwrap();
        cache.put("b01", &t);
        assert_eq!(cache.get("b01").map(|t| t.rows.len()), Some(t.rows.len()));
        assert!(cache.get("b02").is_none());
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put("b02", &t);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // b01 used again: b02 is now the least recently used.
        assert!(cache.get("b01").is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put("b03", &t);
        let left: Vec<bool> = ["b01", "b02", "b03"]
            .iter()
            .map(|k| dir.path().join(format!("{k}.unw")).exists())
            .collect();
        assert_eq!(left, [true, false, true]);
        // A file others may write is not trusted.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            dir.path().join("b01.unw"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        assert!(cache.get("b01").is_none());
    }
}
