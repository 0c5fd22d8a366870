//! The vDSO's unwind table, beside the loader's file mappings: the vDSO is in no file, so
//! `proc_mappings` would leave it out and a sample whose leaf is in it (`clock_gettime`)
//! would be walked by frame pointer from there, which fails at its first instructions
//! (before `push %rbp`). Every 64-bit process of one kernel maps the same vDSO image, so
//! the profiler copies its own once into a memfd: the loader then reads it like any file
//! (`/proc/self/fd/N`, one device and inode, so its table is compiled once for all).
use std::{io::Write as _, os::fd::AsRawFd as _, path::PathBuf, sync::OnceLock};

use crate::process::MappingSpec;

/// The process's `[vdso]` mapping from its /proc/PID/maps text, pointing at the memfd copy
/// of the image. None when there is no vDSO or it could not be copied.
pub(crate) fn mapping(maps: &str) -> Option<MappingSpec> {
    let line = maps.lines().find(|l| l.ends_with(" [vdso]"))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    Some(MappingSpec {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: 0,
        path: image()?.clone(),
        file: None,
        key: None,
    })
}

/// The path of the memfd holding this process's vDSO image, made on first use.
fn image() -> Option<&'static PathBuf> {
    static IMAGE: OnceLock<Option<(std::fs::File, PathBuf)>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
            let line = maps.lines().find(|l| l.ends_with(" [vdso]"))?;
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let len = u64::from_str_radix(end, 16).ok()?.checked_sub(start)?;
            // SAFETY: the kernel maps the vDSO readable for the process's whole life, at
            // the range /proc/self/maps shows; it is only read here.
            let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len as usize) };
            // SAFETY: a plain syscall with a NUL-terminated name.
            let fd = unsafe { libc::memfd_create(c"vdso".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                log::debug!("memfd for the vDSO: {}", std::io::Error::last_os_error());
                return None;
            }
            // SAFETY: a new descriptor this function owns.
            let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            file.write_all(bytes).ok()?;
            let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            Some((file, path))
        })
        .as_ref()
        .map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own vDSO becomes a mapping whose image has an .eh_frame covering clock_gettime.
    #[test]
    fn own_vdso_is_a_mapping_with_a_table() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let m = mapping(&maps).expect("this process has a [vdso] mapping");
        assert!(m.end > m.start, "{m:?}");
        let data = std::fs::read(&m.path).unwrap();
        assert_eq!(data.len() as u64, m.end - m.start);
        let table = super::super::table::compile(&data).unwrap();
        assert!(table.fdes >= 2, "the vDSO has {} FDEs", table.fdes);
        let file = object::File::parse(&*data).unwrap();
        use object::{Object as _, ObjectSymbol as _};
        let gettime = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok("__vdso_clock_gettime"))
            .expect("the vDSO exports __vdso_clock_gettime");
        let row = table.lookup(gettime.address()).unwrap();
        assert_eq!(row.kind, profiler_common::unwind::kind::CFA_RSP, "{row:?}");
        assert_eq!(
            super::super::table::mapping_bias(&data, m.start, 0),
            Some(m.start)
        );
    }
}
