//! Stored windows back into a `Profile`, so every output renders them. Each stored count
//! becomes its samples with their exact times, CPUs and threads.
//! Windows whose times are no longer kept (`--keep-times`, or stored before times were)
//! become `Meta::untimed` ranges: their samples sit at the window's start on `NO_CPU`, so
//! flame graphs count them and time views say the times are missing instead of drawing.
use std::collections::{BTreeMap, HashMap};

use super::{Store, StoreError};
use super::{intern, times};
use crate::profile::{
    Binary, Cgroup, Counters, Frame, FrameKind, Interner, Meta, NO_CPU, Process, Profile, Sample,
};

/// Samples one query may rebuild at most (about 40 bytes each in memory).
pub(crate) const MAX_SAMPLES: u64 = 20_000_000;

/// What one read may rebuild at most: its memory is bounded by these, whatever the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Samples (about 40 bytes each).
    pub max_samples: u64,
    /// Distinct stacks (a few hundred bytes each with their frames).
    pub max_stacks: usize,
}

impl ReadLimits {
    /// `profiler query`: a command run on purpose, with the machine's memory to itself.
    pub const QUERY: Self = Self {
        max_samples: MAX_SAMPLES,
        max_stacks: 5_000_000,
    };
}

/// Which stored windows and samples to read.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// Windows overlapping [since, until), wall clock, ns since the Unix epoch.
    pub since_unix_ns: u64,
    pub until_unix_ns: u64,
    /// Only these comms (any of them); empty = all.
    pub comms: Vec<String>,
    /// Only this cgroup path and those below it.
    pub cgroup: Option<String>,
}

struct Window {
    id: i64,
    start: u64,
    duration: u64,
    /// The window's sample times are stored.
    timed: bool,
}

impl Store {
    /// The samples of every window overlapping the query's range, as one profile.
    pub fn read(&self, q: &Query) -> Result<Profile, StoreError> {
        self.read_bounded(q, ReadLimits::QUERY)
    }

    /// Like `read`, refusing (with a message saying which bound) a range whose matching
    /// samples or stacks pass `limits`: the work is bounded by what is read, not by the span.
    pub fn read_bounded(&self, q: &Query, limits: ReadLimits) -> Result<Profile, StoreError> {
        self.read_snapshot(q, limits, &mut || {})
    }

    /// `read_bounded` in one read transaction: the windows and then their counts are read in
    /// many statements, and the agent commits meanwhile (a window, or `--keep-times` setting
    /// a window's times to NULL and its `has_times` to 0 together). Each statement on its own
    /// would see the store of its moment: a window read as timed, then its counts read
    /// without their times ("the store is damaged"), or counts of windows since deleted.
    /// `between` runs after the windows are read (the tests commit there).
    pub(super) fn read_snapshot(
        &self,
        q: &Query,
        limits: ReadLimits,
        between: &mut dyn FnMut(),
    ) -> Result<Profile, StoreError> {
        // Deferred: the snapshot is taken by the first read; rolled back (nothing to undo)
        // when dropped.
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        let read = self.read_inner(q, limits, between);
        drop(tx);
        read.map_err(|e| match e {
            ReadError::Sql(e) => self.err(e),
            ReadError::Store(e) => e,
        })
    }

    fn read_inner(
        &self,
        q: &Query,
        limits: ReadLimits,
        between: &mut dyn FnMut(),
    ) -> Result<Profile, ReadError> {
        // A store of an older agent, opened read-only, has no time columns: counts only.
        let (has_times, times) = if times::has_columns(&self.conn)? {
            ("has_times", "c.times")
        } else {
            ("0", "NULL")
        };
        let (windows, meta) = self.read_windows(q, has_times)?;
        between();
        let start = meta.start_unix_ns;
        // Sized once from the counts (comm filter applied, cgroup not: an upper bound), so the
        // vector never doubles past the limit on its way there.
        let upper = self.matching_samples(&windows, &q.comms)?;
        if upper > limits.max_samples && q.cgroup.is_none() {
            return Err(too_many("samples", limits.max_samples)); // exact without a cgroup
        }
        let samples = Vec::with_capacity(upper.min(limits.max_samples) as usize);
        // A store of an agent from before threads were kept reads tid = pid.
        let tid = if times::has_tid(&self.conn)? {
            "coalesce(c.tid, c.pid)"
        } else {
            "c.pid"
        };
        let mut counts = self.conn.prepare(&format!(
            "SELECT c.stack, c.pid, n.text, c.cgroup_id, g.text, c.samples, {times}, {tid} FROM counts \
             c JOIN names n ON n.id = c.comm JOIN names g ON g.id = c.cgroup WHERE c.window = ?1",
        ))?;
        let mut rebuild = Rebuild::new(&self.conn, meta, limits, samples)?;
        for w in &windows {
            let base = w.start.saturating_sub(start);
            if !w.timed {
                rebuild.add_untimed(base, w.duration);
            }
            let mut rows = counts.query([w.id])?;
            while let Some(r) = rows.next()? {
                rebuild.add_count(q, w, base, r)?;
            }
        }
        Ok(rebuild.finish())
    }

