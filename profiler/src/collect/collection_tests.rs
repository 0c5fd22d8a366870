//! Unit tests of the live collector: what the unwind-table loader is told.
use std::sync::{Arc, Mutex};

use super::{process::tests::map_record, *};
use crate::unwind::ProcessEvent;

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
