//! Where the running kernel keeps the `task_struct` fields our programs read (no CO-RE in our
//! toolchain): found once in its BTF (/sys/kernel/btf/vmlinux) and set as load-time globals of
//! every load of the object. A field not found leaves the program that needs it idle.
use std::sync::OnceLock;

use profiler_common::{churn::GLOBAL_TGID_OFFSET, exits::GLOBAL_EXIT_CODE_OFFSET, runq};

/// Byte offsets in `task_struct`; None where the BTF does not say.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TaskOffsets {
    pub exit_code: Option<u64>,
    pub tgid: Option<u64>,
    /// The run-queue program's fields; None without `sched_info` (CONFIG_SCHED_INFO).
    pub runq: Option<RunqOffsets>,
}

/// Offsets in `task_struct` of what the kernel counts of a task's waits and runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunqOffsets {
    /// `sched_info.pcount`, `.run_delay`, `.last_arrival`.
    pub pcount: u64,
    pub run_delay: u64,
    pub arrival: u64,
    /// `se.exec_start`, `se.sum_exec_runtime`.
    pub exec_start: u64,
    pub sum_exec: u64,
    pub start_time: u64,
}

impl TaskOffsets {
    /// The running kernel's, read once.
    pub(crate) fn get() -> TaskOffsets {
        static OFFSETS: OnceLock<TaskOffsets> = OnceLock::new();
        *OFFSETS.get_or_init(|| match std::fs::read("/sys/kernel/btf/vmlinux") {
            Ok(btf) => Self::from_btf(&btf),
            Err(e) => {
                log::warn!("cannot read /sys/kernel/btf/vmlinux ({e}): exit statuses, cgroup moves and run-queue waits are not recorded");
                TaskOffsets::default()
            }
        })
    }

    fn from_btf(btf: &[u8]) -> TaskOffsets {
        let field = |name| member_offset(btf, "task_struct", name);
        // A member of a struct embedded in task_struct.
        let nested = |outer, kind, name| Some(field(outer)? + member_offset(btf, kind, name)?);
        let runq = || {
            Some(RunqOffsets {
                pcount: nested("sched_info", "sched_info", "pcount")?,
                run_delay: nested("sched_info", "sched_info", "run_delay")?,
                arrival: nested("sched_info", "sched_info", "last_arrival")?,
                exec_start: nested("se", "sched_entity", "exec_start")?,
                sum_exec: nested("se", "sched_entity", "sum_exec_runtime")?,
                start_time: field("start_time")?,
            })
        };
        TaskOffsets {
            exit_code: field("exit_code"),
            tgid: field("tgid"),
            runq: runq(),
        }
    }

    /// Every offset as its program's global (0 where unknown: the program stays idle), for
    /// `EbpfLoader::override_global` (which keeps a reference: the caller holds the array).
    pub(super) fn globals(&self) -> [(&'static str, u64); 8] {
        let r = self.runq.unwrap_or_default();
        [
            (GLOBAL_EXIT_CODE_OFFSET, self.exit_code.unwrap_or(0)),
            (GLOBAL_TGID_OFFSET, self.tgid.unwrap_or(0)),
            (runq::GLOBAL_PCOUNT_OFFSET, r.pcount),
            (runq::GLOBAL_RUN_DELAY_OFFSET, r.run_delay),
            (runq::GLOBAL_ARRIVAL_OFFSET, r.arrival),
            (runq::GLOBAL_EXEC_START_OFFSET, r.exec_start),
            (runq::GLOBAL_SUM_EXEC_OFFSET, r.sum_exec),
            (runq::GLOBAL_START_TIME_OFFSET, r.start_time),
        ]
    }

    /// Non-zero in every field, so that no program's guard lets the verifier skip its work
    /// (`check`): the real offsets where known.
    pub(super) fn worst_case() -> TaskOffsets {
        let t = Self::get();
        TaskOffsets {
            exit_code: Some(t.exit_code.unwrap_or(8)),
            tgid: Some(t.tgid.unwrap_or(8)),
            runq: Some(t.runq.unwrap_or(RunqOffsets {
                pcount: 8,
                run_delay: 16,
                arrival: 24,
                exec_start: 32,
                sum_exec: 40,
                start_time: 48,
            })),
        }
    }
}

/// Byte offset of `member` in the struct `name`, from raw BTF (little-endian, as the kernel
/// writes it on the hosts we run on). Only plain (non-bitfield) members.
fn member_offset(btf: &[u8], name: &str, member: &str) -> Option<u64> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(btf.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(btf.get(at..at + 4)?.try_into().ok()?));
    if u16_at(0)? != 0xeb9f {
        return None;
    }
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let str_off = u32_at(16)? as usize;
    let types = hdr_len.checked_add(type_off)?;
    let strings = hdr_len.checked_add(str_off)?;
    let name_at = |off: u32| -> Option<&[u8]> {
        let start = strings.checked_add(off as usize)?;
        let rest = btf.get(start..)?;
        Some(&rest[..rest.iter().position(|&b| b == 0)?])
    };
    let mut at = types;
    let end = types.checked_add(type_len)?;
    while at + 12 <= end {
        let (name_off, info) = (u32_at(at)?, u32_at(at + 4)?);
        let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31);
        // Bytes that follow the 12-byte common header, per kind (linux/btf.h).
        let extra = match kind {
            1 | 14 | 17 => 4,     // INT, VAR, DECL_TAG
            3 => 12,              // ARRAY
            4 | 5 => vlen * 12,   // STRUCT, UNION: name_off, type, offset
            6 | 13 => vlen * 8,   // ENUM, FUNC_PROTO
            15 | 19 => vlen * 12, // DATASEC, ENUM64
            _ => 0,
        };
        if kind == 4 && name_at(name_off)? == name.as_bytes() {
            for m in 0..vlen {
                let m_at = at + 12 + m * 12;
                if name_at(u32_at(m_at)?)? == member.as_bytes() {
                    let raw = u32_at(m_at + 8)?;
                    let bits = if kind_flag == 1 { raw & 0xff_ffff } else { raw };
                    return (bits % 8 == 0).then_some(u64::from(bits / 8));
                }
            }
            return None;
        }
        at += 12 + extra;
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_exit_code_in_the_running_kernel() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("no /sys/kernel/btf/vmlinux here: nothing to check");
            return;
        };
        let off = super::member_offset(&btf, "task_struct", "exit_code").expect("exit_code");
        // task_struct starts with thread_info/state and much else: exit_code is far in.
        assert!(off > 64 && off < 16384, "implausible offset {off}");
        assert_eq!(
            super::member_offset(&btf, "task_struct", "no_such_field"),
            None
        );
        assert_eq!(
            super::member_offset(b"not btf", "task_struct", "exit_code"),
            None
        );
        // The run-queue program's fields: sched_info's counters are adjacent (pcount, then
        // run_delay; last_arrival after them), and se's runtime follows its exec_start.
        let r = (super::TaskOffsets::from_btf(&btf).runq).expect("sched_info in the BTF");
        assert_eq!(r.run_delay, r.pcount + 8, "{r:?}");
        assert!(
            r.arrival > r.run_delay && r.sum_exec == r.exec_start + 8,
            "{r:?}"
        );
    }
}
