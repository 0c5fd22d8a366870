//! The time dimension of a profile: FlameScope's sub-second heat map, per-CPU utilisation per
//! second, and time-range slices. Pure functions over `Profile`; outputs (the heat map page,
//! `report --cpus`, time-range flame graphs) render from them.
use std::collections::HashMap;

use super::{FrameKind, Profile, Sample, StrId};

const NS_PER_S: u64 = 1_000_000_000;

/// FlameScope's default: 50 rows per second, 20 ms each.
pub const DEFAULT_ROWS: u32 = 50;

/// A CPU counts as saturated at this busy percentage or more...
pub const SATURATED_PCT: f64 = 90.0;
/// ...for at least this many consecutive seconds.
pub const SATURATED_SECS: usize = 2;

/// Most one-second columns a heat map or per-second CPU table spans (one day): the tables are
/// dense in time, so their size follows the span of the samples, which a capture sets.
pub const MAX_SPAN_SECS: u64 = 86_400;
/// Most CPU x second cells of the per-CPU tables: a day on 24 CPUs, an hour on 582. A cell is
/// 64 bytes in `report --cpus`'s table and ~14 characters of its text, so this keeps it near
/// 128 MB and 30 MB of output.
pub const MAX_CPU_SECONDS: u64 = 1 << 21;

/// The samples span more time than the per-second tables cover.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the samples span {secs} s on {cpus} CPUs; heat maps and per-second tables cover at most {MAX_SPAN_SECS} s and {MAX_CPU_SECONDS} CPU-seconds: pick a shorter time range (report --from/--to, query --since/--until)"
)]
pub struct SpanTooLong {
    pub secs: u64,
    pub cpus: usize,
}

/// Which samples to keep. Every `None`/empty field keeps everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only these CPUs (empty: all).
    pub cpus: Vec<u32>,
    pub pid: Option<u32>,
    /// Exact thread comm.
    pub comm: Option<String>,
    /// cgroup v2 id.
    pub cgroup_id: Option<u64>,
}

impl Filter {
    /// A predicate over samples of `profile` (the comm is resolved to its string id once).
    pub fn matcher<'a>(&'a self, profile: &Profile) -> impl Fn(&Sample) -> bool + 'a {
        // A comm that is not in the profile matches nothing: u32::MAX is never a string id.
        let comm: Option<StrId> = self.comm.as_ref().map(|c| {
            profile
                .strings
                .iter()
                .position(|s| s == c)
                .map_or(StrId::MAX, |i| i as StrId)
        });
        move |s: &Sample| {
            (self.cpus.is_empty() || self.cpus.contains(&s.cpu))
                && self.pid.is_none_or(|p| p == s.pid)
                && comm.is_none_or(|c| c == s.comm)
                && self.cgroup_id.is_none_or(|g| g == s.cgroup_id)
        }
    }
}

/// The idle task: FlameScope drops these samples, and they are not "busy" time.
pub fn is_idle(s: &Sample) -> bool {
    s.pid == 0
}

/// A busy sample with a real time and CPU: what the time views (heat map, CPU tables) count.
pub fn is_timed_busy(s: &Sample) -> bool {
    !is_idle(s) && s.has_time()
}

/// Whole seconds the grid spans: `first_s` is floor(first sample offset, s); `cols` is
/// FlameScope's `ceil(end) - floor(start)`, plus one when the last sample sits exactly on a
/// second boundary (FlameScope would index past its grid there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// First column's second, as an offset from the capture start, s.
    pub first_s: u64,
    /// Number of one-second columns.
    pub cols: usize,
}

