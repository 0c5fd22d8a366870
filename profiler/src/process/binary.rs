//! What a binary says of itself, read from its headers only: its GNU build id, the
//! `.gnu_debuglink` name of its separate debug file, and that debug file, found by build id
//! (`/usr/lib/debug/.build-id/xx/yyyy.debug`) or by link name where GDB looks. The collector
//! asks for the build id of each newly mapped binary (`files`), the unwinder and the
//! symbolizer for debug files.
use std::{
    fs::File,
    path::{Component, Path, PathBuf},
};

use super::untrusted::Root;
use crate::util::hex;

/// Where distributions install debug files (`.build-id/` under each).
const DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

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

/// Whether a mapped file's name may be a CPython interpreter: `python*` or `libpython*.so*`.
/// A process none of whose executable mappings is so named is not read as Python
/// (`python::Tracker::saw` with `maybe_python` false).
pub(crate) fn interpreter_named(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    (base.starts_with("libpython") && base.contains(".so")) || base.starts_with("python")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let dir = tempfile::Builder::new()
            .prefix("elf-facts-test-")
            .tempdir()
            .unwrap();
        let mut bytes = std::fs::read("/bin/true").unwrap();
        bytes[0x28..0x30].fill(0); // e_shoff
        bytes[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
        let no_sections = dir.path().join("true-no-sections");
        std::fs::write(&no_sections, &bytes).unwrap();
        let facts = elf_facts(&File::open(&no_sections).unwrap()).unwrap();
        assert_eq!(facts, (None, true_id));
        let not_elf = dir.path().join("not-elf");
        std::fs::write(&not_elf, b"not an elf").unwrap();
        assert_eq!(elf_facts(&File::open(&not_elf).unwrap()), None);
        eprintln!("{with_link} of 3 with a .gnu_debuglink");
    }
}
