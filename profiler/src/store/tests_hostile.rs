//! The store under failure: a transaction that fails half-way (no cached id may outlive it), a
//! full disk (tmpfs; privileged), a corrupt file at start.
use std::collections::BTreeMap;

use super::*;
use crate::profile::{Frame, Interner, Meta, Sample};

const S: u64 = 1_000_000_000;

/// A 10 s window at `start_s`: `stacks` distinct stacks `main;f{tag}_{j}` with `j + 1` samples
/// each. Frame names are long so that a few windows fill pages.
fn window(start_s: u64, tag: &str, stacks: usize) -> Profile {
    let mut i = Interner::new(Meta {
        start_unix_ns: start_s * S,
        duration_ns: 10 * S,
        frequency_hz: 19,
        ..Meta::default()
    });
    let comm = i.string(&format!("comm-{tag}"));
    let module = i.string("app");
    let main = i.string("main");
    let main = i.frame(Frame {
        name: main,
        module,
        ..Frame::default()
    });
    let mut recorded = 0;
    for j in 0..stacks {
        let name = i.string(&format!("f{tag}_{j}_{}", "x".repeat(80)));
        let leaf = i.frame(Frame {
            name,
            module,
            ..Frame::default()
        });
        let stack = i.stack(vec![main, leaf]);
        for _ in 0..=j {
            i.sample(Sample {
                offset_ns: 0,
                cpu: 0,
                pid: 42,
                tid: 42,
                cgroup_id: 0,
                comm,
                stack,
            });
            recorded += 1;
        }
    }
    let mut p = i.finish();
    p.meta.counters.recorded = recorded;
    p
}

/// What a profile holds: "comm;frame;frame" -> samples.
fn content(p: &Profile) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in &p.samples {
        let mut key = p.str(s.comm).to_owned();
        for f in p.stack_frames(s.stack) {
            key.push(';');
            key.push_str(p.str(f.name));
        }
        *out.entry(key).or_default() += 1;
    }
    out
}

/// Every window in the store reads back as exactly what was written at its start.
fn assert_windows_intact(s: &Store, written: &BTreeMap<u64, Profile>) -> usize {
    let starts: Vec<i64> = s
        .conn
        .prepare("SELECT start_ns FROM windows ORDER BY start_ns")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    for &start in &starts {
        let start = start as u64;
        let got = s
            .read(&Query {
                since_unix_ns: start,
                until_unix_ns: start + 1,
                ..Query::default()
            })
            .unwrap_or_else(|e| panic!("window at {start}: {e}"));
        let want = written
            .get(&start)
            .unwrap_or_else(|| panic!("a window at {start} that was never written"));
        let (got, want) = (content(&got), content(want));
        assert!(
            got == want,
            "window at {start}: {} stacks, {} samples read; {} stacks, {} samples written",
            got.len(),
            got.values().sum::<u64>(),
            want.len(),
            want.values().sum::<u64>()
        );
    }
    starts.len()
}

/// A scratch directory, removed when the returned value drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("store-hostile-{name}-"))
        .tempdir()
        .unwrap()
}