impl Span {
    /// The span of every sample in `profile` (idle ones too: they mark time that passed) and
    /// of its untimed ranges (shown as such).
    pub fn of(profile: &Profile) -> Span {
        let untimed = profile
            .meta
            .untimed
            .iter()
            .map(|&(from, to)| (from, to.saturating_sub(1).max(from)));
        let (lo, hi) = profile
            .samples
            .iter()
            .map(|s| (s.offset_ns, s.offset_ns))
            .chain(untimed)
            .fold((u64::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
        if lo > hi {
            return Span {
                first_s: 0,
                cols: 0,
            };
        }
        let first_s = lo / NS_PER_S;
        let last_col = hi / NS_PER_S - first_s;
        let ceil = hi.div_ceil(NS_PER_S) - first_s;
        Span {
            first_s,
            cols: (ceil as usize).max(last_col as usize + 1),
        }
    }

    /// The span of `profile`, refused when a dense table of it (one column per second, one
    /// row per CPU for `cpus` rows) would pass the bounds above.
    pub fn bounded(profile: &Profile, cpus: usize) -> Result<Span, SpanTooLong> {
        let span = Span::of(profile);
        let secs = span.cols as u64;
        if secs > MAX_SPAN_SECS || secs.saturating_mul(cpus as u64) > MAX_CPU_SECONDS {
            return Err(SpanTooLong { secs, cpus });
        }
        Ok(span)
    }

    /// Column of a sample: `floor(t - floor(start))`.
    pub fn col(&self, offset_ns: u64) -> usize {
        (offset_ns / NS_PER_S - self.first_s) as usize
    }

    /// Per column: whether any part of its second lies in an untimed range of `profile`
    /// (its samples' times are not known: the column must say so, not look quiet).
    pub fn untimed_cols(&self, profile: &Profile) -> Vec<bool> {
        let mut cols = vec![false; self.cols];
        for &(from, to) in &profile.meta.untimed {
            if to <= from {
                continue;
            }
            let first = (from / NS_PER_S).max(self.first_s);
            let last = ((to - 1) / NS_PER_S).min(self.first_s + self.cols as u64 - 1);
            for sec in first..=last {
                cols[(sec - self.first_s) as usize] = true;
            }
        }
        cols
    }
}

/// Row of a sample within its second: `rows - floor(rows * frac(t)) - 1`, so row 0 (the top)
/// is the END of the second. Integer arithmetic: exact at slice boundaries.
pub fn row(offset_ns: u64, rows: u32) -> u32 {
    let frac_ns = offset_ns % NS_PER_S;
    rows - (u64::from(rows) * frac_ns / NS_PER_S) as u32 - 1
}

/// FlameScope's heat map: `cells[col][row]` = non-idle samples in that slice of that second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeatMap {
    pub span: Span,
    /// Slices per second.
    pub rows: u32,
    /// `cols` columns of `rows` counts each.
    pub cells: Vec<Vec<u64>>,
    /// Largest cell: the colour scale's top.
    pub max: u64,
}

/// Builds the heat map of the samples that pass `filter`; the span is the whole profile's, so
/// filtered maps line up with the unfiltered one.
pub fn heat_map(profile: &Profile, rows: u32, filter: &Filter) -> Result<HeatMap, SpanTooLong> {
    assert!(rows > 0, "a heat map needs at least one row per second");
    let span = Span::bounded(profile, cpu_ids(profile).len())?;
    let keep = filter.matcher(profile);
    let mut cells = vec![vec![0u64; rows as usize]; span.cols];
    for s in profile
        .samples
        .iter()
        .filter(|s| is_timed_busy(s) && keep(s))
    {
        cells[span.col(s.offset_ns)][row(s.offset_ns, rows) as usize] += 1;
    }
    let max = cells.iter().flatten().copied().max().unwrap_or(0);
    Ok(HeatMap {
        span,
        rows,
        cells,
        max,
    })
}

/// One CPU during one second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSecond {
    /// Non-idle samples.
    pub busy: u64,
    /// Non-idle samples whose leaf frame is in the kernel.
    pub kernel: u64,
    /// Busy samples / expected samples (`frequency_hz`), %, at most 100.
    pub busy_pct: f64,
    /// Share of the second in user code, %; `user_pct + sys_pct == busy_pct`.
    pub user_pct: f64,
    /// Share of the second in the kernel, %.
    pub sys_pct: f64,
    /// The comm with the most busy samples, and its count (ties: the smaller string id).
    pub top: Option<(StrId, u64)>,
    /// Part of a run of >= SATURATED_SECS seconds at >= SATURATED_PCT.
    pub saturated: bool,
}

/// Per-CPU utilisation, one row per CPU, one entry per second of `span`.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTable {
    pub span: Span,
    /// CPUs in ascending order: the recorded ones and any seen in samples.
    pub cpus: Vec<u32>,
    /// `seconds[i][col]` is `cpus[i]` during second `span.first_s + col`.
    pub seconds: Vec<Vec<CpuSecond>>,
}

impl CpuTable {
    /// Every run of consecutive saturated seconds, CPU by CPU, each in time order: the CPU's
    /// index in `cpus` and `seconds`, and the run's columns.
    pub fn saturated_runs(&self) -> Vec<(usize, std::ops::Range<usize>)> {
        let mut runs = Vec::new();
        for (ci, row) in self.seconds.iter().enumerate() {
            let mut col = 0;
            while col < row.len() {
                if !row[col].saturated {
                    col += 1;
                    continue;
                }
                let start = col;
                while col < row.len() && row[col].saturated {
                    col += 1;
                }
                runs.push((ci, start..col));
            }
        }
        runs
    }
}

