//! Where frames come from, kept for pprof mappings and stripped binaries: build ids as hex, the
//! running kernel's build id, and separate debug files found by build id
//! (`/usr/lib/debug/.build-id/xx/yyyy.debug`) for binaries that have no symbols of their own.
//!
//! blazesym only follows a build id when the binary also has a `.gnu_debuglink`; a plain
//! `strip`ped binary has none, and we open binaries through `/proc/self/fd/N`, so the lookup
//! by build id is done here.
use std::{
    fs::File,
    path::{Component, Path, PathBuf},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use crate::collect::untrusted::{Root, fd_path};

/// Where distributions install debug files (`.build-id/` under each).
const DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

/// Lowercase hex, as `readelf -n` and pprof print build ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The running kernel's GNU build id from /sys/kernel/notes ("" if unreadable).
pub fn kernel_build_id() -> String {
    std::fs::read("/sys/kernel/notes")
        .ok()
        .and_then(|notes| gnu_build_id(&notes))
        .map_or_else(String::new, |id| hex(&id))
}

/// The NT_GNU_BUILD_ID note among ELF notes (4-byte aligned name and descriptor).
fn gnu_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    let word = |b: &[u8], at: usize| -> Option<usize> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let (namesz, descsz, kind) = (word(notes, 0)?, word(notes, 4)?, word(notes, 8)?);
        let name = notes.get(12..12 + namesz)?;
        let desc_at = 12 + pad(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if kind == 3 && name == b"GNU\0" {
            return Some(desc.to_vec());
        }
        notes = notes.get(desc_at + pad(descsz)..)?;
    }
    None
}

/// The separate debug file of a binary, readable at `path` and known to its process as
/// `original`: by build id under the debug dirs, else by the name in its `.gnu_debuglink`
/// where GDB looks: next to the binary, in `.debug/` there, or under /usr/lib/debug plus the
/// binary's directory. A candidate with a build id must carry the binary's. Candidates are
/// opened as files of the process (`untrusted`): the binary and the directory it names are
/// the process's, and a link name is only a file name (a `../` one is ignored).
pub fn find_debug_file(path: &Path, original: &Path, build_id: Option<&[u8]>) -> Option<File> {
    let root = Root::host().ok()?;
    if let Some(found) = build_id.and_then(|id| debug_file(&root, id)) {
        return Some(found);
    }
    let link = debuglink(path)?;
    let mut parts = link.components();
    if !matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    ) {
        return None;
    }
    let dir = original.parent()?;
    let under_debug = Path::new(DEBUG_DIRS[0]).join(dir.strip_prefix("/").unwrap_or(dir));
    [
        dir.join(&link),
        dir.join(".debug").join(&link),
        under_debug.join(&link),
    ]
    .into_iter()
    .filter(|p| p != original)
    .filter_map(|p| root.open(&p).ok())
    .find(|f| match (build_id, elf_facts(f).map(|f| f.1)) {
        (Some(want), Some(Some(have))) => want == have.as_slice(),
        (_, facts) => facts.is_some(), // an ELF file at least
    })
}

/// The file name a binary's `.gnu_debuglink` section names, if it has one.
fn debuglink(path: &Path) -> Option<PathBuf> {
    elf_facts(&File::open(path).ok()?)?.0
}

/// The GNU build id of an ELF file.
pub fn file_build_id(file: &File) -> Option<Vec<u8>> {
    elf_facts(file)?.1
}

/// (`.gnu_debuglink` name, build id) of an ELF file, reading only the parts needed.
fn elf_facts(file: &File) -> Option<(Option<PathBuf>, Option<Vec<u8>>)> {
    use object::Object as _;
    use std::os::unix::ffi::OsStrExt as _;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    let link = elf
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _crc)| PathBuf::from(std::ffi::OsStr::from_bytes(name)));
    let id = elf.build_id().ok().flatten().map(<[u8]>::to_vec);
    Some((link, id))
}

/// The separate debug file for `build_id`, if one is installed.
fn debug_file(root: &Root, build_id: &[u8]) -> Option<File> {
    let (first, rest) = build_id.split_first()?;
    let rel = format!(".build-id/{first:02x}/{}.debug", hex(rest));
    DEBUG_DIRS
        .iter()
        .find_map(|dir| root.open(&Path::new(dir).join(&rel)).ok())
}

