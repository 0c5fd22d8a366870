//! The user stage: names for file offsets, in batches of unique offsets per binary, through
//! blazesym (ELF symbols; DWARF for --inline), then demangled by `demangle`; a stripped
//! binary's names come from its debug file (`debuginfo`).
use std::{cell::RefCell, collections::HashMap, fs::File, path::Path};

use blazesym::symbolize::{
    Input, Reason, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use super::{NameCache, Names, Unknown, debuginfo};
use crate::process::{ProcessFacts, UserFile, UserLoc};

/// Marks a frame that exists only in DWARF (`--inline`): the code was inlined into its caller.
pub(super) const INLINED_SUFFIX: &str = " (inlined)";

pub(crate) struct UserSymbolizer {
    inner: Symbolizer,
    /// Read DWARF too: only for inlined functions. Names come from the ELF symbol table,
    /// which binaries (and the debug files found by build id) keep; parsing a binary's DWARF
    /// costs many times more, which the always-on agent pays on every new binary.
    dwarf: bool,
    /// Separate debug files (stripped binaries' names), each parsed once for as long as this
    /// symbolizer lives: `debug_files` keeps every one open, so blazesym's cache, keyed by
    /// path, finds it under the same /proc/self/fd path in every window.
    debug: Symbolizer,
    debug_files: RefCell<HashMap<(u64, u64), File>>,
}

/// Debug files kept open and parsed at most; past it the cache starts afresh.
const MAX_DEBUG_FILES: usize = 64;

impl Default for UserSymbolizer {
    fn default() -> Self {
        Self::new(false)
    }
}

impl UserSymbolizer {
    /// `inline`: also report the functions inlined at each address (from DWARF). Off by
    /// default: line info and inline trees cost time and memory.
    pub(crate) fn new(inline: bool) -> Self {
        Self {
            // blazesym's demangler would turn C names like `a` into C++ types: we demangle.
            // Inlined functions need code info (blazesym reads them from the line program).
            inner: Symbolizer::builder()
                .enable_code_info(inline)
                .enable_inlined_fns(inline)
                .enable_demangling(false)
                .build(),
            dwarf: inline,
            debug: debuginfo::symbolizer(),
            debug_files: RefCell::default(),
        }
    }

    /// Names for `offsets` (file offsets in `binary`) from the debug file `found` (just
    /// opened), through the copy of it kept open since the first window that needed it.
    fn debug_names(&self, binary: &Path, found: File, offsets: &[u64]) -> Vec<Option<String>> {
        use std::os::unix::fs::MetadataExt as _;
        let Ok(meta) = found.metadata() else {
            return vec![None; offsets.len()];
        };
        let mut files = self.debug_files.borrow_mut();
        if files.len() >= MAX_DEBUG_FILES && !files.contains_key(&(meta.dev(), meta.ino())) {
            // The parsed files stay in `debug` under paths that may now name others.
            return debuginfo::symbolize_from_debug_file(
                &debuginfo::symbolizer(),
                binary,
                &found,
                offsets,
            );
        }
        let kept = files.entry((meta.dev(), meta.ino())).or_insert(found);
        debuginfo::symbolize_from_debug_file(&self.debug, binary, kept, offsets)
    }

    /// The function names of `offsets` (file offsets) in the ELF file at `path`; None where
    /// there is none.
    #[cfg(test)]
    pub(crate) fn symbolize_file(&self, path: &Path, offsets: &[u64]) -> Vec<Option<String>> {
        self.symbolize_file_inlined(path, offsets)
            .into_iter()
            .map(|names| names.ok().and_then(|n| n.into_iter().next()))
            .collect()
    }

    /// Names for `offsets` (file offsets) in the ELF file at `path`: each offset's function
    /// followed by the functions inlined there, outermost first, each marked with
    /// `INLINED_SUFFIX` (only with `inline`), or why there is none.
    pub(crate) fn symbolize_file_inlined(&self, path: &Path, offsets: &[u64]) -> Vec<Names> {
        let mut elf = Elf::new(path);
        elf.debug_syms = self.dwarf;
        let src = Source::Elf(elf);
        match self.inner.symbolize(&src, Input::FileOffset(offsets)) {
            Ok(results) => results
                .into_iter()
                .map(|r| match r {
                    Symbolized::Sym(sym) => {
                        Ok(std::iter::once(super::demangle::demangle(&sym.name))
                            .chain(sym.inlined.iter().map(|f| {
                                format!("{}{INLINED_SUFFIX}", super::demangle::demangle(&f.name))
                            }))
                            .collect())
                    }
                    Symbolized::Unknown(reason) => Err(unknown_of(reason)),
                })
                .collect(),
            Err(e) => {
                log::debug!("{}: cannot symbolize: {e}", path.display());
                vec![Err(Unknown::Unreadable); offsets.len()]
            }
        }
    }
}

/// Our reason for blazesym's: an offset outside the file's loaded segments was never code
/// we knew; the rest mean the file has no symbol there.
fn unknown_of(reason: Reason) -> Unknown {
    match reason {
        Reason::InvalidFileOffset | Reason::Unmapped => Unknown::NotMapped,
        Reason::MissingComponent | Reason::Unsupported => Unknown::Unreadable,
        _ => Unknown::NoSymbol,
    }
}

/// The user stage over a window: names for every (file, offset) `facts` locates and `names`
/// lacks, one blazesym batch per file; names found are added to `names`.
pub(crate) fn symbolize_user(facts: &ProcessFacts, user: &UserSymbolizer, names: &mut NameCache) {
    let mut per_file: HashMap<u32, Vec<u64>> = HashMap::new();
    for loc in facts.locs.values() {
        if let UserLoc::File { file, offset } = *loc
            && !names.contains_key(&(file, offset))
        {
            per_file.entry(file).or_default().push(offset);
        }
    }
    for (file, mut offsets) in per_file {
        offsets.sort_unstable();
        offsets.dedup();
        let f = &facts.files[file as usize];
        let (path, _opened) = match f.readable_path() {
            Ok(p) => p,
            Err(e) => {
                log::debug!("{}: not symbolized: {e}", f.path.display());
                names.extend(
                    offsets
                        .iter()
                        .map(|&o| ((file, o), Err(Unknown::Unreadable))),
                );
                continue;
            }
        };
        let mut found = user.symbolize_file_inlined(&path, &offsets);
        debug_file_names(user, f, &path, &offsets, &mut found);
        for (offset, name) in offsets.iter().zip(found) {
            names.insert((file, *offset), name);
        }
    }
}

/// Fills in the offsets `found` has no symbol for from the file's separate debug file, found
/// by build id or `.gnu_debuglink` (stripped binaries).
fn debug_file_names(
    user: &UserSymbolizer,
    f: &UserFile,
    path: &Path,
    offsets: &[u64],
    found: &mut [Names],
) {
    let missing: Vec<usize> = (0..offsets.len()).filter(|&i| found[i].is_err()).collect();
    if missing.is_empty() {
        return;
    }
    let Some(debug) = crate::process::find_debug_file(path, &f.path, f.build_id.as_deref()) else {
        return;
    };
    let wanted: Vec<u64> = missing.iter().map(|&i| offsets[i]).collect();
    let named = user.debug_names(path, debug, &wanted);
    for (i, name) in missing.into_iter().zip(named) {
        if let Some(name) = name {
            found[i] = Ok(vec![name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file offset of libc's `malloc`, from its dynamic symbols and load segments.
    fn malloc_offset(libc: &[u8]) -> u64 {
        use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
        let elf = object::File::parse(libc).unwrap();
        let vaddr = elf
            .dynamic_symbols()
            .find(|s| s.name() == Ok("malloc"))
            .expect("libc exports malloc")
            .address();
        elf.segments()
            .find_map(|s| {
                let (off, size) = s.file_range();
                (s.address()..s.address() + size)
                    .contains(&vaddr)
                    .then(|| vaddr - s.address() + off)
            })
            .expect("malloc in a load segment")
    }

    /// A debug file found anew in every window is parsed once: the first copy stays open and
    /// answers for the later ones (and the names are the same).
    #[test]
    fn debug_files_are_kept_across_windows() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let data = std::fs::read(libc).unwrap();
        let id = crate::process::file_build_id(&File::open(libc).unwrap());
        let open = || {
            crate::process::find_debug_file(libc, libc, id.as_deref())
                .expect("libc's debug file (cargo xtask setup installs it)")
        };
        let user = UserSymbolizer::default();
        let offset = malloc_offset(&data);
        let first = user.debug_names(libc, open(), &[offset]);
        let second = user.debug_names(libc, open(), &[offset]);
        assert_eq!(first, second);
        assert!(
            first[0].as_deref().is_some_and(|n| n.contains("malloc")),
            "{first:?}"
        );
        assert_eq!(user.debug_files.borrow().len(), 1);
    }
}