/// The CPUs of `profile`, ascending: the recorded ones and any seen in samples.
pub fn cpu_ids(profile: &Profile) -> Vec<u32> {
    let mut cpus: Vec<u32> = profile.meta.cpus.clone();
    cpus.extend(
        profile
            .samples
            .iter()
            .filter(|s| s.has_time())
            .map(|s| s.cpu),
    );
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// Per-CPU, per-second busy %, user/kernel split and top process. Expected samples per second
/// is `meta.frequency_hz` (a partial first or last second reads low: it had fewer ticks).
pub fn cpu_table(profile: &Profile, filter: &Filter) -> Result<CpuTable, SpanTooLong> {
    let keep = filter.matcher(profile);
    let mut cpus = cpu_ids(profile);
    if !filter.cpus.is_empty() {
        cpus.retain(|c| filter.cpus.contains(c));
    }
    let span = Span::bounded(profile, cpus.len())?;
    let index: HashMap<u32, usize> = cpus.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let mut seconds = vec![vec![CpuSecond::default(); span.cols]; cpus.len()];
    // Per (cpu index, col): comm -> busy samples; small, since only busy samples count.
    let mut comms: HashMap<(usize, usize), HashMap<StrId, u64>> = HashMap::new();
    for s in profile
        .samples
        .iter()
        .filter(|s| is_timed_busy(s) && keep(s))
    {
        let (ci, col) = (index[&s.cpu], span.col(s.offset_ns));
        let cell = &mut seconds[ci][col];
        cell.busy += 1;
        if leaf_is_kernel(profile, s.stack) {
            cell.kernel += 1;
        }
        *comms
            .entry((ci, col))
            .or_default()
            .entry(s.comm)
            .or_default() += 1;
    }
    let expected = f64::from(profile.meta.frequency_hz.max(1));
    for (ci, row) in seconds.iter_mut().enumerate() {
        for (col, cell) in row.iter_mut().enumerate() {
            cell.busy_pct = (cell.busy as f64 * 100.0 / expected).min(100.0);
            // Split the clamped total in the samples' proportion, so the parts add up.
            let sys_share = if cell.busy == 0 {
                0.0
            } else {
                cell.kernel as f64 / cell.busy as f64
            };
            cell.sys_pct = cell.busy_pct * sys_share;
            cell.user_pct = cell.busy_pct - cell.sys_pct;
            cell.top = comms.get(&(ci, col)).and_then(|m| {
                m.iter()
                    .map(|(&c, &n)| (c, n))
                    .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            });
        }
        mark_saturated(row);
    }
    Ok(CpuTable {
        span,
        cpus,
        seconds,
    })
}

/// Flags every second that belongs to a run of >= SATURATED_SECS saturated seconds.
fn mark_saturated(row: &mut [CpuSecond]) {
    let mut run_start = 0;
    for i in 0..=row.len() {
        let hot = i < row.len() && row[i].busy_pct >= SATURATED_PCT;
        if !hot {
            if i - run_start >= SATURATED_SECS {
                row[run_start..i]
                    .iter_mut()
                    .for_each(|c| c.saturated = true);
            }
            run_start = i + 1;
        }
    }
}

/// Whether the stack's leaf (last) frame is kernel code; an empty stack counts as user.
pub fn leaf_is_kernel(profile: &Profile, stack: u32) -> bool {
    profile.stacks[stack as usize]
        .frames
        .last()
        .is_some_and(|&f| profile.frames[f as usize].kind == FrameKind::Kernel)
}

impl Profile {
    /// The samples with `from_ns <= offset_ns < to_ns` (offsets from the capture start, ns).
    /// Offsets are kept, so wall-clock times stay right; the tables are shared as they are.
    /// Untimed ranges are cut to the slice too (their samples sit at their range's start).
    #[must_use]
    pub fn slice(&self, from_ns: u64, to_ns: u64) -> Profile {
        let mut p = self.retain(|s| (from_ns..to_ns).contains(&s.offset_ns));
        p.meta.untimed = (p.meta.untimed.iter())
            .map(|&(a, b)| (a.max(from_ns), b.min(to_ns)))
            .filter(|(a, b)| a < b)
            .collect();
        p
    }

    /// The samples that pass `filter`.
    #[must_use]
    pub fn filtered(&self, filter: &Filter) -> Profile {
        let keep = filter.matcher(self);
        self.retain(keep)
    }

    fn retain(&self, keep: impl Fn(&Sample) -> bool) -> Profile {
        Profile {
            meta: self.meta.clone(),
            strings: self.strings.clone(),
            frames: self.frames.clone(),
            stacks: self.stacks.clone(),
            samples: self.samples.iter().filter(|s| keep(s)).copied().collect(),
            processes: self.processes.clone(),
            lifetimes: self.lifetimes.clone(),
            cgroups: self.cgroups.clone(),
            binaries: self.binaries.clone(),
            // Totals of the whole recording: a slice keeps them as they are.
            runq: self.runq.clone(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