    /// The windows overlapping the query's range, in time order, and the profile's `Meta`
    /// from them: the first window's facts, the span to the end of the last, the counters
    /// summed. `has_times` is the column saying a window's times are kept ("0" without it).
    fn read_windows(&self, q: &Query, has_times: &str) -> rusqlite::Result<(Vec<Window>, Meta)> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT id, start_ns, duration_ns, frequency_hz, event, hostname, kernel, cpus, \
             recorded, lost_ringbuf_full, filtered, kstack_failed, ustack_failed, {has_times} \
             FROM windows WHERE start_ns < ?1 AND start_ns + duration_ns > ?2 ORDER BY start_ns",
        ))?;
        let mut windows = Vec::new();
        let mut meta = Meta::default();
        let mut rows = stmt.query([q.until_unix_ns as i64, q.since_unix_ns as i64])?;
        while let Some(r) = rows.next()? {
            let w = Window {
                id: r.get(0)?,
                start: r.get::<_, i64>(1)? as u64,
                duration: r.get::<_, i64>(2)? as u64,
                timed: r.get::<_, i64>(13)? == 1,
            };
            if windows.is_empty() {
                meta.start_unix_ns = w.start;
                meta.frequency_hz = r.get(3)?;
                meta.event = r.get(4)?;
                meta.hostname = r.get(5)?;
                meta.kernel_release = r.get(6)?;
                let cpus: String = r.get(7)?;
                meta.cpus = cpus.split(',').filter_map(|c| c.parse().ok()).collect();
            }
            meta.duration_ns = (w.start + w.duration).saturating_sub(meta.start_unix_ns);
            let c = &mut meta.counters;
            let get = |i| r.get::<_, i64>(i).map(|v| v as u64);
            *c = Counters {
                recorded: c.recorded + get(8)?,
                lost_ringbuf_full: c.lost_ringbuf_full + get(9)?,
                filtered: c.filtered + get(10)?,
                kstack_failed: c.kstack_failed + get(11)?,
                ustack_failed: c.ustack_failed + get(12)?,
            };
            windows.push(w);
        }
        Ok((windows, meta))
    }
}

/// A read's `TooBig` error: more `what` than `max`.
fn too_many(what: &'static str, max: u64) -> ReadError {
    ReadError::Store(StoreError::TooBig { what, max })
}

impl Query {
    /// Whether the query asks for the samples of `comm` in `cgroup`.
    fn matches(&self, comm: &str, cgroup: &str) -> bool {
        (self.comms.is_empty() || self.comms.iter().any(|c| c == comm))
            && self
                .cgroup
                .as_ref()
                .is_none_or(|want| crate::cgroups::is_at_or_below(cgroup, want))
    }
}

/// A profile being rebuilt from stored counts, one at a time, within the read's limits.
struct Rebuild<'conn> {
    limits: ReadLimits,
    out: Interner,
    /// Stored stack and frame ids to the profile's.
    stacks: HashMap<i64, u32>,
    frames: HashMap<i64, u32>,
    processes: BTreeMap<u32, Process>,
    cgroups: BTreeMap<u64, String>,
    samples: Vec<Sample>,
    /// `Meta::untimed`.
    untimed: Vec<(u64, u64)>,
    stack_text: rusqlite::Statement<'conn>,
    frame_of: rusqlite::Statement<'conn>,
}

impl<'conn> Rebuild<'conn> {
    /// `samples` is empty, sized for what the read may hold.
    fn new(
        conn: &'conn rusqlite::Connection,
        meta: Meta,
        limits: ReadLimits,
        samples: Vec<Sample>,
    ) -> rusqlite::Result<Self> {
        Ok(Self {
            limits,
            out: Interner::new(meta),
            stacks: HashMap::new(),
            frames: HashMap::new(),
            processes: BTreeMap::new(),
            cgroups: BTreeMap::new(),
            samples,
            untimed: Vec::new(),
            stack_text: conn.prepare("SELECT frames FROM stacks WHERE id = ?1")?,
            frame_of: conn.prepare(
                "SELECT f.kernel, n.text, m.text, f.addr, b.text FROM frames f JOIN names n ON \
                 n.id = f.name JOIN names m ON m.id = f.module JOIN names b ON b.id = f.binary \
                 WHERE f.id = ?1",
            )?,
        })
    }

    /// A window whose times are not kept, `base` ns into the profile, to the untimed ranges.
    fn add_untimed(&mut self, base: u64, duration: u64) {
        // Adjacent windows make one range.
        match self.untimed.last_mut() {
            Some((_, end)) if *end >= base => *end = (*end).max(base + duration),
            _ => self.untimed.push((base, base + duration)),
        }
    }

