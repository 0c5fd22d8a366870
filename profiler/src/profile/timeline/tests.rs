//! Unit tests of timeline.rs on the known pattern: CPU 1 busy for the first 200 ms of every
//! second (half of it in the kernel), CPU 0 idle throughout, 100 Hz, 3 s.
use super::*;
use crate::profile::{Frame, Interner, Meta};

const MS: u64 = 1_000_000;

/// The pattern profile, shared with the output tests. Samples every 10 ms on both CPUs, from
/// 0 to 2.99 s; CPU 1 runs `busy` (pid 42) for offsets 0..200 ms of each second, alternating
/// a user leaf (`spin`) and a kernel leaf (`clear_page`); every other sample is idle.
pub(crate) fn pattern_profile() -> Profile {
    let mut i = Interner::new(Meta {
        start_unix_ns: 1_796_083_200_000_000_000, // 2026-12-01T00:00:00Z
        duration_ns: 3_000 * MS,
        frequency_hz: 100,
        event: "cpu-clock".into(),
        cpus: vec![0, 1],
        ..Meta::default()
    });
    let (app, vm) = (i.string("/usr/bin/busy"), i.string("vmlinux"));
    let frame = |i: &mut Interner, name: &str, module, kind| {
        let name = i.string(name);
        i.frame(Frame {
            name,
            module,
            kind,
            ..Frame::default()
        })
    };
    let main = frame(&mut i, "main", app, FrameKind::User);
    let spin = frame(&mut i, "spin", app, FrameKind::User);
    let fault = frame(&mut i, "asm_exc_page_fault", vm, FrameKind::Kernel);
    let clear = frame(&mut i, "clear_page", vm, FrameKind::Kernel);
    let idle_f = frame(&mut i, "cpuidle_enter", vm, FrameKind::Kernel);
    let user = i.stack(vec![main, spin]);
    let kernel = i.stack(vec![main, fault, clear]);
    let idle = i.stack(vec![idle_f]);
    let (busy, swapper0, swapper1) = (
        i.string("busy"),
        i.string("swapper/0"),
        i.string("swapper/1"),
    );
    for k in 0..300u64 {
        let t = k * 10 * MS;
        let sample = |cpu, pid, comm, stack| Sample {
            offset_ns: t,
            cpu,
            pid,
            tid: pid,
            cgroup_id: if pid == 0 { 1 } else { 7 },
            comm,
            stack,
        };
        i.sample(sample(0, 0, swapper0, idle));
        if t % (1000 * MS) < 200 * MS {
            i.sample(sample(1, 42, busy, if k % 2 == 0 { user } else { kernel }));
        } else {
            i.sample(sample(1, 0, swapper1, idle));
        }
    }
    i.finish()
}

#[test]
fn span_and_row_follow_flamescope() {
    let p = pattern_profile();
    assert_eq!(
        Span::of(&p),
        Span {
            first_s: 0,
            cols: 3
        }
    );
    assert_eq!(row(0, 50), 49, "start of a second is the bottom row");
    assert_eq!(row(999_999_999, 50), 0, "end of a second is the top row");
    assert_eq!(row(20 * MS, 50), 48);
    assert_eq!(row(19 * MS, 50), 49);
    // A last sample exactly on a second boundary still gets a column.
    let mut q = p.clone();
    q.samples.push(Sample {
        offset_ns: 3_000 * MS,
        ..q.samples[0]
    });
    assert_eq!(Span::of(&q).cols, 4);
    assert_eq!(Span::of(&Profile::default()).cols, 0);
}

#[test]
fn heat_map_cells_match_the_pattern() {
    let p = pattern_profile();
    let h = heat_map(&p, DEFAULT_ROWS, &Filter::default()).unwrap();
    assert_eq!(h.cells.len(), 3);
    for col in &h.cells {
        // 0..200 ms = slices 0..10 = rows 49..40, two 10 ms samples each; the rest empty.
        let expect: Vec<u64> = (0..50).map(|r| if r >= 40 { 2 } else { 0 }).collect();
        assert_eq!(col, &expect);
    }
    assert_eq!(h.max, 2);
    // Filters: CPU 0 alone is all idle; an unknown comm matches nothing; pid 42 is everything.
    let only = |f: Filter| heat_map(&p, DEFAULT_ROWS, &f).unwrap().max;
    assert_eq!(
        only(Filter {
            cpus: vec![0],
            ..Filter::default()
        }),
        0
    );
    assert_eq!(
        only(Filter {
            comm: Some("nope".into()),
            ..Filter::default()
        }),
        0
    );
    assert_eq!(
        only(Filter {
            pid: Some(42),
            ..Filter::default()
        }),
        2
    );
    assert_eq!(
        only(Filter {
            cgroup_id: Some(7),
            ..Filter::default()
        }),
        2
    );
    assert_eq!(
        only(Filter {
            comm: Some("busy".into()),
            cpus: vec![1],
            ..Filter::default()
        }),
        2
    );
}

