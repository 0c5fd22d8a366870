//! The store's defences, at its edge with the disk: a corrupt file found at start is moved
//! aside (`open_checked`), and a full disk is survived (`relieve_full_disk`).
//!
//! Why a reserve file: in WAL mode every change, a deletion too, is first appended to the WAL
//! and later copied into the main file, which may have to grow. With the disk full neither
//! can happen, so nothing can be freed: the store is stuck with all of it in the WAL. The
//! reserve is a few MiB the store owns; deleting it makes room for one checkpoint and one
//! round of pruning, after which new windows reuse the pages freed inside the file.
use std::{
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use rusqlite::{Connection, ErrorCode};

use super::{Store, StoreError, sql};

/// Set on every connection that writes. The WAL is checkpointed every 256 pages (1 MiB of
/// 4 KiB pages) and cut back to `RESERVE_BYTES` after, so one checkpoint never needs more new
/// room than the reserve holds. The page cache is 512 KiB instead of SQLite's 2 MB: a
/// window's write touches the tails of the tables and a few index pages (names, frames and
/// stacks are found in the store's own caches first), while a bigger cache lets the agent's
/// RSS grow with the file (up to 2 MB) over its first hours; other pages come from the
/// kernel's page cache. A smaller cache costs about a millisecond more per window written
/// (the extra page reads) and keeps SQLite's memory at a third of the default's over an
/// hour of windows.
pub(super) const PRAGMAS: &str = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; \
     PRAGMA busy_timeout=5000; PRAGMA wal_autocheckpoint=256; \
     PRAGMA journal_size_limit=2097152; PRAGMA cache_size=-512;";

/// Bytes kept in the reserve file (see the module comment).
pub(super) const RESERVE_BYTES: usize = 2 << 20;

/// The reserve file's name inside the data dir.
pub(super) const RESERVE_FILE: &str = ".reserve";

/// After a full disk, the store is kept to this share of the file's size (percent), so the
/// next windows fit in pages freed inside it.
const FULL_DISK_KEEP_PERCENT: u64 = 90;

/// Opens `path`, checking it first with `PRAGMA quick_check`. A corrupt file (or one that is
/// not a database) is renamed `profiles.db.corrupt-UNIXSECONDS`, with its WAL, and an empty
/// store takes its place: the agent keeps profiling, and the damaged file is kept for a look.
/// Other failures (permissions, a locked file) are errors: only corruption moves a file.
pub(super) fn open_checked(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| sql(path, e))?;
    let problem = match quick_check(&conn) {
        Ok(None) => return Ok(conn),
        Ok(Some(problem)) => problem,
        Err(e) if is_corruption(&e) => e.to_string(),
        Err(e) => return Err(sql(path, e)),
    };
    drop(conn);
    let aside = move_aside(path).map_err(|source| StoreError::DataDir {
        dir: path.display().to_string(),
        source,
    })?;
    log::error!(
        "store {} is corrupt ({problem}); moved it to {} and started an empty store",
        path.display(),
        aside.display()
    );
    Connection::open(path).map_err(|e| sql(path, e))
}

/// None if the file is sound, else the first problem `quick_check` names.
fn quick_check(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let mut stmt = conn.prepare("PRAGMA quick_check")?;
    let rows: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(match rows.as_slice() {
        [only] if only == "ok" => None,
        [] => Some("quick_check returned nothing".to_owned()),
        [first, ..] => Some(first.clone()),
    })
}

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

/// True when `e` says the disk (or the file system's quota) is full.
pub(super) fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::DiskFull)
}

/// Renames the database and its WAL out of the way; the shared-memory index is rebuilt.
fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = PathBuf::from(format!("{}.corrupt-{secs}", path.display()));
    std::fs::rename(path, &aside)?;
    let side = |suffix: &str| PathBuf::from(format!("{}{suffix}", path.display()));
    let _ = std::fs::rename(side("-wal"), format!("{}-wal", aside.display()));
    let _ = std::fs::remove_file(side("-shm"));
    Ok(aside)
}

/// Creates the reserve in `dir` if it is missing; true if it is there afterwards. Real
/// blocks, not a sparse file: it must free space when deleted.
pub(super) fn make_reserve(dir: &Path) -> bool {
    let path = dir.join(RESERVE_FILE);
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == RESERVE_BYTES as u64) {
        return true;
    }
    match std::fs::write(&path, vec![0u8; RESERVE_BYTES]) {
        Ok(()) => true,
        Err(_) => {
            let _ = std::fs::remove_file(&path);
            false
        }
    }
}

/// Bytes free for us on the file system holding `dir` (0 if unknown).
fn free_bytes(dir: &Path) -> u64 {
    crate::util::disk_space(dir).map_or(0, |(free, _)| free)
}

impl Store {
    fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// After a successful write: the reserve is made again once the disk has room for it, and
    /// the bound set by a full disk is lifted once there is also room for the store to grow
    /// (a tenth of its file), so a disk that is just full does not flap between the two.
    pub(super) fn after_success(&mut self) {
        if self.disk_cap.is_none() && !self.reserve_spent {
            return;
        }
        let dir = self.dir().to_owned();
        let file = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        let margin = (RESERVE_BYTES as u64).max(file / 10);
        if self.reserve_spent && free_bytes(&dir) >= RESERVE_BYTES as u64 + margin {
            self.reserve_spent = !make_reserve(&dir);
        }
        if self.disk_cap.is_some() && !self.reserve_spent && free_bytes(&dir) >= margin {
            log::warn!("the disk has room again; the store may grow to its --max-size");
            self.disk_cap = None;
        }
    }

    /// The disk is full: spend the reserve on a checkpoint (so the WAL's content is in the
    /// main file and the WAL can be cut), then delete the oldest windows until the store uses
    /// at most `FULL_DISK_KEEP_PERCENT` of its file, so the next windows fit in freed pages.
    /// That bound stays (in `retain` too) until the disk has room again.
    pub(super) fn relieve_full_disk(&mut self) {
        let _ = std::fs::remove_file(self.dir().join(RESERVE_FILE));
        self.reserve_spent = true;
        let result = (|| -> rusqlite::Result<u64> {
            self.checkpoint()?;
            let get = |pragma: &str| -> rusqlite::Result<i64> {
                self.conn
                    .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
            };
            let file = (get("page_count")? * get("page_size")?).max(0) as u64;
            let cap = file / 100 * FULL_DISK_KEEP_PERCENT;
            self.disk_cap = Some(self.disk_cap.map_or(cap, |c| c.min(cap)));
            let deleted = self.retain_inner(
                0,
                super::Retention {
                    max_age_ns: u64::MAX,
                    keep_times_ns: u64::MAX,
                    max_bytes: cap,
                },
            )?;
            self.checkpoint()?;
            Ok(deleted)
        })();
        match result {
            Ok(deleted) => log::warn!(
                "the disk is full: deleted the {deleted} oldest windows to keep the store under {} bytes until there is room again",
                self.disk_cap.unwrap_or(0)
            ),
            Err(e) => log::warn!(
                "the disk is full and the store cannot free room yet: {}",
                crate::util::chain(&e)
            ),
        }
    }

    /// Copies the WAL into the main file and cuts the WAL back to nothing.
    fn checkpoint(&self) -> rusqlite::Result<()> {
        let (busy, _, _): (i64, i64, i64) =
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
        if busy != 0 {
            // A reader holds an old snapshot: the next try will get further.
            log::debug!("store checkpoint incomplete: a reader is busy");
        }
        Ok(())
    }
}
