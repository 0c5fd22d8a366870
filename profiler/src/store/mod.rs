//! The agent's embedded store, beside the pipeline's end: one SQLite file (WAL, crash-safe)
//! under the data dir holding, per window, how many samples each (stack, pid, comm, cgroup)
//! had and, delta-coded beside each count, every one of those samples' time and CPU
//! (`times`), so a stored minute reads back as exactly what was sampled. Times can be kept
//! for a shorter period than counts; `read` then says which ranges have no exact times.
mod health;
mod intern;
mod read;
mod times;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use rusqlite::{Connection, OpenFlags, params};

pub(crate) use read::{Query, ReadLimits};

use crate::profile::Profile;
use intern::FrameKey;
/// A counts row: (stack, pid, tid, comm, cgroup id) in the window's profile.
type RowKey = (u32, u32, u32, u32, u64);

/// The database file's name inside the data dir.
pub(crate) const DB_FILE: &str = "profiles.db";

/// Windows deleted by age between two collections of unused stacks and names.
const GC_EVERY: u64 = 360;

/// Cached ids at most before the caches start afresh (they are only a shortcut).
const MAX_CACHED: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot use data dir {dir}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("store {path}")]
    Sql {
        path: String,
        source: rusqlite::Error,
    },
    #[error("no store at {0} (is --data-dir the agent's?)")]
    Missing(String),
    /// A read would rebuild more `what` than `max` (`ReadLimits`): the caller asked too much.
    #[error(
        "the range holds more than the {max} {what} one read may rebuild; ask for a shorter range or fewer comms"
    )]
    TooBig { what: &'static str, max: u64 },
    #[error("the store is damaged")]
    CorruptStack(#[source] intern::StackError),
    #[error("the store is damaged: the window stored at {start} ns")]
    CorruptTimes {
        start: u64,
        source: times::TimesError,
    },
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS windows(
  id INTEGER PRIMARY KEY,
  start_ns INTEGER NOT NULL,      -- wall clock, ns since the Unix epoch
  duration_ns INTEGER NOT NULL,
  frequency_hz INTEGER NOT NULL,
  event TEXT NOT NULL, hostname TEXT NOT NULL, kernel TEXT NOT NULL,
  cpus TEXT NOT NULL,             -- comma-separated CPU numbers
  recorded INTEGER NOT NULL, lost_ringbuf_full INTEGER NOT NULL, filtered INTEGER NOT NULL,
  kstack_failed INTEGER NOT NULL, ustack_failed INTEGER NOT NULL,
  has_times INTEGER NOT NULL DEFAULT 0); -- 1 while `counts.times` is kept (see times.rs)
CREATE INDEX IF NOT EXISTS windows_start ON windows(start_ns);
-- names, frames and stacks: intern.rs.
-- Samples per (stack, pid, thread, comm, cgroup) in a window; times: the samples' times and
-- CPUs (times.rs), or NULL; tid NULL = the pid (the main thread, or a row from before
-- threads were kept).
CREATE TABLE IF NOT EXISTS counts(
  window INTEGER NOT NULL, stack INTEGER NOT NULL, pid INTEGER NOT NULL,
  comm INTEGER NOT NULL, cgroup_id INTEGER NOT NULL, cgroup INTEGER NOT NULL,
  samples INTEGER NOT NULL,
  times BLOB,
  tid INTEGER);
CREATE INDEX IF NOT EXISTS counts_window ON counts(window);
";

/// How long and how much the store keeps (`Store::retain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Windows older than this are deleted, ns.
    pub max_age_ns: u64,
    /// Windows older than this keep their counts but lose their sample times, ns.
    pub keep_times_ns: u64,
    /// The live data is kept under this many bytes (oldest windows go first).
    pub max_bytes: u64,
}

/// An open store, for writing (the agent) or reading (query, the HTTP API).
pub struct Store {
    conn: Connection,
    path: PathBuf,
    names: HashMap<String, i64>,
    /// Stack blobs (`intern::encode_stack`).
    stacks: HashMap<Vec<u8>, i64>,
    frames: HashMap<FrameKey, i64>,
    /// Windows deleted since unused stacks and names were last collected.
    deleted_since_gc: u64,
    /// A bound below `--max-size` set when the disk filled (`health`), bytes.
    disk_cap: Option<u64>,
    /// The reserve file was deleted to get out of a full disk and is not back yet.
    reserve_spent: bool,
}

impl Store {
    /// Opens (creating it and the dir if needed) the store in `dir` for writing.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let dir_err = |source| StoreError::DataDir {
            dir: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        // Root ignores permission bits, so try a real write rather than trusting them.
        let probe = dir.join(".write-test");
        std::fs::write(&probe, b"").map_err(dir_err)?;
        let _ = std::fs::remove_file(&probe);
        let path = dir.join(DB_FILE);
        let conn = health::open_checked(&path)?;
        // Every statement of a window's write and retention stays parsed (rusqlite keeps 16).
        conn.set_prepared_statement_cache_capacity(32);
        let mut me = Self::with(conn, path);
        me.conn
            .execute_batch(health::PRAGMAS)
            .and_then(|()| me.conn.execute_batch(SCHEMA))
            .and_then(|()| intern::migrate(&me.conn))
            .and_then(|()| me.conn.execute_batch(intern::TABLES))
            .and_then(|()| me.conn.execute_batch(intern::INDEXES))
            .and_then(|()| times::migrate(&me.conn))
            .map_err(|e| me.err(e))?;
        // Without room for it now, it is made once there is (`after_success`).
        me.reserve_spent = !health::make_reserve(dir);
        Ok(me)
    }

    /// Opens an existing store read-only (the agent may be writing it meanwhile: WAL).
    pub fn open_read(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(DB_FILE);
        if !path.is_file() {
            return Err(StoreError::Missing(path.display().to_string()));
        }
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| sql(&path, e))?;
        let me = Self::with(conn, path);
        me.conn
            .execute_batch("PRAGMA busy_timeout=5000;")
            .map_err(|e| me.err(e))?;
        Ok(me)
    }

    fn with(conn: Connection, path: PathBuf) -> Self {
        Self {
            conn,
            path,
            names: HashMap::new(),
            stacks: HashMap::new(),
            frames: HashMap::new(),
            deleted_since_gc: 0,
            disk_cap: None,
            reserve_spent: false,
        }
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        sql(&self.path, e)
    }

    /// Stores one window: its meta and its samples counted per (stack, pid, comm, cgroup).
    /// On failure the transaction is rolled back and so are the id caches; a full disk also
    /// frees room (`health`) so that a later try can succeed.
    pub fn write_window(&mut self, p: &Profile) -> Result<(), StoreError> {
        match self.write_inner(p) {
            Ok(()) => {
                self.after_success();
                Ok(())
            }
            Err(e) => {
                // The ids cached during the rolled-back transaction name rows that do not
                // exist, and SQLite would hand them out again for other rows.
                self.clear_caches();
                if health::is_disk_full(&e) {
                    self.relieve_full_disk();
                }
                Err(self.err(e))
            }
        }
    }

    fn write_inner(&mut self, p: &Profile) -> rusqlite::Result<()> {
        if self.names.len() + self.stacks.len() + self.frames.len() > MAX_CACHED {
            self.clear_caches();
        }
        // Per row, its samples' (time, CPU): the count is their number.
        let mut counts: HashMap<RowKey, Vec<(u64, u32)>> = HashMap::new();
        for s in &p.samples {
            counts
                .entry((s.stack, s.pid, s.tid, s.comm, s.cgroup_id))
                .or_default()
                .push((s.offset_ns, s.cpu));
        }
        // A window read back from the store with some of its times gone stays without them.
        let timed = p.samples.iter().all(crate::profile::Sample::has_time);
        let cgroup_paths: HashMap<u64, &str> =
            p.cgroups.iter().map(|c| (c.id, c.path.as_str())).collect();
        let m = &p.meta;
        let cpus: Vec<String> = m.cpus.iter().map(u32::to_string).collect();
        let tx = self.conn.transaction()?;
        // Cached statements: the agent writes a window every 10 s, and parsing the SQL each
        // time was a visible part of its CPU.
        tx.prepare_cached(
            "INSERT INTO windows(start_ns, duration_ns, frequency_hz, event, hostname, kernel, \
             cpus, recorded, lost_ringbuf_full, filtered, kstack_failed, ustack_failed, \
             has_times) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )?
        .execute(params![
            m.start_unix_ns as i64,
            m.duration_ns as i64,
            m.frequency_hz,
            m.event,
            m.hostname,
            m.kernel_release,
            cpus.join(","),
            m.counters.recorded as i64,
            m.counters.lost_ringbuf_full as i64,
            m.counters.filtered as i64,
            m.counters.kstack_failed as i64,
            m.counters.ustack_failed as i64,
            timed,
        ])?;
        let window = tx.last_insert_rowid();
        let mut stack_ids: HashMap<u32, i64> = HashMap::new();
        for ((stack, pid, tid, comm, cgroup_id), mut samples) in counts {
            let sid = match stack_ids.get(&stack) {
                Some(&id) => id,
                None => {
                    let ids =
                        intern::stack_frames(&tx, &mut self.names, &mut self.frames, p, stack)?;
                    let id = intern::stack(&tx, &mut self.stacks, &ids)?;
                    stack_ids.insert(stack, id);
                    id
                }
            };
            let comm = intern::name(&tx, &mut self.names, p.str(comm))?;
            let path = cgroup_paths.get(&cgroup_id).copied().unwrap_or("");
            let cgroup = intern::name(&tx, &mut self.names, path)?;
            let n = samples.len() as i64;
            let blob = timed.then(|| times::encode(&mut samples));
            tx.prepare_cached(
                "INSERT INTO counts(window, stack, pid, comm, cgroup_id, cgroup, samples, times, \
                 tid) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                window,
                sid,
                pid,
                comm,
                cgroup_id as i64,
                cgroup,
                n,
                blob,
                // The main thread (most rows) as NULL: no bytes for it.
                (tid != pid).then_some(tid),
            ])?;
        }
        tx.commit()
    }

    /// Drops the sample times of windows older than `r.keep_times_ns` (their counts stay),
    /// deletes windows older than `r.max_age_ns`; then, until the live data fits in
    /// `r.max_bytes`, drops the times of the oldest windows that have them and only then
    /// deletes the oldest windows; then stacks and names no window uses. Returns the windows
    /// deleted.
    pub fn retain(&mut self, now_unix_ns: u64, r: Retention) -> Result<u64, StoreError> {
        self.retain_inner(now_unix_ns, r).map_err(|e| self.err(e))
    }

    fn retain_inner(&mut self, now: u64, r: Retention) -> rusqlite::Result<u64> {
        let max_bytes = self
            .disk_cap
            .map_or(r.max_bytes, |cap| cap.min(r.max_bytes));
        times::drop_older(&self.conn, now.saturating_sub(r.keep_times_ns) as i64)?;
        let cutoff = now.saturating_sub(r.max_age_ns) as i64;
        let mut deleted = self.delete_windows_where("start_ns + duration_ns < ?1", cutoff)?;
        // Deleted pages are reused, not returned: count the pages in use.
        while self.used_bytes()? > max_bytes {
            // Times go before counts, as they do by age: the oldest tenth of the windows
            // that still have them lose them first.
            if times::drop_oldest(&self.conn)? > 0 {
                continue;
            }
            let (n, oldest): (i64, Option<i64>) =
                self.conn
                    .query_row("SELECT count(*), min(start_ns) FROM windows", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?;
            if n <= 1 {
                break; // one window larger than the bound: keep it rather than nothing
            }
            // The oldest tenth (at least one), by start time.
            let nth: i64 = self.conn.query_row(
                "SELECT start_ns FROM windows ORDER BY start_ns LIMIT 1 OFFSET ?1",
                [(n / 10).max(1) - 1],
                |r| r.get(0),
            )?;
            deleted += self.delete_windows_where("start_ns <= ?1", nth.max(oldest.unwrap_or(0)))?;
            self.collect_garbage()?;
        }
        // Finding unused stacks scans every count: after age-based deletion (one window per
        // window, once the store is full) do it in batches, not every window.
        self.deleted_since_gc += deleted;
        if self.deleted_since_gc >= GC_EVERY {
            self.collect_garbage()?;
        }
        Ok(deleted)
    }

    fn delete_windows_where(&self, cond: &str, arg: i64) -> rusqlite::Result<u64> {
        // Cached statements (two conditions, so two of each): this runs at every window.
        let tx = self.conn.unchecked_transaction()?;
        tx.prepare_cached(&format!(
            "DELETE FROM counts WHERE window IN (SELECT id FROM windows WHERE {cond})"
        ))?
        .execute([arg])?;
        let n = tx
            .prepare_cached(&format!("DELETE FROM windows WHERE {cond}"))?
            .execute([arg])?;
        tx.commit()?;
        Ok(n as u64)
    }

    fn collect_garbage(&mut self) -> rusqlite::Result<()> {
        self.deleted_since_gc = 0;
        // First: the stacks are deleted in their own statement, so a failure further down
        // would otherwise leave cached ids naming deleted rows.
        self.clear_caches();
        self.conn.execute_batch(
            "DELETE FROM stacks WHERE id NOT IN (SELECT DISTINCT stack FROM counts);",
        )?;
        // Frame ids live inside stack texts, out of SQL's sight: gather them here.
        let mut used: std::collections::HashSet<i64> = std::collections::HashSet::new();
        {
            let mut stmt = self.conn.prepare("SELECT frames FROM stacks")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                // A stack that does not decode keeps no frame alive (it reads as corrupt).
                used.extend(intern::decode_stack(r.get_ref(0)?).unwrap_or_default());
            }
        }
        let all: Vec<i64> = self
            .conn
            .prepare("SELECT id FROM frames")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let tx = self.conn.unchecked_transaction()?;
        for id in all.into_iter().filter(|id| !used.contains(id)) {
            tx.execute("DELETE FROM frames WHERE id = ?1", [id])?;
        }
        tx.execute_batch(
            "DELETE FROM names WHERE id NOT IN (
               SELECT comm FROM counts UNION SELECT cgroup FROM counts
               UNION SELECT name FROM frames UNION SELECT module FROM frames
               UNION SELECT binary FROM frames);",
        )?;
        tx.commit()
    }

    fn clear_caches(&mut self) {
        self.names.clear();
        self.stacks.clear();
        self.frames.clear();
    }

    /// Bytes of the database in use (pages minus free pages).
    pub fn used_bytes(&self) -> rusqlite::Result<u64> {
        let get = |pragma: &str| -> rusqlite::Result<i64> {
            self.conn
                .prepare_cached(&format!("PRAGMA {pragma}"))?
                .query_row([], |r| r.get(0))
        };
        let pages = get("page_count")? - get("freelist_count")?;
        Ok((pages.max(0) * get("page_size")?) as u64)
    }
}

fn sql(path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Sql {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_hostile;
