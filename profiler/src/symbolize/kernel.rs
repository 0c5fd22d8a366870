//! Kernel addresses to names, from /proc/kallsyms (vmlinux and module symbols).
use std::io;

/// A sorted table of kernel text symbols.
pub struct KernelSymbols {
    /// (start address, name, module or "" for vmlinux), sorted by address.
    syms: Vec<(u64, String, String)>,
    /// kptr_restrict hides the addresses (they read as 0): names would be wrong, so none.
    hidden: bool,
}

/// A resolved kernel frame.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelSym<'a> {
    pub name: &'a str,
    /// "vmlinux" or the module's name.
    pub module: &'a str,
}

impl KernelSymbols {
    pub fn load() -> io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string("/proc/kallsyms")?))
    }

    /// Parses kallsyms text: `ADDR TYPE NAME [MODULE]`, keeping text symbols only.
    pub fn parse(text: &str) -> Self {
        let mut syms = Vec::new();
        let mut nonzero = false;
        for line in text.lines() {
            let mut it = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            nonzero |= addr != 0;
            let module = it
                .next()
                .map_or("", |m| m.trim_start_matches('[').trim_end_matches(']'));
            syms.push((addr, name.to_owned(), module.to_owned()));
        }
        syms.sort_by_key(|s| s.0);
        let hidden = !nonzero;
        if hidden {
            syms.clear();
        }
        Self { syms, hidden }
    }

    /// True when kptr_restrict hides kernel addresses from us.
    pub fn hidden(&self) -> bool {
        self.hidden
    }

    /// The symbol containing `addr` (the closest start at or below it).
    pub fn lookup(&self, addr: u64) -> Option<KernelSym<'_>> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (_, name, module) = &self.syms[i];
        Some(KernelSym {
            name,
            module: if module.is_empty() { "vmlinux" } else { module },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 t do_one_initcall
ffffffff81002000 D some_data
ffffffff81003000 T __x64_sys_read
ffffffffc0001000 t e1000_clean\t[e1000]
ffffffffc0002000 W weak_thing\t[e1000]
";

    #[test]
    fn finds_the_enclosing_text_symbol() {
        let k = KernelSymbols::parse(TEXT);
        assert!(!k.hidden());
        assert_eq!(
            k.lookup(0xffffffff81001fff).unwrap().name,
            "do_one_initcall"
        );
        // Data symbols are skipped: this address belongs to the text symbol before it.
        assert_eq!(
            k.lookup(0xffffffff81002500).unwrap().name,
            "do_one_initcall"
        );
        assert_eq!(k.lookup(0xffffffff81003000).unwrap().name, "__x64_sys_read");
        assert_eq!(
            k.lookup(0xffffffffc0001010),
            Some(KernelSym {
                name: "e1000_clean",
                module: "e1000"
            })
        );
        assert_eq!(k.lookup(0xffffffff81003001).unwrap().module, "vmlinux");
        assert_eq!(k.lookup(0x1000), None);
    }

    #[test]
    fn restricted_kallsyms_is_detected() {
        let k = KernelSymbols::parse("0000000000000000 T _stext\n0000000000000000 t foo\n");
        assert!(k.hidden());
        assert_eq!(k.lookup(0xffffffff81000000), None);
    }
}
