//! `profiler-lab synth`: a synthetic capture of any size, for `cargo xtask bench
//! heatmap` (an hour at 99 Hz on 64 CPUs is 22.8M samples). Deterministic (xorshift, fixed
//! seed) and shaped like a busy server: a few hundred processes in a few dozen cgroups, a few
//! thousand distinct stacks of depth 10-40 built from a shared frame pool (user frames from a
//! few dozen binaries over kernel frames), idle samples (pid 0) when a CPU has nothing to do,
//! a slowly varying load, CPUs pinned at 100% for tens of seconds at a time, and a periodic
//! job busy in the first 200 ms of every 10th second.
use std::path::Path;

use anyhow::{Context as _, ensure};

use profiler::profile::{
    self, Binary, Cgroup, Counters, Frame, FrameKind, Interner, Meta, Process, Sample,
};

/// The shape of the synthetic capture.
#[derive(Clone, Copy, Debug)]
pub struct SynthSpec {
    pub cpus: u32,
    pub hz: u32,
    pub seconds: u32,
    pub seed: u64,
}

/// What `synth` wrote.
#[derive(Clone, Copy, Debug)]
pub struct SynthReport {
    pub samples: u64,
    pub idle: u64,
    pub stacks: usize,
    pub processes: usize,
}

const PROCESSES: usize = 300;
const CGROUPS: u64 = 40;
const BINARIES: usize = 40;
const USER_FRAMES: usize = 3000;
const KERNEL_FRAMES: usize = 600;
/// Distinct stacks per process: 5..=STACKS_MAX (a few thousand in all).
const STACKS_MAX: u64 = 25;
/// Per sample, the chance a CPU switches to another process (otherwise it keeps running the
/// one it ran at the previous tick, as a scheduler with time slices does).
const SWITCH_PER_MILLE: u64 = 60;

/// xorshift64*: small, fast, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in 0..n.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next() >> 11) * u128::from(n)) >> 53) as u64
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// Index into cumulative weights `cum` of a uniform draw.
fn pick(rng: &mut Rng, cum: &[u64]) -> usize {
    let x = rng.below(*cum.last().expect("weights"));
    cum.partition_point(|&c| c <= x)
}

/// Zipf-like cumulative weights 1/(i+1), scaled to integers.
fn zipf(n: usize) -> Vec<u64> {
    let mut total = 0;
    (0..n)
        .map(|i| {
            total += 1_000_000 / (i as u64 + 1);
            total
        })
        .collect()
}

struct Proc {
    pid: u32,
    comm: u32,
    cgroup: u64,
    threads: u32,
    stacks: Vec<u32>,
    stack_cum: Vec<u64>,
}

/// Builds the capture in memory (samples in time order) and writes it to `out`.
pub fn synth(spec: SynthSpec, out: &Path) -> anyhow::Result<SynthReport> {
    ensure!(
        spec.cpus > 0 && spec.hz > 0 && spec.seconds > 0,
        "cpus, hz and seconds must be positive"
    );
    let mut rng = Rng(spec.seed | 1);
    let mut b = Interner::new(meta(spec));
    let pool = frame_pool(&mut b);
    let idle_task = idle_task(&mut b, &pool, spec.cpus);
    let procs = processes(&mut b, &mut rng, &pool);
    let stack_count: usize = procs.iter().map(|p| p.stacks.len()).sum();
    let total = u64::from(spec.seconds) * u64::from(spec.hz) * u64::from(spec.cpus);
    b.meta_mut().counters.recorded = total;
    let idle = sample(&mut b, &mut rng, spec, &procs, &idle_task);
    let profile = b.finish();
    profile::write_file(&profile, out).with_context(|| format!("writing {}", out.display()))?;
    Ok(SynthReport {
        samples: total,
        idle,
        stacks: stack_count + 1,
        processes: procs.len(),
    })
}

/// The capture's header: a fixed start, the spec's length, rate and CPUs.
fn meta(spec: SynthSpec) -> Meta {
    Meta {
        start_unix_ns: 1_796_083_200_000_000_000, // 2026-12-01T00:00:00Z
        start_mono_ns: 1_000_000_000_000,
        duration_ns: u64::from(spec.seconds) * 1_000_000_000,
        frequency_hz: spec.hz,
        event: "cpu-clock".into(),
        hostname: "synth".into(),
        kernel_release: "6.18.0-synth".into(),
        cpus: (0..spec.cpus).collect(),
        counters: Counters::default(),
        untimed: Vec::new(),
        named_counters: Vec::new(),
    }
}

