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

use crate::{
    collect::untrusted::{Root, fd_path},
    util::hex,
};

/// Where distributions install debug files (`.build-id/` under each).
const DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

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

/// The separate debug file of a binary, readable at `path` and known to its process as
/// `original`: by build id under the debug dirs, else by the name in its `.gnu_debuglink`
/// where GDB looks: next to the binary, in `.debug/` there, or under /usr/lib/debug plus the
/// binary's directory. A candidate with a build id must carry the binary's. Candidates are
/// opened as files of the process (`untrusted`): the binary and the directory it names are
/// the process's, and a link name is only a file name (a `../` one is ignored).
pub(crate) fn find_debug_file(
    path: &Path,
    original: &Path,
    build_id: Option<&[u8]>,
) -> Option<File> {
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
pub(crate) fn file_build_id(file: &File) -> Option<Vec<u8>> {
    elf_facts(file)?.1
}

/// (`.gnu_debuglink` name, build id) of an ELF file, reading only the parts needed: the
/// headers, section names and notes. Not `object::File::parse`, which reads the whole symbol
/// table first: the drain asks this of every newly mapped binary (a busy build machine maps
/// a new one every few seconds), and a test binary's symbols are megabytes.
fn elf_facts(file: &File) -> Option<(Option<PathBuf>, Option<Vec<u8>>)> {
    use object::{FileKind, elf, read::elf::FileHeader as _};
    let cache = object::ReadCache::new(file);
    match FileKind::parse(&cache).ok()? {
        FileKind::Elf32 => elf::FileHeader32::<object::Endianness>::parse(&cache)
            .ok()
            .and_then(|h| facts_of(h, &cache)),
        FileKind::Elf64 => elf::FileHeader64::<object::Endianness>::parse(&cache)
            .ok()
            .and_then(|h| facts_of(h, &cache)),
        _ => None,
    }
}

/// `elf_facts` of a parsed header: the build id from the notes of the sections (of the
/// segments when there are no section headers), as `object::Object::build_id` finds it.
fn facts_of<'d, Elf, R>(header: &Elf, data: R) -> Option<(Option<PathBuf>, Option<Vec<u8>>)>
where
    Elf: object::read::elf::FileHeader<Endian = object::Endianness>,
    R: object::ReadRef<'d>,
{
    use object::{
        elf,
        read::elf::{ProgramHeader as _, SectionHeader as _},
    };
    use std::os::unix::ffi::OsStrExt as _;
    let endian = header.endian().ok()?;
    let headers = header.section_headers(endian, data).ok()?;
    // The section names read at once: looked up in the file, each name is a read of its own.
    let names = header
        .section_strings_index(endian, data)
        .ok()
        .and_then(|i| headers.get(i.0))
        .and_then(|s| s.data(endian, data).ok())
        .unwrap_or_default();
    let sections = object::read::elf::SectionTable::<Elf, &[u8]>::new(
        headers,
        object::read::StringTable::new(names, 0, names.len() as u64),
    );
    let gnu_build_id = |note: object::read::elf::Note<'d, Elf>| {
        (note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID)
            .then(|| note.desc().to_vec())
    };
    let mut id = None;
    if sections.is_empty() {
        for segment in header.program_headers(endian, data).ok()? {
            let Ok(Some(mut notes)) = segment.notes(endian, data) else {
                continue;
            };
            while let (None, Ok(Some(note))) = (&id, notes.next()) {
                id = gnu_build_id(note);
            }
        }
    } else {
        for section in sections.iter() {
            let Ok(Some(mut notes)) = section.notes(endian, data) else {
                continue;
            };
            while let (None, Ok(Some(note))) = (&id, notes.next()) {
                id = gnu_build_id(note);
            }
        }
    }
    let link = sections
        .section_by_name(endian, b".gnu_debuglink")
        .and_then(|(_, s)| s.data(endian, data).ok())
        .and_then(|d| d.split(|&b| b == 0).next())
        .map(|name| PathBuf::from(std::ffi::OsStr::from_bytes(name)));
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

    /// What `object` reads parsing the whole file, for comparison with `elf_facts`.
    fn facts_by_full_parse(path: &Path) -> (Option<PathBuf>, Option<Vec<u8>>) {
        use object::Object as _;
        use std::os::unix::ffi::OsStrExt as _;
        let bytes = std::fs::read(path).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let link = elf.gnu_debuglink().unwrap();
        (
            link.map(|(n, _)| PathBuf::from(std::ffi::OsStr::from_bytes(n))),
            elf.build_id().unwrap().map(<[u8]>::to_vec),
        )
    }

    #[test]
    fn elf_facts_read_what_a_full_parse_reads() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libc.so"))
            .expect("libc mapped in a test binary");
        let mut with_link = 0;
        for path in ["/proc/self/exe", "/bin/true", libc] {
            let ours = elf_facts(&File::open(path).unwrap()).unwrap();
            assert_eq!(ours, facts_by_full_parse(Path::new(path)), "{path}");
            with_link += usize::from(ours.0.is_some());
        }
        let true_id = facts_by_full_parse(Path::new("/bin/true")).1;
        assert!(true_id.is_some(), "/bin/true has a build id");
        // Without section headers, the build id is found through the program headers.
        let dir = std::env::temp_dir().join(format!("elf-facts-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = std::fs::read("/bin/true").unwrap();
        bytes[0x28..0x30].fill(0); // e_shoff
        bytes[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
        let no_sections = dir.join("true-no-sections");
        std::fs::write(&no_sections, &bytes).unwrap();
        let facts = elf_facts(&File::open(&no_sections).unwrap()).unwrap();
        assert_eq!(facts, (None, true_id));
        let not_elf = dir.join("not-elf");
        std::fs::write(&not_elf, b"not an elf").unwrap();
        assert_eq!(elf_facts(&File::open(&not_elf).unwrap()), None);
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("{with_link} of 3 with a .gnu_debuglink");
    }

    #[test]
    fn reads_our_own_load_segments() {
        let segments = load_segments(&File::open("/proc/self/exe").unwrap()).unwrap();
        assert!(segments.iter().any(|s| s.filesz > 0));
        let dir = std::env::temp_dir().join(format!("debuginfo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_elf = dir.join("not-elf");
        std::fs::write(&not_elf, b"not an elf").unwrap();
        assert!(load_segments(&File::open(&not_elf).unwrap()).is_none());
        let _ = std::fs::remove_dir_all(&dir);
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
        let dir = std::env::temp_dir().join(format!("debuginfo-far-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for phoff in [64, 0x1_1000] {
            let path = dir.join(format!("phoff-{phoff:x}"));
            std::fs::write(&path, elf64_with_phdr_at(phoff)).unwrap();
            let segments = load_segments(&File::open(&path).unwrap())
                .unwrap_or_else(|| panic!("no segments with phoff {phoff:#x}"));
            let got: Vec<(u64, u64, u64)> = segments
                .iter()
                .map(|s| (s.offset, s.filesz, s.vaddr))
                .collect();
            assert_eq!(got, [(0x1000, 0x2000, 0x40_1000)], "phoff {phoff:#x}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