/// Names for `offsets` (file offsets in `binary`) from its separate debug file. A debug file
/// made by `objcopy --only-keep-debug` keeps the virtual addresses but not the file layout, so
/// offsets become virtual addresses through `binary`'s own program headers first.
pub fn symbolize_from_debug_file(
    binary: &Path,
    debug_file: &File,
    offsets: &[u64],
) -> Vec<Option<String>> {
    // blazesym opens by path: the one of our handle, so it reads the file checked above.
    let debug = &fd_path(debug_file);
    let Some(segments) = elf_head(binary).and_then(|b| load_segments(&b)) else {
        return vec![None; offsets.len()];
    };
    let vaddrs: Vec<Option<u64>> = offsets
        .iter()
        .map(|&off| {
            segments
                .iter()
                .find(|s| (s.offset..s.offset + s.filesz).contains(&off))
                .map(|s| off - s.offset + s.vaddr)
        })
        .collect();
    let known: Vec<u64> = vaddrs.iter().flatten().copied().collect();
    let symbolizer = Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(false)
        .build();
    // The debug file's symbol table, not its DWARF: names are all we need, and parsing a
    // debug file's DWARF (libc's is 30 MB) costs far more.
    let mut elf = Elf::new(debug);
    elf.debug_syms = false;
    let src = Source::Elf(elf);
    let mut names = match symbolizer.symbolize(&src, Input::VirtOffset(&known)) {
        Ok(results) => results.into_iter().map(|r| match r {
            Symbolized::Sym(sym) => Some(super::demangle::demangle(&sym.name)),
            Symbolized::Unknown(_) => None,
        }),
        Err(e) => {
            log::debug!("{}: cannot symbolize: {e}", debug.display());
            return vec![None; offsets.len()];
        }
    };
    vaddrs
        .iter()
        .map(|v| v.and_then(|_| names.next().flatten()))
        .collect()
}

struct Segment {
    offset: u64,
    filesz: u64,
    vaddr: u64,
}

/// The start of an ELF file, where its program headers are (right after the 64-byte ELF
/// header in practice): reading the whole binary would cost its size in memory.
fn elf_head(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut head = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 << 10)
        .read_to_end(&mut head)
        .ok()?;
    Some(head)
}

/// PT_LOAD segments of a 64-bit little-endian ELF file (the only kind we sample).
fn load_segments(elf: &[u8]) -> Option<Vec<Segment>> {
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u64_at = |at: usize| Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?));
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let (phoff, phentsize, phnum) = (u64_at(0x20)? as usize, u16_at(0x36)?, u16_at(0x38)?);
    (0..usize::from(phnum))
        .map(|i| phoff + i * usize::from(phentsize))
        .filter(|&ph| elf.get(ph..ph + 4) == Some(&1u32.to_le_bytes()[..]))
        .map(|ph| {
            Some(Segment {
                offset: u64_at(ph + 8)?,
                vaddr: u64_at(ph + 16)?,
                filesz: u64_at(ph + 32)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_gnu_note_among_others() {
        let mut notes = Vec::new();
        for (name, kind, desc) in [
            (&b"Xen\0"[..], 1u32, &[9u8, 9, 9][..]),
            (b"GNU\0", 3, &[0xde, 0xad, 0xbe, 0xef, 0x01]),
        ] {
            notes.extend((name.len() as u32).to_ne_bytes());
            notes.extend((desc.len() as u32).to_ne_bytes());
            notes.extend(kind.to_ne_bytes());
            notes.extend(name);
            notes.extend(desc);
            notes.resize(notes.len().div_ceil(4) * 4, 0);
        }
        assert_eq!(hex(&gnu_build_id(&notes).unwrap()), "deadbeef01");
        assert_eq!(gnu_build_id(&notes[..20]), None);
    }

    #[test]
    fn reads_our_own_load_segments() {
        let exe = elf_head(Path::new("/proc/self/exe")).unwrap();
        let segments = load_segments(&exe).unwrap();
        assert!(segments.iter().any(|s| s.filesz > 0));
        assert!(load_segments(b"not an elf").is_none());
    }
}
