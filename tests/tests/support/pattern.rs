//! The synthetic capture the heat-map tests share (tests/tests/heatmap*.rs include this file).
use profiler::profile::{Frame, FrameKind, Interner, Meta, Sample, write_file};

const MS: u64 = 1_000_000;
/// 2026-12-01T00:00:00Z, s.
const START_UNIX_S: u64 = 1_796_083_200;

/// Writes the pattern capture to `path`: 3 s at 100 Hz; CPU 1 runs process `busy` (pid 42) for
/// the first 200 ms of every second, CPU 0 and the rest of CPU 1 are idle. Busy samples end in
/// `main;spin`, or with `kernel_half` every other one in `main;clear_page` (kernel).
pub(crate) fn write_pattern_capture(path: &str, hostname: &str, kernel_half: bool) {
    write_pattern_capture_at(path, hostname, kernel_half, START_UNIX_S * 1_000_000_000);
}

/// `write_pattern_capture` with the capture starting at `start_unix_ns` (ns since the epoch).
#[allow(
    dead_code,
    reason = "only heatmap.rs uses other starts; heatmap_drag.rs includes this file too"
)]
pub(crate) fn write_pattern_capture_at(
    path: &str,
    hostname: &str,
    kernel_half: bool,
    start_unix_ns: u64,
) {
    let mut i = Interner::new(Meta {
        start_unix_ns,
        duration_ns: 3_000 * MS,
        frequency_hz: 100,
        event: "cpu-clock".into(),
        hostname: hostname.into(),
        cpus: vec![0, 1],
        ..Meta::default()
    });
    let (app, vm) = (i.string("/usr/bin/busy"), i.string("vmlinux"));
    let mut frame = |name: &str, module, kind| {
        let name = i.string(name);
        i.frame(Frame {
            name,
            module,
            kind,
            ..Frame::default()
        })
    };
    let main = frame("main", app, FrameKind::User);
    let spin = frame("spin", app, FrameKind::User);
    let clear = frame("clear_page", vm, FrameKind::Kernel);
    let idle_f = frame("cpuidle_enter", vm, FrameKind::Kernel);
    let user = i.stack(vec![main, spin]);
    let kernel = i.stack(vec![main, clear]);
    let idle = i.stack(vec![idle_f]);
    let (busy, swapper) = (i.string("busy"), i.string("swapper/0"));
    for k in 0..300u64 {
        let t = k * 10 * MS;
        let s = |cpu, pid, comm, stack| Sample {
            offset_ns: t,
            cpu,
            pid,
            tid: pid,
            cgroup_id: 7,
            comm,
            stack,
        };
        i.sample(s(0, 0, swapper, idle));
        if t % (1000 * MS) < 200 * MS {
            i.sample(s(
                1,
                42,
                busy,
                if kernel_half && k % 2 == 1 {
                    kernel
                } else {
                    user
                },
            ));
        } else {
            i.sample(s(1, 0, swapper, idle));
        }
    }
    write_file(&i.finish(), path.as_ref()).expect("write capture");
}