    /// One stored count of window `w` (`base` ns into the profile) as its samples, unless the
    /// query leaves its comm or cgroup out.
    fn add_count(
        &mut self,
        q: &Query,
        w: &Window,
        base: u64,
        r: &rusqlite::Row<'_>,
    ) -> Result<(), ReadError> {
        let comm: String = r.get(2)?;
        let cgroup: String = r.get(4)?;
        if !q.matches(&comm, &cgroup) {
            return Ok(());
        }
        let n = r.get::<_, i64>(5)?.max(0) as u64;
        if self.samples.len() as u64 + n > self.limits.max_samples {
            return Err(too_many("samples", self.limits.max_samples));
        }
        let stack = self.stack(r.get(0)?)?;
        let pid: u32 = r.get(1)?;
        let tid: u32 = r.get(7)?;
        let cgroup_id = r.get::<_, i64>(3)? as u64;
        let comm_id = self.out.string(&comm);
        self.processes.entry(pid).or_insert_with(|| Process {
            pid,
            comm: comm.clone(),
            cgroup: cgroup.clone(),
            ..Process::default()
        });
        self.cgroups.entry(cgroup_id).or_insert(cgroup);
        let sample = |offset_ns, cpu| Sample {
            offset_ns,
            cpu,
            pid,
            tid,
            cgroup_id,
            comm: comm_id,
            stack,
        };
        if w.timed {
            let blob: Option<Vec<u8>> = r.get(6)?;
            let at = times::decode(blob.as_deref().unwrap_or_default(), n, w.duration).map_err(
                |source| {
                    ReadError::Store(StoreError::CorruptTimes {
                        start: w.start,
                        source,
                    })
                },
            )?;
            self.samples
                .extend(at.into_iter().map(|(t, cpu)| sample(base + t, cpu)));
        } else {
            // Times unknown: the window's start, on no CPU (see `Meta::untimed`).
            self.samples.extend((0..n).map(|_| sample(base, NO_CPU)));
        }
        Ok(())
    }

    /// The profile's id of stored stack `db_stack`, interned with its frames the first time.
    fn stack(&mut self, db_stack: i64) -> Result<u32, ReadError> {
        if let Some(&s) = self.stacks.get(&db_stack) {
            return Ok(s);
        }
        if self.stacks.len() >= self.limits.max_stacks {
            return Err(too_many("stacks", self.limits.max_stacks as u64));
        }
        let ids = self
            .stack_text
            .query_row([db_stack], |r| Ok(intern::decode_stack(r.get_ref(0)?)))?
            .map_err(|e| ReadError::Store(StoreError::CorruptStack(e)))?;
        let s = parse_stack(&mut self.out, &mut self.frame_of, &mut self.frames, &ids)?;
        self.stacks.insert(db_stack, s);
        Ok(s)
    }

    /// The profile, with its processes, cgroups and samples in time order.
    fn finish(self) -> Profile {
        let Self {
            mut out,
            processes,
            cgroups,
            mut samples,
            untimed,
            ..
        } = self;
        for p in processes.into_values() {
            out.process(p);
        }
        for (id, path) in cgroups {
            out.cgroup(Cgroup { id, path });
        }
        // Sorted in place and moved in: pushing them one by one held two copies at the peak.
        samples.sort_unstable_by_key(|s| s.offset_ns);
        let mut profile = out.finish();
        profile.samples = samples;
        profile.meta.untimed = untimed;
        profile
    }
}

impl Store {
    /// Samples in `windows` of any of `comms` (all if empty), summed in SQL.
    fn matching_samples(&self, windows: &[Window], comms: &[String]) -> rusqlite::Result<u64> {
        let mut per_comm = self.conn.prepare(
            "SELECT n.text, sum(c.samples) FROM counts c JOIN names n ON n.id = c.comm \
             WHERE c.window = ?1 GROUP BY c.comm",
        )?;
        let mut total = 0u64;
        for w in windows {
            let mut rows = per_comm.query([w.id])?;
            while let Some(r) = rows.next()? {
                let comm: String = r.get(0)?;
                if comms.is_empty() || comms.contains(&comm) {
                    total = total.saturating_add(r.get::<_, i64>(1)?.max(0) as u64);
                }
            }
        }
        Ok(total)
    }
}

/// Interns a stored stack (frame ids, root first) into the profile.
fn parse_stack(
    out: &mut Interner,
    frame_of: &mut rusqlite::Statement<'_>,
    frames: &mut HashMap<i64, u32>,
    stored: &[i64],
) -> rusqlite::Result<u32> {
    let mut ids = Vec::new();
    for &id in stored {
        if let Some(&f) = frames.get(&id) {
            ids.push(f);
            continue;
        }
        let (kernel, name, module, addr, binary): (bool, String, String, i64, String) = frame_of
            .query_row([id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?;
        let binary = match binary.split_once('\t') {
            Some((path, build_id)) => out.binary(Binary {
                path: path.to_owned(),
                build_id: build_id.to_owned(),
            }),
            None => 0,
        };
        let (name, module) = (out.string(&name), out.string(&module));
        let f = out.frame(Frame {
            name,
            module,
            kind: if kernel {
                FrameKind::Kernel
            } else {
                FrameKind::User
            },
            addr: addr as u64,
            binary,
        });
        frames.insert(id, f);
        ids.push(f);
    }
    Ok(out.stack(ids))
}

enum ReadError {
    /// Named with the store's path by `Store::err` when the read ends.
    Sql(rusqlite::Error),
    /// Too big or corrupt: as it is.
    Store(StoreError),
}

impl From<rusqlite::Error> for ReadError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}
