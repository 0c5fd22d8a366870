//! In-memory profile: what every output and the capture file are made from.
use crate::util::Dense;

/// Index into `Profile::strings`.
pub type StrId = u32;

/// Where a frame's code lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Kernel,
    /// The default, as most frames of most stacks are user code.
    #[default]
    User,
}

/// One symbolized frame at one address, shared by every stack that passes through it. Two
/// addresses in one function are two frames (pprof wants per-address locations); outputs that
/// print names only merge them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name, or `[unknown]`, or `binary+0xOFFSET` when the binary has no symbol there.
    pub name: StrId,
    /// Binary or kernel module the code belongs to ("" when unknown; "vmlinux" for the kernel).
    pub module: StrId,
    pub kind: FrameKind,
    /// Kernel: the instruction address. User: the file offset within `binary`. 0 when unknown.
    pub addr: u64,
    /// Index into `Profile::binaries`; 0 when the frame maps no known file.
    pub binary: u32,
}

/// A file frames' code comes from: an executable, a library, or the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Binary {
    /// Path as the process saw it; `[kernel.kallsyms]` for the kernel, `[module]` for a
    /// kernel module.
    pub path: String,
    /// GNU build id, lowercase hex; "" when the file has none (or it could not be read).
    pub build_id: String,
}

/// A call stack, root (outermost caller) first, leaf last: user frames then kernel frames.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stack {
    pub frames: Vec<u32>,
}

/// `Sample::cpu` of a sample whose time and CPU are not known (see `Meta::untimed`).
pub const NO_CPU: u32 = u32::MAX;

/// One sample: a tick of the sampling timer on one CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Time since `Meta::start_mono_ns`, ns.
    pub offset_ns: u64,
    pub cpu: u32,
    /// Process id (tgid); 0 is the idle task.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// cgroup v2 id (inode of the cgroup2 directory).
    pub cgroup_id: u64,
    /// Thread comm.
    pub comm: StrId,
    /// Index into `Profile::stacks`.
    pub stack: u32,
}

impl Sample {
    /// Whether the sample's time and CPU are real (false for `Meta::untimed` samples).
    pub fn has_time(&self) -> bool {
        self.cpu != NO_CPU
    }
}

/// Sample accounting of a recording: every sample the kernel took is in exactly one of
/// `recorded`, `lost_ringbuf_full`, `filtered`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Samples kept in the profile.
    pub recorded: u64,
    /// Samples dropped in the kernel because the ring buffer was full.
    pub lost_ringbuf_full: u64,
    /// Samples outside the --pid/--comm filters (not lost: not wanted).
    pub filtered: u64,
    /// Recorded samples whose kernel stack could not be read.
    pub kstack_failed: u64,
    /// Recorded samples whose user stack could not be read.
    pub ustack_failed: u64,
}

/// A process seen during the recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// Process comm (of its main thread) when first seen.
    pub comm: String,
    /// Executable path, "" if it could not be read (already exited, kernel thread).
    pub exe: String,
    /// cgroup v2 path from /proc/PID/cgroup ("" if unknown).
    pub cgroup: String,
    /// cgroup v1 memory hierarchy path ("" without one).
    pub memory_cgroup: String,
    /// cgroup v1 cpu hierarchy path ("" without one).
    pub cpu_cgroup: String,
}

/// A process's life as the kernel reported it during the recording (fork, exec and exit
/// records, and the exit status from a tracepoint). Times are offsets from the recording's
/// start, ns. One entry per process that started or ended during the recording, whether or
/// not it was sampled: a crash loop shows here even when each run is too short to sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lifetime {
    pub pid: u32,
    /// Parent process id; 0 when unknown (the process started before the recording).
    pub ppid: u32,
    /// Comm after its last exec (or its parent's, if it never exec'd); "" unknown.
    pub comm: String,
    /// Path of the executable after its last exec; "" unknown.
    pub exe: String,
    /// When it forked; None: before the recording.
    pub fork_ns: Option<u64>,
    /// When it last ran exec; None: not during the recording.
    pub exec_ns: Option<u64>,
    /// When it exited; None: still running at the end.
    pub exit_ns: Option<u64>,
    /// Exit status in wait(2) form (`code << 8`, or the signal number, | 0x80 with a core
    /// dump); None when unknown.
    pub exit_status: Option<u32>,
}

impl Lifetime {
    /// The code passed to exit(), when it exited normally.
    pub fn exit_code(&self) -> Option<u8> {
        self.exit_status
            .filter(|s| s.trailing_zeros() >= 7)
            .map(|s| ((s >> 8) & 0xff) as u8)
    }

    /// The signal that killed it.
    pub fn exit_signal(&self) -> Option<u8> {
        self.exit_status
            .map(|s| (s & 0x7f) as u8)
            .filter(|&sig| sig != 0)
    }

