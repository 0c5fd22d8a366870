//! The store on synthetic windows: round trip, filters, retention by age and by size.
use super::*;
use crate::profile::{Cgroup, Frame, Interner, Meta, Sample};

const S: u64 = 1_000_000_000;

/// A 10 s window starting at `start_s` with `n` samples of `comm` on one stack main;work.
fn window(start_s: u64, comm: &str, n: u64) -> Profile {
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
            offset_ns: k,
            cpu: 0,
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

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("store-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
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
    let dir = scratch("round");
    let mut s = Store::open(&dir).unwrap();
    s.write_window(&window(100, "app", 5)).unwrap();
    s.write_window(&window(110, "other", 3)).unwrap();
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 8);
    assert_eq!(p.meta.start_unix_ns, 100 * S);
    assert_eq!(p.meta.duration_ns, 20 * S);
    // Spread over the window, in order.
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
    let r = Store::open_read(&dir).unwrap();
    assert_eq!(r.read(&all(&r)).unwrap().samples.len(), 8);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn retention_by_age_and_size() {
    let dir = scratch("retain");
    let mut s = Store::open(&dir).unwrap();
    for k in 0..50 {
        s.write_window(&window(1000 + 10 * k, &format!("comm{k}"), 200))
            .unwrap();
    }
    // Age: keep windows ending within 100 s of t = 1500 s.
    let deleted = s.retain(1500 * S, 100 * S, 1 << 30).unwrap();
    assert_eq!(deleted, 39); // the 40th ends exactly at the cutoff
    let p = s.read(&all(&s)).unwrap();
    assert_eq!(p.samples.len(), 11 * 200);
    // Size: under the current use, the oldest go first until it fits (or one is left).
    let used = s.used_bytes().unwrap();
    s.retain(1500 * S, 1000 * S, used / 2).unwrap();
    let left = s.read(&all(&s)).unwrap();
    assert!(left.samples.len() < p.samples.len());
    assert!(left.samples.len() >= 200);
    assert!(
        left.meta.start_unix_ns > p.meta.start_unix_ns,
        "the newest stay"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unusable_data_dir_is_a_clear_error() {
    let file = scratch("file");
    std::fs::write(&file, "").unwrap();
    let Err(e) = Store::open(&file.join("data")) else {
        panic!("opened a store under a file");
    };
    assert!(e.to_string().starts_with("cannot use data dir"), "{e}");
    assert!(Store::open_read(&file).is_err());
    std::fs::remove_file(&file).unwrap();
}
