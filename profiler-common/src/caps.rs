//! The privilege check before anything is loaded: the CLI (record, agent, doctor), the
//! integration tests and `cargo xtask setup` ask it, each wording its own advice. Capabilities
//! rather than uid 0: root in a default container lacks them. Host only (no BPF code uses it).

/// Capability bits in `CapEff` (linux/capability.h).
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The effective capability set from the text of /proc/PID/status (`CapEff:\t000001ff...`).
pub fn cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The capabilities that loading BPF programs and opening perf events need and `cap_eff`
/// lacks: none with CAP_SYS_ADMIN, which implies both (and is the only way before 5.8).
pub fn missing_for_bpf(cap_eff: u64) -> impl Iterator<Item = &'static str> {
    let has = move |bit: u32| cap_eff & (1 << bit) != 0;
    [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(move |&(bit, _)| !has(CAP_SYS_ADMIN) && !has(bit))
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_admin_implies_both_and_each_missing_one_is_named() {
        let count = |caps: u64| missing_for_bpf(caps).count();
        assert_eq!(count(1 << CAP_SYS_ADMIN), 0);
        assert_eq!(count((1 << CAP_BPF) | (1 << CAP_PERFMON)), 0);
        assert_eq!(count(0), 2);
        assert_eq!(missing_for_bpf(1 << CAP_BPF).next(), Some("CAP_PERFMON"));
        assert_eq!(missing_for_bpf(1 << CAP_PERFMON).next(), Some("CAP_BPF"));
        assert_eq!(
            cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n"),
            Some(0x1ff_ffff_ffff)
        );
        assert_eq!(cap_eff("CapEff:\tzz\n"), None);
    }
}
