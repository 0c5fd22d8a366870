//! Mangled Rust and C++ symbol names to readable ones. Only names that carry a mangling
//! prefix are touched: a plain C name such as `a` or `c` is a valid C++ *type* encoding
//! ("signed char", "char"), which a demangler asked blindly would happily return.

/// Readable form of `name`; unchanged if it is not mangled.
pub(super) fn demangle(name: &str) -> String {
    // Rust v0 (`_R`) and legacy (`_ZN...17h<hash>E`) manglings; legacy names without a hash
    // suffix are C++ names and fall through.
    if (name.starts_with("_R") || name.starts_with("_ZN"))
        && let Ok(d) = rustc_demangle::try_demangle(name)
    {
        // `{:#}` drops the hash suffix, as perf and inferno show Rust names.
        return format!("{d:#}");
    }
    let options = cpp_demangle::DemangleOptions::new()
        .no_params()
        .no_return_type();
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name)
        && let Ok(d) = sym.demangle_with_options(&options)
    {
        return d;
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn plain_c_names_stay() {
        for n in ["a", "b", "c", "main", "read", "i", "_start"] {
            assert_eq!(demangle(n), n);
        }
    }

    #[test]
    fn rust_names() {
        assert_eq!(
            demangle("_ZN12fixture_rust10rust_inner17h1b3a9f2c4d5e6f70E"),
            "fixture_rust::rust_inner"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
    }

    #[test]
    fn cpp_names_lose_their_parameters() {
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back"
        );
    }
}
