//! The heat map page's data: one pass over the samples into bounded aggregates, so the page
//! stays a few MB whatever the sample count (23M for an hour at 99 Hz on 64 CPUs).
//!
//! - `grid`: non-idle samples per 20 ms slice, all CPUs: FlameScope's map, always exact.
//! - `cpu_busy`/`cpu_kernel`: per CPU per second: the utilisation strip, always exact.
//! - `records`: counts per (time bucket, cpu, comm, cgroup, stack), for filtered maps, flame
//!   graphs of a selection and top processes. A bucket is one slice (20 ms) until the records
//!   pass `MAX_RECORDS`; then buckets coarsen (100 ms, 500 ms, 1 s, 5 s...) and a selection is
//!   rounded out to whole buckets. At 99 Hz a 20 ms slice holds ~2 samples per CPU, so per-CPU
//!   records at full resolution would be about one per sample: that is what the bound prevents.
//! - `all_records`: the same without the CPU, used when no CPU is filtered: on many CPUs this
//!   stays at a much finer time resolution within the same bound.
//! - `untimed_cols`: seconds of stored windows that kept counts but not times; their samples
//!   are in none of the above, and the page marks those columns instead of drawing them.
use crate::profile::{self, FrameKind, Profile, Span, SpanTooLong};
use crate::util::{FxDense, FxMap};

/// Most records embedded (~25 bytes of JSON each).
pub(super) const MAX_RECORDS: usize = 500_000;

/// Bucket sizes in slices of 20 ms; each divides the next, so coarsening merges whole buckets.
const LADDER: &[u32] = &[1, 5, 25, 50, 250, 500, 1500, 3000, 15_000, 45_000, 180_000];

/// The page's data; comm, cgroup, stack and frame tables hold only what the records use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeatmapData {
    pub span: Span,
    /// Slices per second.
    pub rows: u32,
    /// Samples per second per CPU (the 100% mark).
    pub frequency_hz: u32,
    /// Capture start, ms since the Unix epoch (for wall-clock labels).
    pub start_unix_ms: u64,
    pub cpus: Vec<u32>,
    pub comms: Vec<String>,
    pub cgroups: Vec<u64>,
    /// Frame names and whether each is kernel code.
    pub frames: Vec<(String, bool)>,
    /// Stacks as frame indexes, root first.
    pub stacks: Vec<Vec<u32>>,
    /// Non-idle samples per slice `col * rows + floor(rows * frac(t))` (time order, so the
    /// FlameScope row is `rows - 1 - slice-in-second`).
    pub grid: Vec<u64>,
    /// Non-idle samples per `cpu index * cols + col`.
    pub cpu_busy: Vec<u64>,
    /// Of those, samples whose leaf frame is kernel code.
    pub cpu_kernel: Vec<u64>,
    /// Slices per record time bucket.
    pub bucket: u32,
    /// `[bucket index, cpu, comm, cgroup, stack, count]`, sorted; cpu is the CPU number.
    pub records: Vec<[u64; 6]>,
    /// Slices per `all_records` time bucket.
    pub all_bucket: u32,
    /// `[bucket index, comm, cgroup, stack, count]`, sorted: every CPU together.
    pub all_records: Vec<[u64; 5]>,
    /// Columns (ascending) whose samples have no exact times (`Meta::untimed`): drawn as
    /// "no exact times", never as quiet.
    pub untimed_cols: Vec<u64>,
    /// Busy samples in those ranges: in no grid cell, strip cell or record.
    pub untimed_samples: u64,
}

/// Counts per (time bucket, key), coarsening the buckets to stay within a bound.
struct Buckets {
    counts: FxMap<[u32; 5], u64>,
    /// Slices per bucket.
    bucket: u32,
}

impl Buckets {
    fn new() -> Self {
        Self {
            counts: FxMap::default(),
            bucket: 1,
        }
    }

    /// Counts one sample at `slice`; past `max` records, merges into the next bucket size
    /// (unless one bucket already spans all `slices`).
    fn add(&mut self, slice: u32, key: [u32; 4], max: usize, slices: usize) {
        let [a, b, c, d] = key;
        *self
            .counts
            .entry([slice / self.bucket, a, b, c, d])
            .or_default() += 1;
        if self.counts.len() > max && (self.bucket as usize) < slices {
            let next = LADDER
                .iter()
                .copied()
                .find(|&b| b > self.bucket)
                .unwrap_or(self.bucket * 2);
            let mut merged = FxMap::default();
            for ([t, a, b, c, d], n) in self.counts.drain() {
                *merged
                    .entry([t * self.bucket / next, a, b, c, d])
                    .or_default() += n;
            }
            (self.counts, self.bucket) = (merged, next);
        }
    }

    fn sorted(self) -> Vec<([u32; 5], u64)> {
        let mut keys: Vec<_> = self.counts.into_iter().collect();
        keys.sort_unstable();
        keys
    }
}

/// Aggregates `profile` in one pass over its samples (plus re-keying when buckets coarsen).
pub fn heatmap_data(profile: &Profile) -> Result<HeatmapData, SpanTooLong> {
    heatmap_data_bounded(profile, MAX_RECORDS)
}

