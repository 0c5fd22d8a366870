//! Kernel addresses to names, from /proc/kallsyms (vmlinux and module symbols).
use std::{
    io::{self, BufRead, Read as _},
    sync::{Arc, Mutex},
};

use flate2::{Compress, Compression, FlushCompress, Status, read::DeflateDecoder};

use crate::util::FxMap;

/// Symbols whose names are deflated together (about 1.6 KB of names; 10-17 us to inflate).
const BLOCK: usize = 64;
/// Names kept inflated at most; beyond, the cache starts afresh (a running kernel's hot
/// paths are a few thousand functions).
const MAX_CACHED: usize = 1 << 16;

/// A sorted table of kernel text symbols, packed: the agent keeps it for its whole life.
/// 120k symbols cost about 12 MB of heap as separate Strings, 5 MB as one string of names
/// with a 16-byte entry each, and about 1.8 MB here: 8 bytes of address each, the names
/// deflated in blocks of `BLOCK` (4 times smaller), each inflated at its first lookup and
/// kept (tens of microseconds once, well under one after). Deflating adds a little under
/// half to the load's parsing time.
pub struct KernelSymbols {
    /// Start address of each text symbol, sorted.
    addrs: Vec<u64>,
    /// Names of symbols `[BLOCK * i, BLOCK * (i + 1))`, NUL-separated, deflated.
    blocks: Vec<Box<[u8]>>,
    /// (first symbol, index into `modules`) of each run of one module's symbols.
    module_runs: Vec<(u32, u16)>,
    /// Module names; index 0 is vmlinux.
    modules: Vec<String>,
    /// kptr_restrict hides the addresses (they read as 0): names would be wrong, so none.
    hidden: bool,
    /// Names looked up so far, by symbol index.
    names: Mutex<FxMap<u32, Arc<str>>>,
}

