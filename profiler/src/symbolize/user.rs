//! User addresses to names: batches of unique file offsets per binary, through blazesym
//! (ELF symbols; DWARF for --inline), then demangled by `demangle`.
use std::path::Path;

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

/// Marks a frame that exists only in DWARF (`--inline`): the code was inlined into its caller.
pub(super) const INLINED_SUFFIX: &str = " (inlined)";

pub(crate) struct UserSymbolizer {
    inner: Symbolizer,
    /// Read DWARF too: only for inlined functions. Names come from the ELF symbol table,
    /// which binaries (and the debug files found by build id) keep; parsing a binary's DWARF
    /// costs many times more, which the always-on agent pays on every new binary.
    dwarf: bool,
}

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
        }
    }

    /// Names for `offsets` (file offsets) in the ELF file at `path`; None where the file has
    /// no symbol (or cannot be read): callers show those as `binary+0xOFFSET`.
    #[cfg(test)]
    pub(crate) fn symbolize_file(&self, path: &Path, offsets: &[u64]) -> Vec<Option<String>> {
        self.symbolize_file_inlined(path, offsets)
            .into_iter()
            .map(|names| names.into_iter().next())
            .collect()
    }

    /// Like `symbolize_file`, but each offset gets its function followed by the functions
    /// inlined there, outermost first, each marked with `INLINED_SUFFIX` (empty: no symbol).
    /// Without `inline` each list has at most one name.
    pub(crate) fn symbolize_file_inlined(&self, path: &Path, offsets: &[u64]) -> Vec<Vec<String>> {
        let mut elf = Elf::new(path);
        elf.debug_syms = self.dwarf;
        let src = Source::Elf(elf);
        match self.inner.symbolize(&src, Input::FileOffset(offsets)) {
            Ok(results) => results
                .into_iter()
                .map(|r| match r {
                    Symbolized::Sym(sym) => std::iter::once(super::demangle::demangle(&sym.name))
                        .chain(sym.inlined.iter().map(|f| {
                            format!("{}{INLINED_SUFFIX}", super::demangle::demangle(&f.name))
                        }))
                        .collect(),
                    Symbolized::Unknown(_) => Vec::new(),
                })
                .collect(),
            Err(e) => {
                log::debug!("{}: cannot symbolize: {e}", path.display());
                vec![Vec::new(); offsets.len()]
            }
        }
    }
}