/// The frames stacks are built from.
struct FramePool {
    vmlinux: u32,
    kbin: u32,
    kernel: Vec<u32>,
    user: Vec<u32>,
}

/// The frame pool: kernel frames over user frames of a few dozen binaries.
fn frame_pool(b: &mut Interner) -> FramePool {
    let vmlinux = b.string("vmlinux");
    let kbin = b.binary(Binary {
        path: "[kernel.kallsyms]".into(),
        build_id: String::new(),
    });
    let kernel: Vec<u32> = (0..KERNEL_FRAMES)
        .map(|i| {
            let name = b.string(&format!("k_func_{i}"));
            b.frame(Frame {
                name,
                module: vmlinux,
                kind: FrameKind::Kernel,
                addr: 0xffff_ffff_8100_0000 + i as u64 * 0x140,
                binary: kbin,
            })
        })
        .collect();
    let bins: Vec<(u32, u32)> = (0..BINARIES)
        .map(|i| {
            let path = if i < 8 {
                format!("/usr/lib/x86_64-linux-gnu/lib{i}.so")
            } else {
                format!("/usr/bin/app{i}")
            };
            let module = b.string(&path);
            let bin = b.binary(Binary {
                path,
                build_id: format!("{:040x}", i as u64 * 0x9e37_79b9),
            });
            (module, bin)
        })
        .collect();
    let user: Vec<u32> = (0..USER_FRAMES)
        .map(|i| {
            let (module, binary) = bins[i % BINARIES];
            let name = b.string(&format!("ns{}::module{}::function_{i}", i % 17, i % 91));
            b.frame(Frame {
                name,
                module,
                kind: FrameKind::User,
                addr: 0x1000 + i as u64 * 0x40,
                binary,
            })
        })
        .collect();
    FramePool {
        vmlinux,
        kbin,
        kernel,
        user,
    }
}

/// What an idle CPU runs: pid 0 with its own comm per CPU.
struct IdleTask {
    stack: u32,
    comms: Vec<u32>,
}

/// Idle: pid 0 on every CPU, one stack of kernel frames.
fn idle_task(b: &mut Interner, pool: &FramePool, cpus: u32) -> IdleTask {
    let idle_names = ["secondary_startup_64", "cpu_startup_entry", "do_idle"];
    let mut idle_frames: Vec<u32> = idle_names
        .iter()
        .map(|n| {
            let name = b.string(n);
            b.frame(Frame {
                name,
                module: pool.vmlinux,
                kind: FrameKind::Kernel,
                addr: 0,
                binary: pool.kbin,
            })
        })
        .collect();
    idle_frames.extend(&pool.kernel[..7]);
    let stack = b.stack(idle_frames);
    let comms: Vec<u32> = (0..cpus)
        .map(|c| b.string(&format!("swapper/{c}")))
        .collect();
    IdleTask { stack, comms }
}

/// The cgroups and the processes in them, each with its own stacks.
fn processes(b: &mut Interner, rng: &mut Rng, pool: &FramePool) -> Vec<Proc> {
    for g in 0..CGROUPS {
        b.cgroup(Cgroup {
            id: 10_000 + g,
            path: format!("/kubepods/burstable/pod{g:04}/container"),
        });
    }
    let base = [
        "kubelet",
        "containerd",
        "java",
        "postgres",
        "nginx",
        "envoy",
        "python3",
        "node",
        "redis-server",
        "dockerd",
    ];
    let mut procs = Vec::with_capacity(PROCESSES);
    for i in 0..PROCESSES {
        let comm_str = if i < base.len() {
            base[i].to_owned()
        } else {
            format!("{}-{}", base[i % base.len()], i / base.len())
        };
        let comm = b.string(&comm_str);
        let pid = 1000 + i as u32 * 37;
        let cgroup = 10_000 + rng.below(CGROUPS);
        b.process(Process {
            pid,
            comm: comm_str.clone(),
            exe: format!("/usr/bin/{}", base[i % base.len()]),
            cgroup: format!("/kubepods/burstable/pod{:04}/container", cgroup - 10_000),
            ..Process::default()
        });
        let stacks = process_stacks(b, rng, pool);
        let n = stacks.len();
        procs.push(Proc {
            pid,
            comm,
            cgroup,
            threads: rng.range(1, 32) as u32,
            stacks,
            stack_cum: zipf(n),
        });
    }
    procs
}