/// `heatmap_data` with at most `max_records` records (unless one bucket spans everything).
/// The grid and the CPU strip are dense in time: refused past `Span::bounded`'s bounds.
pub(super) fn heatmap_data_bounded(
    profile: &Profile,
    max_records: usize,
) -> Result<HeatmapData, SpanTooLong> {
    let rows = profile::DEFAULT_ROWS;
    let cpus = profile::cpu_ids(profile);
    let span = Span::bounded(profile, cpus.len())?;
    let Counts {
        grid,
        cpu_busy,
        cpu_kernel,
        cgroups,
        per_cpu,
        all,
        untimed_samples,
    } = count_samples(profile, &span, &cpus, rows, max_records);
    let (bucket, all_bucket) = (per_cpu.bucket, all.bucket);
    let Renumbered {
        records,
        all_records,
        comms,
        stacks,
    } = renumber_records(per_cpu, all);
    let (stacks, frames) = stack_and_frame_tables(profile, &stacks);
    Ok(HeatmapData {
        span,
        rows,
        frequency_hz: profile.meta.frequency_hz,
        start_unix_ms: profile.meta.start_unix_ns / 1_000_000,
        cpus,
        comms: comms
            .items()
            .iter()
            .map(|&c| profile.str(c).to_owned())
            .collect(),
        cgroups: cgroups.into_items(),
        frames,
        stacks,
        grid,
        cpu_busy,
        cpu_kernel,
        bucket,
        records,
        all_bucket,
        all_records,
        untimed_cols: (span.untimed_cols(profile).iter().enumerate())
            .filter(|&(_, &u)| u)
            .map(|(c, _)| c as u64)
            .collect(),
        untimed_samples,
    })
}

/// What the one pass over the samples counts, in the profile's own comm and stack ids.
struct Counts {
    grid: Vec<u64>,
    cpu_busy: Vec<u64>,
    cpu_kernel: Vec<u64>,
    /// Cgroup ids, numbered densely in the order met.
    cgroups: FxDense<u64>,
    per_cpu: Buckets,
    all: Buckets,
    untimed_samples: u64,
}

/// Counts every non-idle sample into the grid, the CPU strip and both sets of records, and
/// those without a time into `untimed_samples` alone.
fn count_samples(
    profile: &Profile,
    span: &Span,
    cpus: &[u32],
    rows: u32,
    max_records: usize,
) -> Counts {
    let cols = span.cols;
    let cpu_ix: FxMap<u32, usize> = cpus.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let kernel_leaf: Vec<bool> = (0..profile.stacks.len() as u32)
        .map(|st| profile::leaf_is_kernel(profile, st))
        .collect();
    let mut c = Counts {
        grid: vec![0u64; cols * rows as usize],
        cpu_busy: vec![0u64; cpus.len() * cols],
        cpu_kernel: vec![0u64; cpus.len() * cols],
        cgroups: FxDense::default(),
        per_cpu: Buckets::new(),
        all: Buckets::new(),
        untimed_samples: 0,
    };
    for s in profile.samples.iter().filter(|s| !profile::is_idle(s)) {
        if !s.has_time() {
            c.untimed_samples += 1;
            continue;
        }
        let col = span.col(s.offset_ns);
        let slice = col * rows as usize + (rows - 1 - profile::row(s.offset_ns, rows)) as usize;
        c.grid[slice] += 1;
        let at = cpu_ix[&s.cpu] * cols + col;
        c.cpu_busy[at] += 1;
        c.cpu_kernel[at] += u64::from(kernel_leaf[s.stack as usize]);
        let cg = c.cgroups.intern(s.cgroup_id);
        let slices = c.grid.len();
        c.per_cpu.add(
            slice as u32,
            [s.cpu, s.comm, cg, s.stack],
            max_records,
            slices,
        );
        c.all
            .add(slice as u32, [s.comm, cg, s.stack, 0], max_records, slices);
    }
    c
}

/// The records in the page's form, with the comms and stacks they use numbered densely.
struct Renumbered {
    records: Vec<[u64; 6]>,
    all_records: Vec<[u64; 5]>,
    /// Profile string ids of the comms kept.
    comms: FxDense<u32>,
    /// Profile stack ids of the stacks kept.
    stacks: FxDense<u32>,
}

/// Keeps only the comms and stacks that appear, renumbered densely.
fn renumber_records(per_cpu: Buckets, all: Buckets) -> Renumbered {
    let (mut comms, mut stacks) = (FxDense::default(), FxDense::default());
    let records = per_cpu
        .sorted()
        .into_iter()
        .map(|([b, cpu, comm, cg, st], n)| {
            let comm = comms.intern(comm);
            let st = stacks.intern(st);
            let [b, cpu, comm, cg, st] = [b, cpu, comm, cg, st].map(u64::from);
            [b, cpu, comm, cg, st, n]
        })
        .collect();
    // Same comms and stacks as the per-CPU records: already interned there.
    let all_records = all
        .sorted()
        .into_iter()
        .map(|([b, comm, cg, st, _], n)| {
            let [b, cg] = [b, cg].map(u64::from);
            let interned = "interned with the per-CPU records";
            let comm = u64::from(comms.id(&comm).expect(interned));
            [b, comm, cg, u64::from(stacks.id(&st).expect(interned)), n]
        })
        .collect();
    Renumbered {
        records,
        all_records,
        comms,
        stacks,
    }
}

/// The kept stacks as indexes into a frame table holding only the frames they use.
fn stack_and_frame_tables(
    profile: &Profile,
    kept_stacks: &FxDense<u32>,
) -> (Vec<Vec<u32>>, Vec<(String, bool)>) {
    let mut kept_frames = FxDense::default();
    let stacks = kept_stacks
        .items()
        .iter()
        .map(|&st| {
            let frames = &profile.stacks[st as usize].frames;
            frames.iter().map(|&f| kept_frames.intern(f)).collect()
        })
        .collect();
    let frames = kept_frames
        .items()
        .iter()
        .map(|&f| {
            let f = &profile.frames[f as usize];
            let name = profile.frame_name(f);
            (name.to_owned(), f.kind == FrameKind::Kernel)
        })
        .collect();
    (stacks, frames)
}
