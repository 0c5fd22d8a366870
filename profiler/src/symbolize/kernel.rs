//! Kernel addresses to names, from /proc/kallsyms (vmlinux and module symbols).
use std::io::{self, BufRead};

/// A sorted table of kernel text symbols, packed: the agent keeps it for its whole life, and
/// 120k symbols as separate Strings cost about 12 MB of heap where this costs about 5 MB.
pub struct KernelSymbols {
    /// (start address, end of its name in `names`, index into `modules`), sorted by address.
    syms: Vec<(u64, u32, u16)>,
    /// Every name, back to back; a name starts where the previous one ends.
    names: String,
    /// Module names; index 0 is vmlinux.
    modules: Vec<String>,
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
    pub(crate) fn load() -> io::Result<Self> {
        // Line by line: the whole text is 5 MB the heap would keep afterwards.
        Self::read(io::BufReader::new(std::fs::File::open("/proc/kallsyms")?))
    }

    /// Parses kallsyms text: `ADDR TYPE NAME [MODULE]`, keeping text symbols only.
    pub fn parse(text: &str) -> Self {
        Self::read(text.as_bytes()).expect("reading from memory cannot fail")
    }

    fn read(mut input: impl BufRead) -> io::Result<Self> {
        // (address, name range, module) in file order; sorted once at the end.
        let mut unsorted: Vec<(u64, u32, u32, u16)> = Vec::new();
        let mut names = String::new();
        let mut modules = vec!["vmlinux".to_owned()];
        let mut nonzero = false;
        let mut line = String::new();
        while input.read_line(&mut line)? != 0 {
            let mut it = line.split_ascii_whitespace();
            if let (Some(addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next())
                && matches!(kind, "t" | "T" | "w" | "W")
                && let Ok(addr) = u64::from_str_radix(addr, 16)
            {
                nonzero |= addr != 0;
                let module = match it.next() {
                    None => 0,
                    Some(m) => {
                        let m = m.trim_start_matches('[').trim_end_matches(']');
                        // Module symbols come grouped, so the last module is almost always it.
                        match modules.iter().rposition(|known| known == m) {
                            Some(i) => i,
                            None => {
                                modules.push(m.to_owned());
                                modules.len() - 1
                            }
                        }
                    }
                };
                let from = names.len() as u32;
                names.push_str(name);
                unsorted.push((addr, from, names.len() as u32, module as u16));
            }
            line.clear();
        }
        unsorted.sort_unstable_by_key(|s| s.0);
        let hidden = !nonzero;
        if hidden {
            unsorted.clear();
            names.clear();
        }
        // Names re-laid in address order, so each one ends where the next one starts.
        let mut packed = String::with_capacity(names.len());
        let syms = unsorted
            .iter()
            .map(|&(addr, from, to, module)| {
                packed.push_str(&names[from as usize..to as usize]);
                (addr, packed.len() as u32, module)
            })
            .collect();
        Ok(Self {
            syms,
            names: packed,
            modules,
            hidden,
        })
    }

    /// True when kptr_restrict hides kernel addresses from us.
    pub(crate) fn hidden(&self) -> bool {
        self.hidden
    }

    /// The kernel stage: the symbol containing `addr`, or why there is none.
    pub(crate) fn resolve(&self, addr: u64) -> Result<KernelSym<'_>, super::Unknown> {
        match self.lookup(addr) {
            Some(sym) => Ok(sym),
            None if self.hidden => Err(super::Unknown::KernelHidden),
            None => Err(super::Unknown::NoKernelSymbol),
        }
    }

    /// The symbol containing `addr` (the closest start at or below it).
    pub fn lookup(&self, addr: u64) -> Option<KernelSym<'_>> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let from = i.checked_sub(1).map_or(0, |p| self.syms[p].1 as usize);
        let (_, to, module) = self.syms[i];
        Some(KernelSym {
            name: &self.names[from..to as usize],
            module: &self.modules[usize::from(module)],
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
