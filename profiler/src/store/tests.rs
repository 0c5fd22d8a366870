//! The store on synthetic windows: round trip with exact times, filters, retention by age, by
//! size and of times, migration of a store without times.
use super::*;
use crate::profile::{self, Cgroup, Filter, Frame, Interner, Meta, NO_CPU, Sample};

const S: u64 = 1_000_000_000;

/// The retention of the tests: times kept as long as counts.
pub(super) fn keep(max_age_ns: u64, max_bytes: u64) -> Retention {
    Retention {
        max_age_ns,
        keep_times_ns: max_age_ns,
        max_bytes,
    }
}

/// A 10 s window starting at `start_s` with `n` samples of `comm` on one stack main;work,
/// at uneven times (a stride prime to the window, so neither sorted nor evenly spread) on
/// CPUs 0 and 1.
pub(super) fn window(start_s: u64, comm: &str, n: u64) -> Profile {
    let mut i = Interner::new(Meta {
        start_unix_ns: start_s * S,
        duration_ns: 10 * S,
        frequency_hz: 19,
        event: "cpu-clock".into(),
        cpus: vec![0, 1],
        ..Meta::default()
    });
    let c = i.string(comm);
    let module = i.string("app");
    let frames: Vec<u32> = ["main", "work"]
        .iter()
        .map(|f| {
            let name = i.string(f);
            i.frame(Frame {
                name,
                module,
                ..Frame::default()
            })
        })
        .collect();
    let stack = i.stack(frames);
    for k in 0..n {
        i.sample(Sample {
            offset_ns: (k * 7_919_000_003 + start_s) % (10 * S),
            cpu: (k % 2) as u32,
            pid: 42,
            tid: 42,
            cgroup_id: 7,
            comm: c,
            stack,
        });
    }
    i.cgroup(Cgroup {
        id: 7,
        path: "/system.slice/app.service".into(),
    });
    let mut p = i.finish();
    p.meta.counters.recorded = n;
    p
}

/// A scratch directory, removed when the returned value drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("store-test-{name}-"))
        .tempdir()
        .unwrap()
}

fn all(s: &Store) -> Query {
    let _ = s;
    Query {
        since_unix_ns: 0,
        until_unix_ns: u64::MAX / 2,
        ..Query::default()
    }
}