/// A commit refused half-way (here by `max_page_count`, which fails like a full disk): the
/// names and frames interned before the failure were rolled back, and a later window with the
/// same stacks must not use their cached ids.
#[test]
fn a_failed_transaction_leaves_no_cached_ids() {
    let scratch_dir = scratch("rollback");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    let mut written = BTreeMap::new();
    let first = window(100, "a", 3);
    s.write_window(&first).unwrap();
    written.insert(100 * S, first);
    let pages: i64 = s
        .conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    s.conn
        .execute_batch(&format!("PRAGMA max_page_count={pages}"))
        .unwrap();
    let big = window(110, "b", 400);
    let e = s
        .write_window(&big)
        .expect_err("a window larger than the room left");
    assert!(crate::util::chain(&e).contains("full"), "{e}");
    s.conn
        .execute_batch("PRAGMA max_page_count=1073741823")
        .unwrap();
    // The same stacks again, now with room.
    s.write_window(&big).unwrap();
    written.insert(110 * S, big);
    let n = assert_windows_intact(&s, &written);
    assert!(n >= 1, "the newest window is stored");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A corrupt file at start is moved aside (kept, renamed with a timestamp) and an empty store
/// takes its place; a file that is no database at all too.
#[test]
fn a_corrupt_file_is_moved_aside() {
    for (name, damage) in [("garbage", false), ("damaged", true)] {
        let scratch_dir = scratch(name);
        let dir = scratch_dir.path();
        let path = dir.join(DB_FILE);
        if damage {
            let mut s = Store::open(dir).unwrap();
            for k in 0..20 {
                s.write_window(&window(100 + 10 * k, &k.to_string(), 50))
                    .unwrap();
            }
            s.conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .unwrap();
            drop(s);
            // Overwrite the middle of the file (a b-tree page) with noise.
            let mut bytes = std::fs::read(&path).unwrap();
            assert!(bytes.len() > 3 * 4096, "{} bytes", bytes.len());
            for (i, b) in bytes[2 * 4096..3 * 4096].iter_mut().enumerate() {
                *b = (i * 7 + 13) as u8;
            }
            std::fs::write(&path, bytes).unwrap();
        } else {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(&path, vec![0x5a; 64 << 10]).unwrap();
        }
        let mut s = Store::open(dir).unwrap();
        let aside: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("profiles.db.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "{name}: {aside:?}");
        let w = window(500, "new", 5);
        s.write_window(&w).unwrap();
        let written = BTreeMap::from([(500 * S, w)]);
        assert_eq!(assert_windows_intact(&s, &written), 1, "{name}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A small tmpfs, unmounted (lazily) on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// None (with the reason printed) where mounting is not allowed, unless CI=true.
    fn mount(name: &str, size: &str) -> Option<Self> {
        let dir = scratch(name);
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("running mount");
        if out.status.success() {
            return Some(Self(dir));
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "cannot mount a tmpfs (CI=true needs root): {why}"
        );
        eprintln!("skipped: cannot mount a tmpfs: {why}");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Unmounted first; the directory goes when the field drops, after this.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// Writes windows with new stacks from `start_s` on until one fails; returns that window.
fn fill(s: &mut Store, written: &mut BTreeMap<u64, Profile>, mut start_s: u64) -> Profile {
    for _ in 0..10_000 {
        let w = window(start_s, &start_s.to_string(), 150);
        if s.write_window(&w).is_err() {
            return w;
        }
        written.insert(start_s * S, w);
        start_s += 10;
    }
    panic!("10000 windows fit on a small tmpfs");
}

/// Writes `w`; a write that fails on a full disk must succeed when tried again (the agent
/// keeps the window and retries), as the failure freed room.
fn write_retried(s: &mut Store, written: &mut BTreeMap<u64, Profile>, w: Profile) {
    if let Err(first) = s.write_window(&w) {
        s.write_window(&w)
            .unwrap_or_else(|e| panic!("failed ({first}) and failed again: {e}"));
    }
    written.insert(w.meta.start_unix_ns, w);
}

/// The store fills the disk itself (its --max-size is above the disk's room): the full disk
/// is survived by spending the reserve on a checkpoint and pruning the oldest windows, and
/// the windows after it are stored in the pages freed inside the file.
#[test]
fn the_store_fills_the_disk_itself() {
    let Some(fs) = Tmpfs::mount("self", "8m") else {
        return;
    };
    let dir = fs.0.path().join("data");
    let mut s = Store::open(&dir).unwrap();
    assert!(dir.join(health::RESERVE_FILE).is_file());
    let mut written = BTreeMap::new();
    let failed = fill(&mut s, &mut written, 1000);
    let before = written.len();
    assert!(before > 5, "only {before} windows before the disk filled");
    assert!(s.disk_cap.is_some(), "a full disk bounds the store");
    let mut start = failed.meta.start_unix_ns / S;
    write_retried(&mut s, &mut written, failed);
    for _ in 0..30 {
        start += 10;
        write_retried(&mut s, &mut written, window(start, &start.to_string(), 150));
        s.retain(0, super::tests::keep(u64::MAX, u64::MAX)).unwrap();
    }
    let n = assert_windows_intact(&s, &written);
    assert!(n > 5, "only {n} windows left");
}

/// A full disk drops sample times before windows, as `--max-size` does (`retain`'s loop):
/// windows whose times are most of the store fill the disk, and every window's counts stay,
/// the oldest without times and the newest with them.
#[test]
fn a_full_disk_drops_times_before_windows() {
    let Some(fs) = Tmpfs::mount("times", "8m") else {
        return;
    };
    let dir = fs.0.path().join("data");
    let mut s = Store::open(&dir).unwrap();
    // 3000 samples on one row a window: ~17 KB of times against one short counts row.
    let mut stored = 0;
    let failed = loop {
        assert!(stored < 10_000, "10000 windows fit on a small tmpfs");
        let w = super::tests::window(1000 + 10 * stored, "app", 3000);
        if s.write_window(&w).is_err() {
            break w;
        }
        stored += 1;
    };
    assert!(stored > 5, "only {stored} windows before the disk filled");
    assert!(s.disk_cap.is_some(), "a full disk bounds the store");
    let count = |sql: &str| -> i64 { s.conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM windows"),
        stored as i64,
        "no window was deleted"
    );
    assert_eq!(
        count("SELECT sum(samples) FROM counts"),
        stored as i64 * 3000,
        "every count is still there"
    );
    let untimed = count("SELECT count(*) FROM windows WHERE has_times = 0");
    assert!(untimed > 0, "no window lost its times");
    assert!(
        count("SELECT max(start_ns) FROM windows WHERE has_times = 0")
            < count(
                "SELECT ifnull(min(start_ns), 9000000000000000000) FROM windows WHERE has_times = 1"
            ),
        "the oldest windows lose their times first"
    );
    // The agent's retry of the refused window now fits.
    s.write_window(&failed).unwrap();
}

/// Another file takes all the room: a window fails half-way, and once the file is gone the
/// same window (the agent's retry) is stored, the reserve is made again and the bound lifted;
/// every window reads back as written (no id cached from the failed transaction).
#[test]
fn another_file_fills_the_disk_then_room_again() {
    let Some(fs) = Tmpfs::mount("other", "16m") else {
        return;
    };
    let dir = fs.0.path().join("data");
    let mut s = Store::open(&dir).unwrap();
    let mut written = BTreeMap::new();
    for k in 0..5 {
        let w = window(1000 + 10 * k, &k.to_string(), 50);
        s.write_window(&w).unwrap();
        written.insert(w.meta.start_unix_ns, w);
    }
    let filler = fs.0.path().join("filler");
    let _ = std::fs::write(&filler, vec![1u8; 16 << 20]);
    let failed = fill(&mut s, &mut written, 2000);
    std::fs::remove_file(&filler).unwrap();
    s.write_window(&failed).unwrap();
    written.insert(failed.meta.start_unix_ns, failed);
    for k in 0..10 {
        let w = window(3000 + 10 * k, &k.to_string(), 50);
        s.write_window(&w).unwrap();
        written.insert(w.meta.start_unix_ns, w);
    }
    assert!(
        dir.join(health::RESERVE_FILE).is_file(),
        "the reserve is back"
    );
    assert!(s.disk_cap.is_none(), "the bound is lifted with room again");
    let n = assert_windows_intact(&s, &written);
    assert!(n >= 11, "{n} windows");
}

/// A bounded read refuses, with a message naming the bound, a range holding more samples or
/// stacks than its limits, however short or long the span: memory follows what is read.
#[test]
fn reads_are_bounded_by_samples_and_stacks() {
    let scratch_dir = scratch("bounded");
    let dir = scratch_dir.path();
    let mut s = Store::open(dir).unwrap();
    // 20 stacks with 1..=20 samples: 210 samples per window, two windows.
    s.write_window(&window(100, "a", 20)).unwrap();
    s.write_window(&window(110, "b", 20)).unwrap();
    let all = Query {
        since_unix_ns: 0,
        until_unix_ns: u64::MAX / 2,
        ..Query::default()
    };
    let limits = |max_samples, max_stacks| ReadLimits {
        max_samples,
        max_stacks,
    };
    assert_eq!(
        s.read_bounded(&all, limits(420, 40)).unwrap().samples.len(),
        420
    );
    let e = s
        .read_bounded(&all, limits(419, 40))
        .unwrap_err()
        .to_string();
    assert!(e.contains("419 samples"), "{e}");
    let e = s
        .read_bounded(&all, limits(420, 39))
        .unwrap_err()
        .to_string();
    assert!(e.contains("39 stacks"), "{e}");
    // A filter counts only what matches.
    let only_b = Query {
        comms: vec!["comm-b".into()],
        ..all
    };
    assert_eq!(
        s.read_bounded(&only_b, limits(210, 20))
            .unwrap()
            .samples
            .len(),
        210
    );
    std::fs::remove_dir_all(dir).unwrap();
}