#[test]
fn cpu_table_matches_the_pattern() {
    let p = pattern_profile();
    let t = cpu_table(&p, &Filter::default()).unwrap();
    assert_eq!(t.cpus, [0, 1]);
    let busy = p.strings.iter().position(|s| s == "busy").unwrap() as StrId;
    for col in 0..3 {
        let idle = &t.seconds[0][col];
        assert_eq!((idle.busy, idle.busy_pct, idle.top), (0, 0.0, None));
        let hot = &t.seconds[1][col];
        assert_eq!((hot.busy, hot.kernel), (20, 10));
        assert_eq!(
            (hot.busy_pct, hot.user_pct, hot.sys_pct),
            (20.0, 10.0, 10.0)
        );
        assert_eq!(hot.top, Some((busy, 20)));
        assert!(!hot.saturated);
    }
}

#[test]
fn saturation_needs_two_consecutive_seconds() {
    let mut p = pattern_profile();
    // CPU 1 fully busy in seconds 1 and 2; CPU 0 fully busy in second 0 only.
    let busy = p.samples.iter().find(|s| s.pid == 42).copied().unwrap();
    for s in &mut p.samples {
        let sec = s.offset_ns / (1000 * MS);
        if (s.cpu == 1 && sec >= 1) || (s.cpu == 0 && sec == 0) {
            *s = Sample {
                cpu: s.cpu,
                offset_ns: s.offset_ns,
                ..busy
            };
        }
    }
    let t = cpu_table(&p, &Filter::default()).unwrap();
    let flags = |c: usize| t.seconds[c].iter().map(|s| s.saturated).collect::<Vec<_>>();
    assert_eq!(flags(0), [false, false, false]);
    assert_eq!(flags(1), [false, true, true]);
    assert_eq!(t.seconds[1][1].busy_pct, 100.0);
    assert_eq!(t.seconds[0][0].busy_pct, 100.0);
}

#[test]
fn slice_keeps_the_half_open_range() {
    let p = pattern_profile();
    let s = p.slice(1_000 * MS, 1_100 * MS);
    assert_eq!(s.samples.len(), 20);
    assert_eq!(s.samples.iter().filter(|x| x.pid == 42).count(), 10);
    assert!(
        s.samples
            .iter()
            .all(|x| (1_000 * MS..1_100 * MS).contains(&x.offset_ns))
    );
    assert_eq!(s.stacks, p.stacks);
    // Untimed ranges are cut with the samples: none outside the slice.
    let mut u = p.clone();
    u.meta.untimed = vec![(500 * MS, 1_050 * MS), (2_000 * MS, 3_000 * MS)];
    let s = u.slice(1_000 * MS, 1_100 * MS);
    assert_eq!(s.meta.untimed, vec![(1_000 * MS, 1_050 * MS)]);
    let f = p.filtered(&Filter {
        cpus: vec![1],
        ..Filter::default()
    });
    assert_eq!(f.samples.len(), 300);
}

/// The per-second tables are dense in time: a span past a day, or past MAX_CPU_SECONDS cells,
/// is refused before anything is allocated for it (a year-long capture would take gigabytes).
#[test]
fn tables_refuse_spans_past_their_bounds() {
    let mut p = pattern_profile();
    let last = *p.samples.last().unwrap();
    p.samples.push(Sample {
        offset_ns: 365 * 86_400 * 1000 * MS,
        ..last
    });
    let too_long = SpanTooLong {
        secs: 365 * 86_400 + 1,
        cpus: 2,
    };
    assert_eq!(
        heat_map(&p, DEFAULT_ROWS, &Filter::default()),
        Err(too_long.clone())
    );
    assert_eq!(cpu_table(&p, &Filter::default()).unwrap_err(), too_long);
    // A day fits on the pattern's two CPUs, not on as many as would pass the cell bound.
    let mut day = pattern_profile();
    day.samples.push(Sample {
        offset_ns: (MAX_SPAN_SECS - 1) * 1000 * MS,
        ..last
    });
    assert!(heat_map(&day, DEFAULT_ROWS, &Filter::default()).is_ok());
    day.meta.cpus = (0..(MAX_CPU_SECONDS / MAX_SPAN_SECS + 1) as u32).collect();
    assert!(
        cpu_table(&day, &Filter::default())
            .unwrap_err()
            .to_string()
            .contains("--from/--to")
    );
}
