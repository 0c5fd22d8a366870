//! Unit tests of the live collector: what the unwind-table loader is told.
use std::sync::{Arc, Mutex};

use super::*;
use crate::process::ProcessEvent;
use crate::process::{map_record, unseen_lives};

/// A sample record as the sampler writes it: the header, then `user` addresses.
fn sample(pid: u32, time_ns: u64, user: &[u64]) -> Vec<u8> {
    let mut h = SampleHeader {
        time_ns,
        pid,
        tid: pid,
        ustack_len: user.len() as u32,
        ..SampleHeader::default()
    };
    h.comm[..2].copy_from_slice(b"fx");
    // SAFETY: SampleHeader is repr(C) plain data; its bytes are what the ring carries.
    let head = unsafe {
        std::slice::from_raw_parts(
            (&raw const h).cast::<u8>(),
            std::mem::size_of::<SampleHeader>(),
        )
    };
    let mut v = head[..HEADER_BYTES].to_vec();
    for a in user {
        v.extend_from_slice(&a.to_ne_bytes());
    }
    v
}

/// A process's first sample may come from before its latest exec was read (taken while the
/// child of a fork still ran its parent's image, or in ld.so): the loader must be given the
/// mappings the kernel's entry is for, the samples to come, not those at the sample, which
/// would replace the newer ones the same drain had just loaded (issue 11: a new process's
/// stacks then stopped at "no mapping" until the next reload).
#[test]
fn the_first_sample_loads_the_process_as_it_is_now() {
    let pid = std::process::id(); // a live process, so its root can be opened
    let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let log = Arc::clone(&seen);
    let mut c = Collection::new(CommFilter::default()).on_new_process(Box::new(move |e| {
        if let ProcessEvent::Sampled {
            mappings: Some(m), ..
        } = e
        {
            let paths = m.iter().map(|s| s.path.display().to_string()).collect();
            log.lock().unwrap().push(paths);
        }
    }));
    c.processes.apply(&[
        KernelRecord::Exec {
            pid,
            time_ns: 10,
            comm: "sh".into(),
        },
        map_record(pid, 11, 0x40_0000, "/usr/bin/true"),
        KernelRecord::Exec {
            pid,
            time_ns: 20,
            comm: "fx".into(),
        },
        map_record(pid, 21, 0x50_0000, "/usr/bin/false"),
    ]);
    c.add(&sample(pid, 15, &[0x40_0010]));
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        vec![vec!["/usr/bin/false".to_owned()]],
        "the loader got the space of the sample's time, not the current one"
    );
}

/// Under churn most new processes fork, exec, map and exit between two drains: the loader
/// must not be told their mappings (each cost a kernel map update, then a removal), while
/// a process that lives on, and a pid reused by a new process after an exit, still are.
#[test]
fn processes_gone_by_the_drain_are_not_loaded() {
    let exit = |pid, time_ns| KernelRecord::Exit { pid, time_ns };
    let records = [
        map_record(10, 1, 0x40_0000, "/usr/bin/true"),
        map_record(11, 2, 0x40_0000, "/usr/bin/true"),
        exit(10, 3),
        map_record(12, 4, 0x40_0000, "/usr/bin/true"),
        exit(12, 5),
        map_record(12, 6, 0x40_0000, "/usr/bin/false"),
        exit(13, 7),
    ];
    let mut exited = crate::util::FxMap::default();
    let mapped = mapped_and_exited(&records, &mut exited);
    assert_eq!(
        mapped,
        [11, 12],
        "10 died, 11 lives, 12 was reused after its exit"
    );
    let mut exited: Vec<(u32, u64)> = exited.into_iter().collect();
    exited.sort_unstable();
    assert_eq!(exited, [(10, 3), (12, 5), (13, 7)]);
}

/// Of the processes whose fork and exit are both in one drain's records, only those with no
/// sample and no child forked are unseen; a reused pid, a process older than the records and
/// a sampled one are kept.
#[test]
fn unseen_lives_are_born_and_gone_unsampled() {
    let fork = |pid, ppid, time_ns| KernelRecord::Fork { pid, ppid, time_ns };
    let exit = |pid, time_ns| KernelRecord::Exit { pid, time_ns };
    let records = [
        fork(20, 1, 1),
        map_record(20, 2, 0x40_0000, "/usr/bin/true"),
        exit(20, 3),
        fork(21, 1, 4), // sampled
        exit(21, 5),
        fork(22, 1, 6), // forks 23, which is unseen itself
        fork(23, 22, 7),
        exit(23, 8),
        exit(22, 9),
        fork(24, 1, 10), // exits, and its pid is reused by a process that lives on
        exit(24, 11),
        fork(24, 1, 12),
        exit(25, 13),    // older than the records
        fork(26, 1, 14), // lives on
        fork(27, 1, 15), // exits, then a stray record of the pid's next life
        exit(27, 16),
        map_record(27, 17, 0x40_0000, "/usr/bin/true"),
        fork(28, 1, 18), // exits after the samples were read: its samples may come next
        exit(28, 20),
    ];
    let sampled = crate::util::FxSet::from_iter([21]);
    let mut unseen = crate::util::FxSet::default();
    unseen_lives(&records, &sampled, 19, &mut unseen);
    let mut unseen: Vec<u32> = unseen.into_iter().collect();
    unseen.sort_unstable();
    assert_eq!(unseen, [20, 23]);
}

/// Held records come first in the next batch, each whole, then the ring's.
#[test]
fn held_records_lead_the_next_batch() {
    let records = |items: &[&[u8]]| {
        let mut r = Records::default();
        for item in items {
            r.bytes.extend_from_slice(item);
            r.ends.push(r.bytes.len());
        }
        r
    };
    let mut batch = records(&[b"old"]);
    batch.clear();
    let mut held = records(&[b"ab", b"cde"]);
    batch.append(&mut held);
    let mut newer = records(&[b"f"]);
    batch.append(&mut newer);
    assert_eq!(batch.iter().collect::<Vec<_>>(), [&b"ab"[..], b"cde", b"f"]);
    assert_eq!(held.iter().count(), 0, "held records moved, not copied");
}
