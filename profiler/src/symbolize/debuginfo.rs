//! Names from separate debug files (found by `process::find_debug_file`) for binaries that
//! have no symbols of their own, and the running kernel's build id for pprof mappings.
//!
//! blazesym only follows a build id when the binary also has a `.gnu_debuglink`; a plain
//! `strip`ped binary has none, and we open binaries through `/proc/self/fd/N`, so the lookup
//! by build id is ours.
use std::{fs::File, path::Path};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use crate::{process::untrusted::fd_path, util::hex};

/// The running kernel's GNU build id from /sys/kernel/notes ("" if unreadable).
pub(super) fn kernel_build_id() -> String {
    std::fs::read("/sys/kernel/notes")
        .ok()
        .and_then(|notes| gnu_build_id(&notes))
        .map_or_else(String::new, |id| hex(&id))
}

/// The NT_GNU_BUILD_ID note among ELF notes (as /sys/kernel/notes holds them).
fn gnu_build_id(notes: &[u8]) -> Option<Vec<u8>> {
    use object::{NativeEndian, elf, read::elf::NoteIterator};
    let mut notes =
        NoteIterator::<elf::FileHeader64<NativeEndian>>::new(NativeEndian, 4, notes).ok()?;
    while let Ok(Some(note)) = notes.next() {
        if note.n_type(NativeEndian) == elf::NT_GNU_BUILD_ID && note.name() == elf::ELF_NOTE_GNU {
            return Some(note.desc().to_vec());
        }
    }
    None
}

/// A symbolizer for debug files: names from their symbol tables only.
pub(super) fn symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(false)
        .build()
}

/// Names for `offsets` (file offsets in `binary`) from its separate debug file, through
/// `symbolizer` (`symbolizer()`, which keeps what it parsed). A debug file made by
/// `objcopy --only-keep-debug` keeps the virtual addresses but not the file layout, so
/// offsets become virtual addresses through `binary`'s own program headers first.
pub(super) fn symbolize_from_debug_file(
    symbolizer: &Symbolizer,
    binary: &Path,
    debug_file: &File,
    offsets: &[u64],
) -> Vec<Option<String>> {
    // blazesym opens by path: the one of our handle, so it reads the file checked above.
    let debug = &fd_path(debug_file);
    let Some(segments) = File::open(binary).ok().and_then(|f| load_segments(&f)) else {
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

/// PT_LOAD segments of an ELF file (32- or 64-bit, either byte order; the program headers
/// wherever they are), reading only the headers, not the whole binary.
fn load_segments(file: &File) -> Option<Vec<Segment>> {
    use object::{Object as _, ObjectSegment as _};
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    if elf.format() != object::BinaryFormat::Elf {
        return None;
    }
    // object's segments of an ELF file are its PT_LOAD program headers.
    Some(
        elf.segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                Segment {
                    offset,
                    filesz,
                    vaddr: s.address(),
                }
            })
            .collect(),
    )
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
        let segments = load_segments(&File::open("/proc/self/exe").unwrap()).unwrap();
        assert!(segments.iter().any(|s| s.filesz > 0));
        let dir = tempfile::Builder::new()
            .prefix("debuginfo-test-")
            .tempdir()
            .unwrap();
        let not_elf = dir.path().join("not-elf");
        std::fs::write(&not_elf, b"not an elf").unwrap();
        assert!(load_segments(&File::open(&not_elf).unwrap()).is_none());
    }

    /// A 64-bit ELF header whose one program header (PT_LOAD) sits at `phoff`.
    fn elf64_with_phdr_at(phoff: usize) -> Vec<u8> {
        let mut elf = vec![0u8; phoff + 56];
        elf[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\x00");
        let put = |elf: &mut Vec<u8>, at: usize, bytes: &[u8]| {
            elf[at..at + bytes.len()].copy_from_slice(bytes);
        };
        put(&mut elf, 0x10, &2u16.to_le_bytes()); // ET_EXEC
        put(&mut elf, 0x12, &62u16.to_le_bytes()); // EM_X86_64
        put(&mut elf, 0x14, &1u32.to_le_bytes()); // EV_CURRENT
        put(&mut elf, 0x20, &(phoff as u64).to_le_bytes());
        put(&mut elf, 0x34, &64u16.to_le_bytes()); // e_ehsize
        put(&mut elf, 0x36, &56u16.to_le_bytes()); // e_phentsize
        put(&mut elf, 0x38, &1u16.to_le_bytes()); // e_phnum
        put(&mut elf, phoff, &1u32.to_le_bytes()); // PT_LOAD
        put(&mut elf, phoff + 4, &5u32.to_le_bytes()); // R+X
        put(&mut elf, phoff + 8, &0x1000u64.to_le_bytes()); // p_offset
        put(&mut elf, phoff + 16, &0x40_1000u64.to_le_bytes()); // p_vaddr
        put(&mut elf, phoff + 24, &0x40_1000u64.to_le_bytes()); // p_paddr
        put(&mut elf, phoff + 32, &0x2000u64.to_le_bytes()); // p_filesz
        put(&mut elf, phoff + 40, &0x2000u64.to_le_bytes()); // p_memsz
        put(&mut elf, phoff + 48, &0x1000u64.to_le_bytes()); // p_align
        elf
    }

    /// The hand parser read only the first 64 KiB and skipped program headers past it: the
    /// binary's offsets then never became addresses, and its frames stayed unknown.
    #[test]
    fn program_headers_past_64_kib_are_read() {
        let dir = tempfile::Builder::new()
            .prefix("debuginfo-far-")
            .tempdir()
            .unwrap();
        for phoff in [64, 0x1_1000] {
            let path = dir.path().join(format!("phoff-{phoff:x}"));
            std::fs::write(&path, elf64_with_phdr_at(phoff)).unwrap();
            let segments = load_segments(&File::open(&path).unwrap())
                .unwrap_or_else(|| panic!("no segments with phoff {phoff:#x}"));
            let got: Vec<(u64, u64, u64)> = segments
                .iter()
                .map(|s| (s.offset, s.filesz, s.vaddr))
                .collect();
            assert_eq!(got, [(0x1000, 0x2000, 0x40_1000)], "phoff {phoff:#x}");
        }
    }
}