#[test]
fn round_trip_and_filters() {
    let scratch_dir = scratch("round");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    s.write_window(&window(100, "app", 5)).unwrap();
    s.write_window(&window(110, "other", 3)).unwrap();
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 8);
    assert_eq!(p.meta.start_unix_ns, 100 * S);
    assert_eq!(p.meta.duration_ns, 20 * S);
    // In time order.
    assert!(
        p.samples
            .windows(2)
            .all(|w| w[0].offset_ns <= w[1].offset_ns)
    );
    let names: Vec<&str> = p
        .stack_frames(p.samples[0].stack)
        .map(|f| p.str(f.name))
        .collect();
    assert_eq!(names, ["main", "work"]);
    let only = |q: Query| s.read(&q).unwrap().samples.len();
    let q = all(&s);
    assert_eq!(
        only(Query {
            comms: vec!["other".into()],
            ..q.clone()
        }),
        3
    );
    assert_eq!(
        only(Query {
            cgroup: Some("/system.slice".into()),
            ..q.clone()
        }),
        8
    );
    assert_eq!(
        only(Query {
            cgroup: Some("/system".into()),
            ..q.clone()
        }),
        0
    );
    assert_eq!(
        only(Query {
            since_unix_ns: 111 * S,
            until_unix_ns: 200 * S,
            ..q
        }),
        3
    );
    drop(s);
    // Reopened (a restart), the data is still there.
    let r = Store::open_read(dir).unwrap();
    assert_eq!(r.read(&all(&r)).unwrap().samples.len(), 8);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn retention_by_age_and_size() {
    let scratch_dir = scratch("retain");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    for k in 0..50 {
        s.write_window(&window(1000 + 10 * k, &format!("comm{k}"), 200))
            .unwrap();
    }
    // Age: keep windows ending within 100 s of t = 1500 s.
    let deleted = s.retain(1500 * S, keep(100 * S, 1 << 30)).unwrap();
    assert_eq!(deleted, 39); // the 40th ends exactly at the cutoff
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 11 * 200);
    // Size: under the current use, the oldest go first until it fits (or one is left).
    let used = s.used_bytes().unwrap();
    s.retain(1500 * S, keep(1000 * S, used / 2)).unwrap();
    let left = s.read(&all(&s)).unwrap();
    assert!(left.samples.len() < p.samples.len());
    assert!(left.samples.len() >= 200);
    assert!(
        left.meta.start_unix_ns > p.meta.start_unix_ns,
        "the newest stay"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unusable_data_dir_is_a_clear_error() {
    let scratch_dir = scratch("file");
    let file = scratch_dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let Err(e) = Store::open(&file.join("data")) else {
        panic!("opened a store under a file");
    };
    assert!(e.to_string().starts_with("cannot use data dir"), "{e}");
    assert!(Store::open_read(&file).is_err());
    std::fs::remove_file(&file).unwrap();
}

/// Every sample as (wall-clock ns, CPU, comm): what a heat map and a CPU strip draw.
fn wall(p: &Profile) -> Vec<(u64, u32, String)> {
    let mut v: Vec<_> = p
        .samples
        .iter()
        .map(|s| {
            let t = p.meta.start_unix_ns + s.offset_ns;
            (t, s.cpu, p.str(s.comm).to_owned())
        })
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn exact_times_and_cpus_round_trip_across_restarts() {
    let scratch_dir = scratch("exact");
    let dir = scratch_dir.path();
    let written = [window(100, "app", 40), window(110, "other", 25)];
    let mut s = Store::open(dir).unwrap();
    for w in &written {
        s.write_window(w).unwrap();
    }
    let want: Vec<_> = {
        let mut v: Vec<_> = written.iter().flat_map(wall).collect();
        v.sort();
        v
    };
    let p = s.read(&all(&s)).unwrap();
    assert!(p.meta.untimed.is_empty());
    assert_eq!(wall(&p), want);
    // The heat map of the read equals the heat map of the windows as recorded (one profile
    // per window; shifted by whole seconds, the grid of the read lines up with theirs).
    let read_map = profile::heat_map(&p, 50, &Filter::default()).unwrap();
    for (k, w) in written.iter().enumerate() {
        let m = profile::heat_map(w, 50, &Filter::default()).unwrap();
        let shift = (w.meta.start_unix_ns - p.meta.start_unix_ns) / S;
        for (col, cells) in m.cells.iter().enumerate() {
            let at = (m.span.first_s + shift) as usize - read_map.span.first_s as usize + col;
            assert_eq!(&read_map.cells[at], cells, "window {k}, column {col}");
        }
    }
    drop(s);
    // A restart: the agent opens the store again and goes on writing.
    let mut s = Store::open(dir).unwrap();
    let third = window(120, "app", 7);
    s.write_window(&third).unwrap();
    let mut want = want;
    want.extend(wall(&third));
    want.sort();
    assert_eq!(wall(&s.read(&all(&s)).unwrap()), want);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn times_are_dropped_before_counts() {
    let scratch_dir = scratch("keep-times");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    for k in 0..10 {
        s.write_window(&window(1000 + 10 * k, "app", 30)).unwrap();
    }
    // At t = 1100 s: counts for 100 s, times for 50 s: windows ending before 1050 s lose
    // their times (1000..1040: four windows; the fifth ends exactly at the cutoff).
    let r = Retention {
        max_age_ns: 100 * S,
        keep_times_ns: 50 * S,
        max_bytes: 1 << 30,
    };
    assert_eq!(s.retain(1100 * S, r).unwrap(), 0);
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 300, "every count is still there");
    assert_eq!(p.meta.untimed, vec![(0, 40 * S)]);
    let untimed: Vec<&Sample> = p.samples.iter().filter(|s| !s.has_time()).collect();
    assert_eq!(untimed.len(), 4 * 30);
    assert!(
        untimed
            .iter()
            .all(|s| s.cpu == NO_CPU && s.offset_ns % (10 * S) == 0)
    );
    // The timed windows are exact; the heat map draws only them and marks the rest.
    let timed: Vec<_> = wall(&p).into_iter().filter(|s| s.1 != NO_CPU).collect();
    let mut want: Vec<_> = (4..10)
        .flat_map(|k| wall(&window(1000 + 10 * k, "app", 30)))
        .collect();
    want.sort();
    assert_eq!(timed, want);
    let map = profile::heat_map(&p, 50, &Filter::default()).unwrap();
    assert_eq!(map.cells.iter().flatten().sum::<u64>(), 6 * 30);
    let cols = map.span.untimed_cols(&p);
    assert_eq!(cols.iter().filter(|&&u| u).count(), 40);
    assert!(cols[..40].iter().all(|&u| u) && !cols[40..].iter().any(|&u| u));
    assert!(!profile::cpu_ids(&p).contains(&NO_CPU));
    // Counts go at their own age.
    let r = Retention {
        max_age_ns: 45 * S,
        ..r
    };
    assert_eq!(s.retain(1100 * S, r).unwrap(), 5);
    let p = s.read(&all(&s)).unwrap();
    assert_eq!((p.samples.len(), p.meta.untimed.clone()), (5 * 30, vec![]));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A store written before sample times were kept: read-only it reads as counts without
/// times; opened by the agent it gains the columns and new windows have exact times.
#[test]
fn a_store_without_times_is_migrated() {
    let scratch_dir = scratch("migrate");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    s.write_window(&window(100, "old", 12)).unwrap();
    s.conn
        .execute_batch(
            "ALTER TABLE counts DROP COLUMN times; ALTER TABLE windows DROP COLUMN has_times;",
        )
        .unwrap();
    drop(s);
    let r = Store::open_read(dir).unwrap();
    assert!(!times::has_columns(&r.conn).unwrap());
    let p = r.read(&all(&r)).unwrap();
    assert_eq!(
        (p.samples.len(), p.meta.untimed.clone()),
        (12, vec![(0, 10 * S)])
    );
    drop(r);
    let mut s = Store::open(dir).unwrap();
    let new = window(110, "new", 9);
    s.write_window(&new).unwrap();
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.meta.untimed, vec![(0, 10 * S)]);
    let timed: Vec<_> = wall(&p).into_iter().filter(|s| s.1 != NO_CPU).collect();
    assert_eq!(timed, wall(&new));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Each sample's (wall time, CPU, pid, tid).
fn threads(p: &Profile) -> Vec<(u64, u32, u32, u32)> {
    let mut v: Vec<_> = p
        .samples
        .iter()
        .map(|s| (p.meta.start_unix_ns + s.offset_ns, s.cpu, s.pid, s.tid))
        .collect();
    v.sort_unstable();
    v
}

/// Threads come back as recorded: a window whose samples are spread over a process's main
/// thread and two others reads back with each sample's tid; a store from before tids were
/// kept reads tid = pid, and gains the column when the agent opens it.
#[test]
fn threads_round_trip() {
    let scratch_dir = scratch("threads");
    let dir = scratch_dir.path();
    let mut w = window(100, "app", 30);
    for (k, s) in w.samples.iter_mut().enumerate() {
        s.tid = 42 + (k % 3) as u32;
    }
    let mut s = Store::open(dir).unwrap();
    s.write_window(&w).unwrap();
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(threads(&p), threads(&w));
    assert_eq!(
        p.samples.iter().filter(|s| s.tid == 43).count(),
        10,
        "a third of the samples are thread 43's"
    );
    // A store written before tids were kept.
    s.conn
        .execute_batch("ALTER TABLE counts DROP COLUMN tid;")
        .unwrap();
    drop(s);
    let r = Store::open_read(dir).unwrap();
    let p = r.read(&all(&r)).unwrap();
    assert!(p.samples.iter().all(|s| s.tid == s.pid) && p.samples.len() == 30);
    drop(r);
    let mut s = Store::open(dir).unwrap();
    let new = window(110, "new", 6);
    let mut new_threads = new.clone();
    for s in &mut new_threads.samples {
        s.tid = 77;
    }
    s.write_window(&new_threads).unwrap();
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.iter().filter(|s| s.tid == 77).count(), 6);
    assert_eq!(p.samples.iter().filter(|s| s.tid == s.pid).count(), 30);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Under `--max-size`, times go before whole windows (oldest first), as by `--keep-times`:
/// a store whose counts fit the bound but whose times do not keeps every window, the
/// oldest without times and the newest with them.
#[test]
fn max_size_drops_times_before_windows() {
    let scratch_dir = scratch("size-times");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    // 3000 samples on one row a window: ~17 KB of times against one short counts row.
    for k in 0..20 {
        s.write_window(&window(1000 + 10 * k, "app", 3000)).unwrap();
    }
    let with_times = s.used_bytes().unwrap();
    let r = Retention {
        max_age_ns: 1000 * S,
        keep_times_ns: 1000 * S,
        max_bytes: with_times / 2,
    };
    assert_eq!(s.retain(1200 * S, r).unwrap(), 0, "no window was deleted");
    assert!(s.used_bytes().unwrap() <= with_times / 2);
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 20 * 3000, "every count is still there");
    // One untimed range from the first window: the oldest lost their times, the newest
    // kept them.
    assert_eq!(p.meta.untimed.len(), 1, "{:?}", p.meta.untimed);
    let (from, to) = p.meta.untimed[0];
    assert_eq!(from, 0);
    assert!((10 * S..200 * S).contains(&to), "untimed up to {to} ns");
    let timed: Vec<_> = wall(&p).into_iter().filter(|s| s.1 != NO_CPU).collect();
    let first_timed = 1000 + to / S;
    let mut want: Vec<_> = (first_timed..1200)
        .step_by(10)
        .flat_map(|start| wall(&window(start, "app", 3000)))
        .collect();
    want.sort();
    assert_eq!(timed, want, "the newest windows keep their exact times");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A store from before hashed names and blob stacks (UNIQUE indexes, stacks as text): read
/// read-only as it is, and rebuilt at open with every id kept, so a window written again
/// finds its names, frames and stacks instead of adding them twice.
#[test]
fn a_store_with_unique_indexes_and_text_stacks_is_migrated() {
    let scratch_dir = scratch("migrate-intern");
    let dir = scratch_dir.path();
    let w = window(100, "app", 20);
    let mut s = Store::open(dir).unwrap();
    s.write_window(&w).unwrap();
    // Back to the old form.
    let stacks: Vec<(i64, Vec<i64>)> = s
        .conn
        .prepare("SELECT id, frames FROM stacks")
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, intern::decode_stack(r.get_ref(1)?).unwrap()))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    s.conn
        .execute_batch(
            "CREATE TABLE n2(id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);
             INSERT INTO n2 SELECT id, text FROM names; DROP TABLE names;
             ALTER TABLE n2 RENAME TO names;
             CREATE TABLE f2(id INTEGER PRIMARY KEY, kernel INTEGER NOT NULL,
               name INTEGER NOT NULL, module INTEGER NOT NULL, addr INTEGER NOT NULL,
               binary INTEGER NOT NULL, UNIQUE(kernel, name, module, addr, binary));
             INSERT INTO f2 SELECT id, kernel, name, module, addr, binary FROM frames;
             DROP TABLE frames; ALTER TABLE f2 RENAME TO frames;
             DROP TABLE stacks;
             CREATE TABLE stacks(id INTEGER PRIMARY KEY, frames TEXT NOT NULL UNIQUE);",
        )
        .unwrap();
    for (id, ids) in &stacks {
        let text: Vec<String> = ids.iter().map(i64::to_string).collect();
        s.conn
            .execute(
                "INSERT INTO stacks(id, frames) VALUES (?1, ?2)",
                params![id, text.join(",")],
            )
            .unwrap();
    }
    drop(s);
    let folded = |p: &Profile| crate::output::folded_lines(p);
    let r = Store::open_read(dir).unwrap();
    let old = r.read(&all(&r)).unwrap();
    assert_eq!(wall(&old), wall(&w));
    assert_eq!(folded(&old), folded(&w));
    drop(r);
    let mut s = Store::open(dir).unwrap();
    let count = |s: &Store, t: &str| -> i64 {
        s.conn
            .query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get(0))
            .unwrap()
    };
    let before: Vec<i64> = ["names", "frames", "stacks"]
        .iter()
        .map(|t| count(&s, t))
        .collect();
    let again = window(110, "app", 20);
    s.write_window(&again).unwrap();
    let after: Vec<i64> = ["names", "frames", "stacks"]
        .iter()
        .map(|t| count(&s, t))
        .collect();
    assert_eq!(before, after, "the same window found every row it needs");
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 40);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A read while the agent drops times (`--keep-times`) and stores windows sees the store as
/// it was when the read began: before, the windows were read as timed and their counts,
/// read after the commit, had no times ("5 samples cannot fit in 0 bytes of times; the store
/// is damaged" from /api/heatmap, issue 11), and a window stored meanwhile went unread
/// while its samples were sized in.
#[test]
fn a_read_sees_one_snapshot_while_the_agent_writes() {
    let scratch_dir = scratch("snapshot");
    let dir = scratch_dir.path();
    let mut writer = Store::open(dir).unwrap();
    for k in 0..3 {
        writer
            .write_window(&window(1000 + 10 * k, "app", 30))
            .unwrap();
    }
    let reader = Store::open_read(dir).unwrap();
    let r = Retention {
        max_age_ns: 1000 * S,
        keep_times_ns: 0,
        max_bytes: 1 << 30,
    };
    let mut committed = false;
    let p = reader
        .read_snapshot(&all(&reader), ReadLimits::QUERY, &mut || {
            // Between the read of the windows and that of their counts.
            writer.write_window(&window(1030, "app", 30)).unwrap();
            writer.retain(1100 * S, r).unwrap();
            committed = true;
        })
        .unwrap();
    assert!(committed);
    assert_eq!(p.samples.len(), 90, "the three windows the read began with");
    assert!(p.meta.untimed.is_empty(), "{:?}", p.meta.untimed);
    assert!(p.samples.iter().all(Sample::has_time));
    // The writer did commit: a new read sees four windows, all without times.
    let p = reader.read(&all(&reader)).unwrap();
    assert_eq!(p.samples.len(), 120);
    assert_eq!(p.meta.untimed, vec![(0, 40 * S)]);
    std::fs::remove_dir_all(dir).unwrap();
}