/// One process's stacks: it runs code of a few binaries, a root path shared by its stacks,
/// then branches; some stacks end in the kernel (syscalls), depth 10-40 in all.
fn process_stacks(b: &mut Interner, rng: &mut Rng, pool: &FramePool) -> Vec<u32> {
    let n = rng.range(5, STACKS_MAX) as usize;
    let root_len = rng.range(3, 8) as usize;
    let root: Vec<u32> = (0..root_len)
        .map(|_| pool.user[rng.below(USER_FRAMES as u64) as usize])
        .collect();
    (0..n)
        .map(|_| {
            let depth = rng.range(10, 40) as usize;
            let kdepth = if rng.below(3) == 0 {
                rng.range(3, 12).min(depth as u64 - root_len as u64) as usize
            } else {
                0
            };
            let mut frames = root.clone();
            while frames.len() < depth - kdepth {
                frames.push(pool.user[rng.below(USER_FRAMES as u64) as usize]);
            }
            while frames.len() < depth {
                frames.push(pool.kernel[rng.below(KERNEL_FRAMES as u64) as usize]);
            }
            b.stack(frames)
        })
        .collect()
}

/// One sample per CPU per tick, in time order. Returns how many were idle.
fn sample(
    b: &mut Interner,
    rng: &mut Rng,
    spec: SynthSpec,
    procs: &[Proc],
    idle_task: &IdleTask,
) -> u64 {
    // A few processes get most of the CPU (Zipf over a shuffled order).
    let proc_cum = zipf(PROCESSES);
    let ticks = u64::from(spec.seconds) * u64::from(spec.hz);
    let period_ns = 1_000_000_000 / u64::from(spec.hz);
    let cpus = spec.cpus as usize;
    // What each CPU ran at the previous tick; a saturation episode per CPU (end tick, process).
    let mut current: Vec<Option<usize>> = vec![None; cpus];
    let mut pinned: Vec<(u64, usize)> = vec![(0, 0); cpus];
    let mut idle = 0u64;
    for tick in 0..ticks {
        let t_s = tick as f64 / f64::from(spec.hz);
        let frac = t_s.fract();
        // Load between ~25% and ~75%, over a 20-minute wave and a 37 s ripple.
        let load = 0.5
            + 0.2 * (t_s * std::f64::consts::TAU / 1200.0).sin()
            + 0.05 * (t_s * std::f64::consts::TAU / 37.0).sin();
        // A periodic job: every 10th second, the first 200 ms are all busy.
        let burst = (t_s as u64).is_multiple_of(10) && frac < 0.2;
        for (cpu, (cur, pin)) in current.iter_mut().zip(pinned.iter_mut()).enumerate() {
            // Now and then a CPU is pinned at 100% by one process for 5-60 s.
            if pin.0 <= tick && rng.below(u64::from(spec.hz) * 600) == 0 {
                let len = rng.range(5, 60) * u64::from(spec.hz);
                *pin = (tick + len, pick(rng, &proc_cum));
            }
            let busy = pin.0 > tick || burst || rng.unit() < load;
            let jitter = rng.below(period_ns / 50);
            let offset_ns = tick * period_ns + jitter;
            if !busy {
                *cur = None;
                idle += 1;
                b.sample(Sample {
                    offset_ns,
                    cpu: cpu as u32,
                    pid: 0,
                    tid: 0,
                    cgroup_id: 1,
                    comm: idle_task.comms[cpu],
                    stack: idle_task.stack,
                });
                continue;
            }
            let p = if pin.0 > tick {
                pin.1
            } else {
                match *cur {
                    Some(p) if rng.below(1000) >= SWITCH_PER_MILLE => p,
                    _ => pick(rng, &proc_cum),
                }
            };
            *cur = Some(p);
            let pr = &procs[p];
            let stack = pr.stacks[pick(rng, &pr.stack_cum)];
            b.sample(Sample {
                offset_ns,
                cpu: cpu as u32,
                pid: pr.pid,
                tid: pr.pid + rng.below(u64::from(pr.threads)) as u32,
                cgroup_id: pr.cgroup,
                comm: pr.comm,
                stack,
            });
        }
    }
    idle
}
