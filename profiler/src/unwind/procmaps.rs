//! Executable mappings of live processes from /proc/PID/maps, for the `loader`: processes
//! that existed before the recording (the kernel's MMAP2 records cover the others) and
//! `--pid` targets loaded before sampling starts.
use std::path::PathBuf;

use crate::process::MappingSpec;

/// The executable file mappings of a live process, from /proc/PID/maps, with paths that
/// read the files through /proc/PID/root (its own mount namespace).
pub(crate) fn proc_mappings(pid: u32) -> std::io::Result<Vec<MappingSpec>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut maps = parse_maps(&text, &format!("/proc/{pid}/root"));
    maps.extend(super::vdso::mapping(&text));
    Ok(maps)
}

fn parse_maps(text: &str, root: &str) -> Vec<MappingSpec> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode)) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            continue;
        };
        let path = words.collect::<Vec<_>>().join(" ");
        if !perms.contains('x') || !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(file_offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        out.push(MappingSpec {
            start,
            end,
            file_offset,
            path: PathBuf::from(format!("{root}{path}")),
            file: None,
            key: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_become_exec_file_mappings() {
        let text = "\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 123 /usr/bin/xz
55d0c0001000-55d0c0010000 r-xp 00001000 fe:01 123 /usr/bin/xz
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]
7f0000002000-7f0000003000 r-xp 00002000 fe:01 9 /opt/my lib.so
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
";
        let maps = parse_maps(text, "/proc/7/root");
        assert_eq!(
            maps,
            vec![
                MappingSpec {
                    start: 0x55d0_c000_1000,
                    end: 0x55d0_c001_0000,
                    file_offset: 0x1000,
                    path: "/proc/7/root/usr/bin/xz".into(),
                    file: None,
                    key: None,
                },
                MappingSpec {
                    start: 0x7f00_0000_2000,
                    end: 0x7f00_0000_3000,
                    file_offset: 0x2000,
                    path: "/proc/7/root/opt/my lib.so".into(),
                    file: None,
                    key: None,
                },
            ]
        );
    }
}
