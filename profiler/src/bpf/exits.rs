//! Process exits, user side of profiler-ebpf `exits`: find where the running kernel keeps a
//! task's exit code (its BTF, /sys/kernel/btf/vmlinux), attach the sched_process_exit program
//! with that offset, and hand its ring buffer to the collector (`collect::ProcessEvents`).
use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
    programs::RawTracePoint,
};
use profiler_common::exits::{MAP_EXITS, PROGRAM_EXIT};

use super::BpfError;

/// Where the running kernel keeps a task's exit code, for the exit program's load-time
/// global. None when its BTF does not say: exit statuses are then not recorded.
pub(super) fn exit_code_offset() -> Option<u64> {
    let offset = std::fs::read("/sys/kernel/btf/vmlinux")
        .ok()
        .and_then(|btf| member_offset(&btf, "task_struct", "exit_code"));
    if offset.is_none() {
        log::warn!(
            "cannot find task_struct.exit_code in /sys/kernel/btf/vmlinux: exit statuses are not recorded"
        );
    }
    offset
}

/// Attaches the exit program and takes its ring buffer.
pub(super) fn attach(ebpf: &mut Ebpf) -> Result<RingBuf<MapData>, BpfError> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(PROGRAM_EXIT)
        .ok_or(BpfError::Missing("exit program"))?
        .try_into()?;
    program.load()?;
    program.attach("sched_process_exit")?;
    Ok(RingBuf::try_from(
        ebpf.take_map(MAP_EXITS)
            .ok_or(BpfError::Missing("exit ring buffer"))?,
    )?)
}

/// Byte offset of `member` in the struct `name`, from raw BTF (little-endian, as the kernel
/// writes it on the hosts we run on). Only plain (non-bitfield) members.
pub(super) fn member_offset(btf: &[u8], name: &str, member: &str) -> Option<u64> {
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
    }
}
