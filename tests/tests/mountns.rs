//! A binary that exists only inside a private mount namespace (a tmpfs mounted in an
//! `unshare -m` shell) is read through /proc/PID/root and resolves to its functions.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::{
    CpuUsage, TempDir, exclusive, expect_success, has_chain, head, read_folded, record,
    require_bpf, samples,
};

#[test]
fn binary_only_in_a_private_mount_namespace_resolves() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("mountns");
    // An empty directory on the host: the tmpfs over it, and the binary in it, exist only in
    // the child's mount namespace.
    let mnt = dir.file("mnt");
    std::fs::create_dir(&mnt).expect("create mount point");
    let script =
        format!("mount -t tmpfs none {mnt} && cp \"$0\" {mnt}/fx-mntns && exec {mnt}/fx-mntns 15");
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(env!("FIXTURE_FX_CHAIN"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start unshare (util-linux)");
    let comm = format!("/proc/{}/comm", child.id());
    let started = (0..500).any(|_| {
        let ok = std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == "fx-mntns");
        if !ok {
            std::thread::sleep(Duration::from_millis(10));
        }
        ok
    });
    if !started {
        let _ = child.kill();
        let _ = child.wait();
        panic!("fx-mntns did not start in its mount namespace (unshare -m needs root)");
    }
    assert!(
        !Path::new(&format!("{mnt}/fx-mntns")).exists(),
        "the binary must not be visible from the host's mount namespace"
    );
    let out = dir.file("mntns.folded");
    let usage = CpuUsage::start(child.id());
    let result = record(&["--comm", "fx-mntns", "-F", "499", "-d", "3s", "-o", &out]);
    let (min, _) = usage.sample_band(499.0, 3.0);
    let _ = child.kill();
    let _ = child.wait();
    expect_success(&result, "record");

    let (text, stacks) = read_folded(Path::new(&out));
    let total = samples(&stacks, |f| f[0] == "fx-mntns");
    let chained = samples(&stacks, |f| {
        f[0] == "fx-mntns" && has_chain(f, &["main", "a", "b", "c"], |x, w| x == w)
    });
    eprintln!("fx-mntns: {chained} of {total} samples have main;a;b;c");
    assert!(
        total >= 50 && total as f64 >= min,
        "only {total} samples, {min:.0} expected from its CPU time; {}",
        head(&text, 20)
    );
    assert!(
        chained * 100 >= total * 80,
        "only {chained} of {total} samples resolve to main;a;b;c; {}",
        head(&text, 20)
    );
}
