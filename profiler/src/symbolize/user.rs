//! User addresses to names: batches of unique file offsets per binary, through blazesym
//! (ELF symbols, DWARF where present), then demangled by `demangle`.
use std::path::Path;

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

pub struct UserSymbolizer {
    inner: Symbolizer,
}

impl Default for UserSymbolizer {
    fn default() -> Self {
        Self {
            // Names only: line info and inlined frames cost time and memory we do not use yet.
            // blazesym's demangler would turn C names like `a` into C++ types: we demangle.
            inner: Symbolizer::builder()
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .enable_demangling(false)
                .build(),
        }
    }
}

impl UserSymbolizer {
    /// Names for `offsets` (file offsets) in the ELF file at `path`; None where the file has
    /// no symbol (or cannot be read): callers show those as `binary+0xOFFSET`.
    pub fn symbolize_file(&self, path: &Path, offsets: &[u64]) -> Vec<Option<String>> {
        let src = Source::Elf(Elf::new(path));
        match self.inner.symbolize(&src, Input::FileOffset(offsets)) {
            Ok(results) => results
                .into_iter()
                .map(|r| match r {
                    Symbolized::Sym(sym) => Some(super::demangle::demangle(&sym.name)),
                    Symbolized::Unknown(_) => None,
                })
                .collect(),
            Err(e) => {
                log::debug!("{}: cannot symbolize: {e}", path.display());
                vec![None; offsets.len()]
            }
        }
    }
}