    /// It started during the recording (forked or exec'd).
    pub fn started(&self) -> bool {
        self.fork_ns.is_some() || self.exec_ns.is_some()
    }
}

/// A cgroup v2 id seen on samples, and its path under the cgroup2 mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cgroup {
    /// The id samples carry (inode number of the cgroup2 directory).
    pub id: u64,
    /// Path relative to the cgroup2 mount, starting with `/`.
    pub path: String,
}

/// Facts about the recording as a whole.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Wall-clock time of the start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// CLOCK_MONOTONIC time of the start, ns; sample times are offsets from it.
    pub start_mono_ns: u64,
    /// Length of the recording, ns.
    pub duration_ns: u64,
    /// Sampling frequency per CPU, Hz.
    pub frequency_hz: u32,
    /// "cpu-clock" or "cycles".
    pub event: String,
    pub hostname: String,
    /// `uname -r`.
    pub kernel_release: String,
    /// CPUs sampled.
    pub cpus: Vec<u32>,
    pub counters: Counters,
    /// Offset ranges `[from, to)`, ns, sorted, whose samples have no exact time or CPU: stored
    /// windows older than the agent's `--keep-times` (their counts outlive their times). Such
    /// samples sit at their range's start on `NO_CPU`; time views skip them and say so.
    pub untimed: Vec<(u64, u64)>,
    /// Named figures of parts of the recording, `report --stats` prints them as they are
    /// (e.g. `unwind_table_bytes`, `unwind_evicted`); capture version 4.
    pub named_counters: Vec<(String, u64)>,
}

/// A whole profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    pub meta: Meta,
    pub strings: Vec<String>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Stack>,
    pub samples: Vec<Sample>,
    pub processes: Vec<Process>,
    /// Processes that started or exited during the recording, by pid then start.
    pub lifetimes: Vec<Lifetime>,
    pub cgroups: Vec<Cgroup>,
    /// Files that frames point into; entry 0 is the empty "no binary" (when built by
    /// `Interner`).
    pub binaries: Vec<Binary>,
    /// Run-queue waits, when they were traced (capture version 5).
    pub runq: Option<super::runq::RunQueue>,
}

/// How a frame that could not be named reads, in the model and in every output (perf's
/// spelling). The one place it is written: symbolize stores it, outputs show it for a frame
/// with no name (`Profile::frame_name`).
pub const UNKNOWN_FRAME: &str = "[unknown]";

impl Profile {
    pub fn str(&self, id: StrId) -> &str {
        &self.strings[id as usize]
    }

    /// A frame's name for display: `UNKNOWN_FRAME` when it has none.
    pub fn frame_name(&self, f: &Frame) -> &str {
        match self.str(f.name) {
            "" => UNKNOWN_FRAME,
            name => name,
        }
    }

    /// The frames of a stack, root first.
    pub fn stack_frames(&self, stack: u32) -> impl Iterator<Item = &Frame> {
        self.stacks[stack as usize]
            .frames
            .iter()
            .map(|&f| &self.frames[f as usize])
    }
}

/// Builds a profile with every string, frame and stack stored once.
#[derive(Default)]
pub struct Interner {
    profile: Profile,
    strings: Dense<String>,
    frames: Dense<Frame>,
    stacks: Dense<Vec<u32>>,
    binaries: Dense<Binary>,
}

impl Interner {
    pub fn new(meta: Meta) -> Self {
        let mut me = Self {
            profile: Profile {
                meta,
                ..Profile::default()
            },
            ..Self::default()
        };
        me.string(""); // id 0 is the empty string
        me.binary(Binary::default()); // binary 0 is "none"
        me
    }

    pub fn string(&mut self, s: &str) -> StrId {
        self.strings.intern_ref(s) as StrId
    }

    pub fn frame(&mut self, frame: Frame) -> u32 {
        self.frames.intern(frame)
    }

    pub fn binary(&mut self, binary: Binary) -> u32 {
        self.binaries.intern(binary)
    }

    pub fn stack(&mut self, frames: Vec<u32>) -> u32 {
        self.stacks.intern(frames)
    }

    pub fn sample(&mut self, sample: Sample) {
        self.profile.samples.push(sample);
    }

    pub fn process(&mut self, process: Process) {
        self.profile.processes.push(process);
    }

    pub fn lifetime(&mut self, lifetime: Lifetime) {
        self.profile.lifetimes.push(lifetime);
    }

    pub fn cgroup(&mut self, cgroup: Cgroup) {
        self.profile.cgroups.push(cgroup);
    }

    pub fn meta_mut(&mut self) -> &mut Meta {
        &mut self.profile.meta
    }

    pub fn finish(self) -> Profile {
        Profile {
            strings: self.strings.into_items(),
            frames: self.frames.into_items(),
            stacks: (self.stacks.into_items().into_iter())
                .map(|frames| Stack { frames })
                .collect(),
            binaries: self.binaries.into_items(),
            ..self.profile
        }
    }
}