/// A resolved kernel frame.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelSym<'a> {
    pub name: Arc<str>,
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
        }
        let mut module_runs: Vec<(u32, u16)> = Vec::new();
        for (i, s) in unsorted.iter().enumerate() {
            if module_runs.last().is_none_or(|r| r.1 != s.3) {
                module_runs.push((i as u32, s.3));
            }
        }
        // One compressor for every block: a new one per block allocated and cleared its
        // tables each time, two thirds of the load.
        let mut z = Compress::new(Compression::fast(), false);
        let mut text = Vec::new();
        let blocks = unsorted
            .chunks(BLOCK)
            .map(|chunk| {
                text.clear();
                for &(_, from, to, _) in chunk {
                    text.extend_from_slice(&names.as_bytes()[from as usize..to as usize]);
                    text.push(0);
                }
                z.reset();
                let mut out = Vec::with_capacity(text.len() / 2 + 64);
                loop {
                    let done = z.total_in() as usize;
                    match z.compress_vec(&text[done..], &mut out, FlushCompress::Finish) {
                        Ok(Status::StreamEnd) => break Ok(out.into_boxed_slice()),
                        Ok(_) => out.reserve(out.capacity().max(64)),
                        Err(e) => break Err(io::Error::other(e)),
                    }
                }
            })
            .collect::<io::Result<_>>()?;
        Ok(Self {
            addrs: unsorted.iter().map(|s| s.0).collect(),
            blocks,
            module_runs,
            modules,
            hidden,
            names: Mutex::default(),
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
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        let run = self.module_runs.partition_point(|r| r.0 as usize <= i);
        let module = self.module_runs.get(run.checked_sub(1)?)?.1;
        Some(KernelSym {
            name: self.name(i)?,
            module: &self.modules[usize::from(module)],
        })
    }

    /// The name of symbol `i`, inflated from its block the first time.
    fn name(&self, i: usize) -> Option<Arc<str>> {
        let mut cache = self
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(name) = cache.get(&(i as u32)) {
            return Some(Arc::clone(name));
        }
        let mut text = Vec::new();
        DeflateDecoder::new(&self.blocks.get(i / BLOCK)?[..])
            .read_to_end(&mut text)
            .ok()?;
        let name = text.split(|&b| b == 0).nth(i % BLOCK)?;
        let name: Arc<str> = String::from_utf8_lossy(name).into();
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(i as u32, Arc::clone(&name));
        Some(name)
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
            &*k.lookup(0xffffffff81001fff).unwrap().name,
            "do_one_initcall"
        );
        // Data symbols are skipped: this address belongs to the text symbol before it.
        assert_eq!(
            &*k.lookup(0xffffffff81002500).unwrap().name,
            "do_one_initcall"
        );
        assert_eq!(
            &*k.lookup(0xffffffff81003000).unwrap().name,
            "__x64_sys_read"
        );
        assert_eq!(
            k.lookup(0xffffffffc0001010),
            Some(KernelSym {
                name: "e1000_clean".into(),
                module: "e1000"
            })
        );
        assert_eq!(k.lookup(0xffffffff81003001).unwrap().module, "vmlinux");
        assert_eq!(k.lookup(0x1000), None);
    }

    #[test]
    fn every_symbol_of_many_blocks_keeps_its_name_and_module() {
        // 300 symbols (several blocks), in shuffled file order, the last 100 in two modules.
        let mut text = String::new();
        for i in (0..300u64).rev() {
            let module = match i {
                0..200 => String::new(),
                200..250 => "\t[mod_a]".to_owned(),
                _ => "\t[mod_b]".to_owned(),
            };
            text += &format!(
                "{:x} t fn_{i}_{}{module}\n",
                0xffffffff81000000 + i * 16,
                "x".repeat((i % 7) as usize)
            );
        }
        let k = KernelSymbols::parse(&text);
        for i in 0..300u64 {
            let sym = k.lookup(0xffffffff81000000 + i * 16 + 3).unwrap();
            assert_eq!(
                &*sym.name,
                format!("fn_{i}_{}", "x".repeat((i % 7) as usize))
            );
            let module = match i {
                0..200 => "vmlinux",
                200..250 => "mod_a",
                _ => "mod_b",
            };
            assert_eq!(sym.module, module, "symbol {i}");
        }
        // Cached names come back the same.
        assert_eq!(&*k.lookup(0xffffffff81000000).unwrap().name, "fn_0_");
    }

    #[test]
    fn this_kernels_symbols_come_back_with_their_names() {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let k = KernelSymbols::parse(&text);
        if k.hidden() {
            return; // kptr_restrict: checked by the test below
        }
        // Text symbols alone at their address, every 50th (inflating is slow unoptimized).
        let mut syms: Vec<(u64, &str, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_ascii_whitespace();
                let (addr, kind, name) = (f.next()?, f.next()?, f.next()?);
                let module = f.next().map_or("vmlinux", |m| m.trim_matches(['[', ']']));
                matches!(kind, "t" | "T" | "w" | "W")
                    .then(|| Some((u64::from_str_radix(addr, 16).ok()?, name, module)))?
            })
            .collect();
        syms.sort_by_key(|s| s.0);
        let alone: Vec<_> = syms
            .iter()
            .enumerate()
            .filter(|&(i, s)| {
                (i == 0 || syms[i - 1].0 != s.0) && syms.get(i + 1).is_none_or(|n| n.0 != s.0)
            })
            .map(|(_, s)| *s)
            .collect();
        assert!(alone.len() > 1000, "{} symbols", alone.len());
        for &(addr, name, module) in alone.iter().step_by(50) {
            let sym = k.lookup(addr).unwrap();
            assert_eq!((&*sym.name, sym.module), (name, module), "{addr:x}");
        }
    }

    #[test]
    fn restricted_kallsyms_is_detected() {
        let k = KernelSymbols::parse("0000000000000000 T _stext\n0000000000000000 t foo\n");
        assert!(k.hidden());
        assert_eq!(k.lookup(0xffffffff81000000), None);
    }
}
