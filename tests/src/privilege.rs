//! Can this process load BPF programs and open perf events? Privileged tests ask first, so a
//! developer without root gets a clear skip, while CI (CI=true) fails instead of passing with
//! nothing tested (see DESIGN.md, "Tests in layers").

/// True if the profiler can load BPF here. Otherwise: with CI=true, panics with the reason;
/// elsewhere prints `skipped: <reason>` to stderr and returns false. Privileged tests start
/// with `if !require_bpf() { return; }`.
pub fn require_bpf() -> bool {
    let status = match std::fs::read_to_string("/proc/self/status") {
        Ok(status) => status,
        Err(e) => return unavailable(format!("cannot read /proc/self/status: {e}")),
    };
    match missing_privilege(&status) {
        None => true,
        Some(reason) => unavailable(reason),
    }
}

fn unavailable(reason: String) -> bool {
    crate::cannot_run(&format!("cannot load BPF: {reason}"))
}

/// Why the process described by `status` (the text of /proc/self/status) cannot load BPF, or
/// None if it can: it needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN (kernels before 5.8
/// have no CAP_BPF). Capabilities rather than uid 0: root in a default container lacks them.
pub fn missing_privilege(status: &str) -> Option<String> {
    use profiler_common::caps;
    let Some(cap_eff) = field(status, "CapEff:") else {
        return Some("no CapEff line in /proc/self/status".into());
    };
    let Some(eff) = caps::cap_eff(status) else {
        return Some(format!("unparsable CapEff {cap_eff:?}"));
    };
    // Nothing missing: nothing to say.
    caps::missing_for_bpf(eff).next()?;
    // The effective uid (second field of `Uid:`) makes the usual case obvious in the message.
    let euid = field(status, "Uid:").unwrap_or("?");
    Some(format!(
        "needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to load BPF; effective uid {euid}, \
         CapEff {cap_eff} (run as root or `cargo xtask test`)"
    ))
}

/// The first value of the line starting with `key`, e.g. `CapEff:\t000001ffffffffff`.
/// For `Uid:` (real, effective, saved, fs) it returns the second value, the effective uid.
fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    let line = status.lines().find(|line| line.starts_with(key))?;
    let mut values = line[key.len()..].split_whitespace();
    if key == "Uid:" {
        values.next();
    }
    values.next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::caps::{CAP_BPF, CAP_PERFMON};

    fn status(uid: &str, cap_eff: &str) -> String {
        format!("Name:\tcargo\nUid:\t{uid}\nGid:\t0\t0\t0\t0\nCapEff:\t{cap_eff}\n")
    }

    #[test]
    fn full_root_can_load() {
        assert_eq!(
            missing_privilege(&status("0\t0\t0\t0", "000001ffffffffff")),
            None
        );
    }

    #[test]
    fn bpf_and_perfmon_without_root_can_load() {
        let caps = format!("{:016x}", (1u64 << CAP_BPF) | (1u64 << CAP_PERFMON));
        assert_eq!(
            missing_privilege(&status("1000\t1000\t1000\t1000", &caps)),
            None
        );
    }

    #[test]
    fn sys_admin_alone_can_load() {
        // Kernels before 5.8: root has bits 0..=37 only.
        assert_eq!(
            missing_privilege(&status("0\t0\t0\t0", "0000003fffffffff")),
            None
        );
    }

    #[test]
    fn only_one_of_bpf_and_perfmon_is_not_enough() {
        let caps = format!("{:016x}", 1u64 << CAP_BPF);
        let reason = missing_privilege(&status("1000\t1000\t1000\t1000", &caps)).unwrap();
        assert!(reason.contains("CAP_PERFMON"), "{reason}");
    }

    #[test]
    fn unprivileged_user_gets_a_reason_with_the_euid() {
        let reason = missing_privilege(&status("1000\t1001\t1000\t1000", "0000000000000000"));
        let reason = reason.expect("an unprivileged user cannot load BPF");
        assert!(reason.contains("effective uid 1001"), "{reason}");
    }

    #[test]
    fn root_in_a_container_without_caps_cannot_load() {
        // Docker's default set: no CAP_SYS_ADMIN, CAP_BPF or CAP_PERFMON.
        assert!(missing_privilege(&status("0\t0\t0\t0", "00000000a80425fb")).is_some());
    }

    #[test]
    fn missing_or_garbled_cap_eff_is_a_reason() {
        assert!(
            missing_privilege("Name:\tx\n")
                .unwrap()
                .contains("no CapEff")
        );
        assert!(
            missing_privilege("CapEff:\tzz\n")
                .unwrap()
                .contains("unparsable")
        );
    }
}
