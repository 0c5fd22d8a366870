//! Unit tests of `process`: naming from the kernel's records, Python candidates, parent comms.
use super::*;

/// A parent from before the recording (this test process) is read from /proc at its
/// first fork only; its exit forgets it, so a pid reused later is read anew.
#[test]
fn parent_comm_is_read_once_per_process() {
    let me = std::process::id();
    let comm = crate::util::proc_comm(me).expect("reading our own comm");
    let mut t = ProcessTable::default();
    let fork = |pid, time_ns| KernelRecord::Fork {
        pid,
        ppid: me,
        time_ns,
    };
    t.apply(&[fork(4_000_001, 1)]);
    assert_eq!(t.lifetimes.comm(4_000_001), Some(comm.as_str()));
    // What the next fork reads tells whether it went to /proc again.
    t.parent_comms.insert(me, "cached".into());
    t.apply(&[fork(4_000_002, 2)]);
    assert_eq!(t.lifetimes.comm(4_000_002), Some("cached"));
    t.apply(&[KernelRecord::Exit {
        pid: me,
        time_ns: 3,
    }]);
    assert!(!t.parent_comms.contains_key(&me));
    t.apply(&[fork(4_000_003, 4)]);
    assert_eq!(t.lifetimes.comm(4_000_003), Some(comm.as_str()));
}

/// A process whose exec the records told is named by them: its comm and exe are the
/// records' (here made up for this live test process, so /proc would say otherwise),
/// only its cgroup is read from /proc.
#[test]
fn a_process_born_during_the_recording_is_named_by_its_records() {
    let me = std::process::id();
    let mut t = ProcessTable::default();
    t.apply(&[
        KernelRecord::Exec {
            pid: me,
            time_ns: 1,
            comm: "fx-born".into(),
        },
        KernelRecord::Map {
            pid: me,
            time_ns: 2,
            start: 0x1000,
            end: 0x2000,
            pgoff: 0,
            path: "/nonexistent/fx-born".into(),
            id: FileIdentity::Inode(1, 1),
        },
    ]);
    t.saw(me, 3, &[]);
    let p = &t.processes[&me];
    assert_eq!(
        (p.comm.as_str(), p.exe.as_str()),
        ("fx-born", "/nonexistent/fx-born")
    );
    assert_eq!(p.cgroup, crate::cgroups::read_process_cgroups(me).v2);
    assert!(!p.cgroup.is_empty(), "the cgroup is still read from /proc");
    // A process the records never described is read from /proc.
    let mut t = ProcessTable::default();
    t.saw(me, 3, &[]);
    assert_eq!(t.processes[&me].comm, crate::util::proc_comm(me).unwrap());
}

/// Python detection is skipped only for a space the records hold whole with no file
/// named like an interpreter; a libpython mapped later makes it a candidate.
#[test]
fn only_spaces_without_an_interpreter_file_are_ruled_out_of_python() {
    let dir = tempfile::Builder::new()
        .prefix("may-run-python-")
        .tempdir()
        .unwrap();
    // Files are one by build id: each name a copy of another binary.
    let map = |pid, time_ns, start: u64, name: &str, of: &str| {
        let path = dir.path().join(name);
        std::fs::copy(of, &path).unwrap();
        map_record(pid, time_ns, start, &path.display().to_string())
    };
    let pid = 4_000_300;
    let mut t = ProcessTable::default();
    t.apply(&[
        KernelRecord::Exec {
            pid,
            time_ns: 10,
            comm: "fx-true".into(),
        },
        map(pid, 11, 0x10000, "fx-true", "/bin/true"),
    ]);
    let space = t.space_at(pid, 12);
    assert_eq!(
        t.mappings.space(pid, 1).map(|s| s.mappings().len()),
        Some(1)
    );
    assert!(
        !t.may_run_python(space),
        "a complete space without an interpreter"
    );
    t.apply(&[map(pid, 13, 0x20000, "libpython3.99.so.1.0", "/bin/false")]);
    assert!(t.may_run_python(space), "libpython mapped");
    // A process from before the recording (mappings only partly known) and one the
    // records never told of may run anything.
    let old = 4_000_301;
    t.apply(&[map(old, 14, 0x10000, "fx-true", "/bin/true")]);
    assert!(t.may_run_python(t.space_at(old, 15)));
    assert!(t.may_run_python(space_id(4_000_302, 0)));
}

/// An unseen process keeps its lifetime (comm, exe, exit) but gets no address space.
#[test]
fn unseen_processes_keep_their_lifetimes_only() {
    let mut t = ProcessTable::default();
    let records = [
        KernelRecord::Fork {
            pid: 4_000_400,
            ppid: std::process::id(),
            time_ns: 1,
        },
        KernelRecord::Exec {
            pid: 4_000_400,
            time_ns: 2,
            comm: "fx-unseen".into(),
        },
        map_record(4_000_400, 3, 0x40_0000, "/usr/bin/true"),
        KernelRecord::Exit {
            pid: 4_000_400,
            time_ns: 4,
        },
    ];
    t.apply_except(&records, &crate::util::FxSet::from_iter([4_000_400]));
    assert_eq!(t.lifetimes.comm(4_000_400), Some("fx-unseen"));
    assert_eq!(t.lifetimes.exe(4_000_400), Some("/usr/bin/true"));
    assert!(
        t.lifetimes
            .to_profile(0)
            .iter()
            .any(|l| l.pid == 4_000_400 && l.exit_ns.is_some())
    );
    assert_eq!(t.space_at(4_000_400, 3), space_id(4_000_400, 0));
    assert!(t.unwind_mappings(4_000_400, 3).is_none());
    // The same records applied whole give it a space with the mapping.
    let mut whole = ProcessTable::default();
    whole.apply(&records);
    assert!(
        whole
            .unwind_mappings(4_000_400, 3)
            .is_some_and(|m| !m.is_empty())
    );
}

/// The kernel's record of a page-long executable mapping of the file at `path` (which must
/// exist: it is identified by its device and inode).
pub(crate) fn map_record(pid: u32, time_ns: u64, start: u64, path: &str) -> KernelRecord {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).unwrap();
    KernelRecord::Map {
        pid,
        time_ns,
        start,
        end: start + 0x1000,
        pgoff: 0,
        path: path.to_owned(),
        id: FileIdentity::Inode(m.dev(), m.ino()),
    }
}
