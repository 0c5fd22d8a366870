//! Third stage: turn raw addresses into named frames and build the profile model from what
//! the collect stage handed on. Two stages with one contract: kernel addresses through
//! kallsyms (`kernel`), user file offsets through blazesym (`user`), each unique address
//! once, each giving names or `Unknown(reason)`; `build` consumes a `Collected` and renders
//! every frame, unknown ones only through `unknown_name`.
mod build;
mod debuginfo;
mod demangle;
mod kernel;
mod symbolizer;
mod user;

use std::collections::HashMap;

use build::build_profile;

pub(crate) use kernel::KernelSym;
pub use kernel::KernelSymbols;
pub(crate) use symbolizer::Symbolizer;
pub(crate) use user::UserSymbolizer;

use crate::profile::UNKNOWN_FRAME;

/// The module of frames named by a perf map (JIT code has no file).
pub(crate) const JIT_MODULE: &str = "[jit]";

/// Why a frame has no name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Unknown {
    /// The address was in no mapping of its process that the collector knew.
    NotMapped,
    /// The file has no symbol there (stripped, and no debug file found).
    NoSymbol,
    /// The file could not be opened or parsed (gone, not a regular file, outside the
    /// process's root).
    Unreadable,
    /// No kernel symbol covers the address.
    NoKernelSymbol,
    /// kallsyms hides kernel addresses from us (kptr_restrict).
    KernelHidden,
    /// A Python frame the walk could not read, or whose code object was not named.
    Python,
}

/// What the stages give for one address: its function, then (with `--inline`) the
/// functions inlined there, outermost first, never empty; or why there is no name.
pub(crate) type Names = Result<Vec<String>, Unknown>;

/// User frame names by (file id in the collection's process table, file offset), kept by the
/// `Symbolizer` across spans and cleared whenever the process table's file ids are reset.
pub(crate) type NameCache = HashMap<(u32, u64), Names>;

/// The one rendering of a frame without a name. A frame in a known file keeps where it is
/// (`libfoo.so+0x1234`), so whoever has the binary can still name it; the others say what
/// they are.
pub(crate) fn unknown_name(why: Unknown, file: Option<(&str, u64)>) -> String {
    match (why, file) {
        (Unknown::KernelHidden, _) => "[kernel]".to_owned(),
        (Unknown::Python, _) => "[unknown python]".to_owned(),
        (_, Some((base, offset))) => format!("{base}+{offset:#x}"),
        _ => UNKNOWN_FRAME.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_frames_keep_their_file_and_offset() {
        assert_eq!(
            unknown_name(Unknown::NoSymbol, Some(("libx.so", 0x1234))),
            "libx.so+0x1234"
        );
        assert_eq!(unknown_name(Unknown::Unreadable, Some(("x", 16))), "x+0x10");
        assert_eq!(unknown_name(Unknown::NotMapped, None), UNKNOWN_FRAME);
        assert_eq!(unknown_name(Unknown::KernelHidden, None), "[kernel]");
        assert_eq!(unknown_name(Unknown::NoKernelSymbol, None), UNKNOWN_FRAME);
    }
}
