//! Unwind-table compiler, first step of table unwinding: a binary's `.eh_frame` (and its
//! `.debug_frame` where `.eh_frame` covers little of the code) becomes one sorted list of
//! compact rows (`UnwindRow`, 8 bytes here, 4 in the kernel: `kernel_rows`) that the kernel
//! walk (profiler-ebpf `unwind`) can binary-search: per address range, where the caller's stack
//! pointer (the CFA) is and where RBP was saved. The return address is at CFA - 8 on x86_64.
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, ReaderOffset,
    Register, RegisterRule, UnwindContext, UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment, SectionKind};
use profiler_common::unwind::{UnwindRow, kind};

/// DWARF register numbers on x86_64.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

/// A compiled table and what was seen on the way.
#[derive(Debug, Default)]
pub struct Table {
    /// Sorted by `pc`, equal neighbours merged; a `kind::NONE` row starts every gap.
    pub rows: Vec<UnwindRow>,
    /// FDEs read.
    pub fdes: usize,
    /// FDEs whose CFA moves to RBP somewhere (a frame-pointer prologue).
    pub rbp_fdes: usize,
    /// Sorted pcs of the `NONE` rows whose whole range (up to the next row) is alignment
    /// padding (`is_padding`): no code runs there, and the walk looks up a return address
    /// less one (the call, inside its function), so no walk asks for them. The kernel's form
    /// leaves them out (`kernel_rows`); `rows` and `lookup` stay exact.
    pub padding: Vec<u32>,
}

impl Table {
    /// True when most functions set up a frame pointer: such a binary is walked by frame
    /// pointer (cheaper, and needs no table in the kernel). Go binaries have no .eh_frame at
    /// all, which `compile` reports as an empty table.
    pub fn keeps_frame_pointers(&self) -> bool {
        self.fdes > 0 && self.rbp_fdes * 10 >= self.fdes * 8
    }

    /// The row covering file vaddr `pc` (the last row starting at or below it).
    pub fn lookup(&self, pc: u64) -> Option<&UnwindRow> {
        let i = self.rows.partition_point(|r| u64::from(r.pc) <= pc);
        i.checked_sub(1).map(|i| &self.rows[i])
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not an ELF file we can read")]
    Elf(#[from] object::Error),
    #[error("malformed .eh_frame or .debug_frame")]
    EhFrame(#[from] gimli::Error),
    #[error("cannot read the file")]
    Unreadable,
    #[error("code above 4 GiB (vaddr {0:#x}): tables hold 32-bit addresses")]
    TooHigh(u64),
}

/// The bytes of an ELF image to compile, and a way to let go of those the compiler has read.
/// A file mapping drops their pages (`files::Mmap`): the padding scan reads between every
/// two functions, so it touches nearly all of a binary's code (90 MB of librustc_driver's),
/// which would otherwise stay resident, counted in the profiler's RSS, until the compile ends.
pub trait Image: std::ops::Deref<Target = [u8]> {
    /// The compiler will not read the bytes at `range` (offsets into the image) again; a
    /// read after all sees the same bytes, only slower.
    fn done_with(&self, _range: std::ops::Range<usize>) {}

    /// The file the bytes are from, as (device, inode, size, mtime, ctime), where known:
    /// the same identity has the same bytes (`cache::key` hashes them once).
    fn identity(&self) -> Option<[i64; 5]> {
        None
    }
}
impl Image for Vec<u8> {}
impl Image for &[u8] {}

/// Bytes read between two `Image::done_with` calls: a few syscalls for a big binary, and as
/// many resident bytes at most.
pub(super) const RELEASE_EVERY: usize = 4 << 20;

/// Compiles the `.eh_frame` of the ELF image `data`. A binary without one gets an empty table.
pub fn compile(data: &impl Image) -> Result<Table, TableError> {
    compile_with_debug(data, |_| None::<&[u8]>)
}

/// Every CFI row of a binary, in the order read: the row at its start, and its end. 12 bytes
/// a row, not the 24 of (u64, u64, row): librustc_driver has a million rows, held while the
/// table is built.
#[derive(Default)]
struct Spans {
    rows: Vec<(UnwindRow, u32)>,
    /// The start of a row not below 4 GiB, which tables cannot hold (`finish` says so).
    too_high: Option<u64>,
}

impl Spans {
    /// A row over [start, end); an empty one is left out.
    fn push(&mut self, start: u64, end: u64, row: UnwindRow) {
        match (u32::try_from(start), u32::try_from(end)) {
            _ if start >= end => {}
            (Ok(pc), Ok(end)) => self.rows.push((UnwindRow { pc, ..row }, end)),
            _ => _ = self.too_high.get_or_insert(start),
        }
    }

    /// (start, end) of each row.
    fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.rows
            .iter()
            .map(|(r, end)| (r.pc.into(), (*end).into()))
    }
}

/// `compile`, and where `.eh_frame` covers less than half of the code (built with
/// `-fno-asynchronous-unwind-tables`, whose CFI gcc puts in `.debug_frame` alone), the
/// functions it leaves out from `.debug_frame`: the binary's own, else that of its separate
/// debug file, which `debug_file` is asked for only then (given the parsed binary).
pub fn compile_with_debug<D: std::ops::Deref<Target = [u8]>>(
    image: &impl Image,
    debug_file: impl FnOnce(&object::File<'_>) -> Option<D>,
) -> Result<Table, TableError> {
    let file = object::File::parse(&**image)?;
    let mut table = Table::default();
    let mut spans = Spans::default();
    let mut bases = BaseAddresses::default();
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    if let Some(section) = file.section_by_name(".eh_frame") {
        let eh_frame = EhFrame::new(section.data()?, LittleEndian);
        let bases = bases.clone().set_eh_frame(section.address());
        read_section(&eh_frame, &bases, &mut table, &mut spans)?;
        if let Some((at, size)) = section.file_range() {
            image.done_with(offset(at)..offset(at.saturating_add(size)));
        }
    }
    entry_stop(&file, &mut spans);
    let code: u64 = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .fold(0u64, |sum, s| sum.saturating_add(s.size()));
    // Saturating: the sizes and ranges are the file's word, and it may lie.
    let covered = spans
        .ranges()
        .fold(0u64, |sum, (a, b)| sum.saturating_add(b.saturating_sub(a)));
    // Go binaries keep frame pointers and have no .eh_frame: their .debug_frame is not
    // wanted (they are walked by frame pointer).
    if covered.saturating_mul(2) >= code || file.section_by_name(".gopclntab").is_some() {
        return finish(table, spans).map(|t| mark_padding(&file, image, t));
    }
    // Debug sections may be compressed (SHF_COMPRESSED): read them inflated.
    let debug_frame_of = |f: &object::File<'_>| {
        f.section_by_name(".debug_frame")?
            .uncompressed_data()
            .ok()
            .map(std::borrow::Cow::into_owned)
    };
    let bytes = debug_frame_of(&file).or_else(|| {
        let other = debug_file(&file)?;
        debug_frame_of(&object::File::parse(&*other).ok()?)
    });
    if let Some(bytes) = bytes.as_deref() {
        // FDEs of functions .eh_frame describes already are skipped (crt code has both).
        let mut eh_ranges: Vec<(u64, u64)> = spans.ranges().collect();
        eh_ranges.sort_unstable();
        let mut debug_spans = Spans::default();
        let mut debug_frame = DebugFrame::new(bytes, LittleEndian);
        debug_frame.set_address_size(8);
        read_section(&debug_frame, &bases, &mut table, &mut debug_spans)?;
        spans.too_high = spans.too_high.or(debug_spans.too_high);
        spans
            .rows
            .extend(debug_spans.rows.into_iter().filter(|(row, _)| {
                let start = u64::from(row.pc);
                let i = eh_ranges.partition_point(|r| r.0 <= start);
                i == 0 || eh_ranges[i - 1].1 <= start
            }));
    }
    finish(table, spans).map(|t| mark_padding(&file, image, t))
}

/// Fills `table.padding` from the code bytes of `file`'s segments: the gaps between FDEs
/// that hold nothing but padding (most are the few bytes that align the next function).
fn mark_padding(file: &object::File<'_>, image: &impl Image, mut table: Table) -> Table {
    // (vaddr, file offset, size) of each segment's bytes in the file.
    let segments: Vec<(u64, usize, usize)> = file
        .segments()
        .filter_map(|s| {
            let (at, size) = s.file_range();
            Some((s.address(), offset(at), usize::try_from(size).ok()?))
        })
        .collect();
    // The file offsets of the code at [from, to), when one segment's bytes hold it.
    let code = |from: u64, to: u64| {
        segments.iter().find_map(|(vaddr, at, size)| {
            let (a, b) = (from.checked_sub(*vaddr)?, to.checked_sub(*vaddr)?);
            let (a, b) = (usize::try_from(a).ok()?, usize::try_from(b).ok()?);
            (a <= b && b <= *size).then(|| at.saturating_add(a)..at.saturating_add(b))
        })
    };
    // Rows are in address order, so the reads move forward through each segment: what lies
    // behind the last read is let go of every few MB.
    let mut kept_from = 0usize;
    table.padding = table
        .rows
        .windows(2)
        .filter(|w| w[0].kind == kind::NONE)
        .filter(|w| {
            let Some(range) = code(w[0].pc.into(), w[1].pc.into()) else {
                return false;
            };
            if range.start >= kept_from.saturating_add(RELEASE_EVERY) {
                image.done_with(kept_from..range.start);
                kept_from = range.start;
            }
            image.get(range).is_some_and(is_padding)
        })
        .map(|w| w[0].pc)
        .collect();
    table
}

/// A file offset or size from the file's headers as an index (saturating: the file's word,
/// and it may lie; an index past the end then reads nothing).
fn offset(at: u64) -> usize {
    usize::try_from(at).unwrap_or(usize::MAX)
}

/// A STOP row over the ELF entry point when no CFI covers it: ld.so's `_start` has none, and
/// every sample taken while ld.so loads a program (each new process's first milliseconds)
/// reaches it; it is the entry of that stack, not a frame without unwind information.
fn entry_stop(file: &object::File<'_>, spans: &mut Spans) {
    use object::ObjectSymbol as _;
    let entry = file.entry();
    // A binary without any CFI (Go's) stays without rows: walked by frame pointer.
    if entry == 0 || spans.rows.is_empty() || spans.ranges().any(|(a, b)| a <= entry && entry < b) {
        return;
    }
    // Its symbol's size; else (ld.so's _start is in no symbol table) up to the next CFI.
    let next = spans
        .ranges()
        .map(|(a, _)| a)
        .filter(|a| *a > entry)
        .min()
        .unwrap_or(entry.saturating_add(16));
    let end = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.address() == entry && s.size() > 0)
        .map_or(next, |s| entry.saturating_add(s.size()).min(next));
    let stop = UnwindRow {
        kind: kind::STOP,
        ..UnwindRow::default()
    };
    spans.push(entry, end, stop);
}

/// Reads every FDE of `section` (`.eh_frame` or `.debug_frame`) into `spans`.
fn read_section<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    table: &mut Table,
    spans: &mut Spans,
) -> Result<(), gimli::Error> {
    let mut ctx = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(S::cie_from_offset)?;
        table.fdes += 1;
        let mut uses_rbp = false;
        let signal = fde.is_signal_trampoline();
        let mut rows = fde.rows(section, bases, &mut ctx)?;
        while let Some(r) = rows.next_row()? {
            let row = if signal {
                signal_frame(r, section)
            } else {
                convert(r, section)
            };
            uses_rbp |= row.kind == kind::CFA_RBP;
            spans.push(r.start_address(), r.end_address(), row);
        }
        table.rbp_fdes += usize::from(uses_rbp);
    }
    Ok(())
}

/// Sorts `spans` into `table.rows`, with a gap row wherever no FDE covers the code.
fn finish(mut table: Table, mut spans: Spans) -> Result<Table, TableError> {
    if let Some(at) = spans.too_high {
        return Err(TableError::TooHigh(at));
    }
    spans.rows.sort_by_key(|(row, _)| row.pc);
    let mut end = 0u32;
    for (row, stop) in spans.rows {
        if !table.rows.is_empty() && row.pc > end {
            push_merged(&mut table.rows, gap(end));
        }
        push_merged(&mut table.rows, row);
        end = end.max(stop);
    }
    if !table.rows.is_empty() {
        push_merged(&mut table.rows, gap(end));
    }
    Ok(table)
}

/// Go's functions at the base of a stack its frame pointers can walk (without the `.abi0`
/// suffix of assembly functions): a thread's entry (`TOPFRAME` in its runtime: mstart,
/// goexit, rt0_go) and the switches to the scheduler's stack (mcall, systemstack,
/// morestack, asmcgocall). What their frame pointer points at is no frame of this stack, so
/// the walk ends at them (Go's own traceback jumps to the goroutine's stack; we cannot).
pub const GO_STACK_BASES: &[&str] = &[
    "runtime.mstart",
    "runtime.goexit",
    "runtime.rt0_go",
    "runtime.mcall",
    "runtime.systemstack",
    "runtime.morestack",
    "runtime.asmcgocall",
];

/// For a Go binary (one with `.gopclntab`, walked by frame pointer), rows that are STOP
/// over its `GO_STACK_BASES` and NONE elsewhere (the kernel walk follows frame pointers
/// there); empty for any other binary.
pub(crate) fn go_stops(data: &[u8]) -> Vec<UnwindRow> {
    use object::ObjectSymbol as _;
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    if file.section_by_name(".gopclntab").is_none() {
        return Vec::new();
    }
    let mut ranges: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| {
            s.size() > 0
                && s.name()
                    .is_ok_and(|n| GO_STACK_BASES.contains(&n.strip_suffix(".abi0").unwrap_or(n)))
        })
        .map(|s| (s.address(), s.address().saturating_add(s.size())))
        .collect();
    ranges.sort_unstable();
    let mut rows: Vec<UnwindRow> = Vec::new();
    for (start, end) in ranges {
        let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) else {
            continue;
        };
        let row = |pc, kind| UnwindRow {
            pc,
            kind,
            ..UnwindRow::default()
        };
        push_merged(&mut rows, row(start, kind::STOP));
        push_merged(&mut rows, row(end, kind::NONE));
    }
    rows
}

/// The bias of the mapping of `data` at file offset `file_offset` loaded at `start`: the
/// number to subtract from an address in it to get the file vaddr the table uses.
///
/// A mapping starts at a page boundary, so its offset can fall in the previous segment's
/// last page: lld (Rust's default linker) packs the read-only segment and the code into one
/// page (`R` ends at 0x16a54, `R E` starts at file offset 0x16a60 and vaddr 0x17a60), and
/// the code's mapping then starts at offset 0x16000. The executable segment whose page
/// range holds the offset is the one mapped (the loader passes executable mappings only).
pub fn mapping_bias(data: &[u8], start: u64, file_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    const PF_X: u32 = 1;
    let file = object::File::parse(data).ok()?;
    let holds = |s: &object::Segment<'_, '_>| {
        let (off, size) = s.file_range();
        off & !(PAGE - 1) <= file_offset && file_offset < off + size.max(1)
    };
    let executable = |s: &object::Segment<'_, '_>| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
    let segment = file
        .segments()
        .find(|s| holds(s) && executable(s))
        .or_else(|| file.segments().find(|s| holds(s)))?;
    let (off, _) = segment.file_range();
    // address = start + (fileoff - file_offset); vaddr = fileoff - off + segment vaddr.
    Some(
        start
            .wrapping_sub(file_offset)
            .wrapping_add(off)
            .wrapping_sub(segment.address()),
    )
}

fn gap(pc: u32) -> UnwindRow {
    UnwindRow {
        pc,
        kind: kind::NONE,
        ..UnwindRow::default()
    }
}

/// Appends `row` unless it changes nothing; a row at the same pc as the last replaces it.
fn push_merged(rows: &mut Vec<UnwindRow>, row: UnwindRow) {
    if let Some(last) = rows.last_mut() {
        if last.pc == row.pc {
            *last = row;
            // The replaced row may now equal the one before it.
            if rows.len() >= 2 && same_rule(rows[rows.len() - 2], row) {
                rows.pop();
            }
            return;
        }
        if same_rule(*last, row) {
            return;
        }
    }
    rows.push(row);
}

fn same_rule(a: UnwindRow, b: UnwindRow) -> bool {
    (a.kind, a.cfa_off, a.rbp_off) == (b.kind, b.cfa_off, b.rbp_off)
}

fn unsupported() -> UnwindRow {
    UnwindRow {
        kind: kind::UNSUPPORTED,
        ..UnwindRow::default()
    }
}

/// The row of a signal trampoline (an FDE whose CIE has the `S` augmentation: libc's
/// `__restore_rt`, where a signal handler returns to). The interrupted registers are in the
/// `ucontext` on the stack, and glibc's CFI says so with expressions: CFA = `*(rsp + N)`
/// (the saved RSP), RIP saved at `rsp + N + 8`, RBP at `rsp + N + 8 x k`. That becomes one
/// `kind::SIGNAL` row (cfa_off = N, rbp_off = k); any other trampoline is unsupported.
fn signal_frame<R: gimli::Reader, S: UnwindSection<R>>(
    r: &gimli::UnwindTableRow<R::Offset>,
    eh_frame: &S,
) -> UnwindRow {
    let at_rsp = |e: &gimli::UnwindExpression<R::Offset>, deref: bool| {
        let mut expr = e.get(eh_frame).ok()?.0;
        (expr.read_u8().ok()? == DW_OP_BREG7).then_some(())?;
        let off = expr.read_sleb128().ok()?;
        if deref {
            (expr.read_u8().ok()? == DW_OP_DEREF).then_some(())?;
        }
        expr.is_empty().then_some(off)
    };
    let saved = |reg| match r.register(reg) {
        Some(RegisterRule::Expression(e)) => at_rsp(&e, false),
        _ => None,
    };
    let row = (|| {
        let CfaRule::Expression(cfa) = r.cfa() else {
            return None;
        };
        let rsp_at = at_rsp(cfa, true)?;
        (saved(RA)? == rsp_at + 8).then_some(())?;
        // RBP in 8-byte slots from the saved RSP (glibc: -5).
        let rbp = saved(RBP)? - rsp_at;
        if rbp % 8 != 0 || !(-1024..0).contains(&rbp) {
            return None;
        }
        Some(UnwindRow {
            pc: 0,
            cfa_off: u16::try_from(rsp_at).ok()?,
            rbp_off: (rbp / 8) as i8,
            kind: kind::SIGNAL,
        })
    })();
    row.unwrap_or_else(unsupported)
}

const DW_OP_BREG7: u8 = 0x77;
const DW_OP_DEREF: u8 = 0x06;

/// One gimli row to our rule (pc filled in by the caller).
fn convert<R: gimli::Reader, S: UnwindSection<R>>(
    r: &gimli::UnwindTableRow<R::Offset>,
    eh_frame: &S,
) -> UnwindRow {
    match r.register(RA) {
        Some(RegisterRule::Undefined) => {
            return UnwindRow {
                kind: kind::STOP,
                ..UnwindRow::default()
            };
        }
        Some(RegisterRule::Offset(-8)) => {}
        // Hand-written CFI (signal frames are compiled by `signal_frame`).
        _ => return unsupported(),
    }
    let rbp_off = match r.register(RBP) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(o)) if o % 8 == 0 && (-1024..0).contains(&o) => (o / 8) as i8,
        _ => return unsupported(),
    };
    let (kind, cfa_off) = match r.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(off) = u16::try_from(*offset) else {
                return unsupported();
            };
            match *register {
                RSP => (kind::CFA_RSP, off),
                RBP => (kind::CFA_RBP, off),
                // libc's leaf code keeps the CFA in RDI/RDX in a handful of places.
                _ => return unsupported(),
            }
        }
        CfaRule::Expression(e) => match e.get(eh_frame).ok().and_then(|e| plt_threshold(e.0)) {
            Some(threshold) => (kind::PLT, threshold),
            None => return unsupported(),
        },
    };
    UnwindRow {
        pc: 0,
        cfa_off,
        rbp_off,
        kind,
    }
}

/// The CFA expression binutils writes for `.plt`: `rsp + 8 + ((rip & 15) >= N) << 3`
/// (DW_OP_breg7 8, DW_OP_breg16 0, DW_OP_lit15, DW_OP_and, DW_OP_litN, DW_OP_ge, DW_OP_lit3,
/// DW_OP_shl, DW_OP_plus). Returns N.
fn plt_threshold<R: gimli::Reader>(mut expr: R) -> Option<u16> {
    let mut bytes = [0u8; 11];
    if expr.len().into_u64() != bytes.len() as u64 {
        return None;
    }
    expr.read_slice(&mut bytes).ok()?;
    const LIT0: u8 = 0x30;
    let [0x77, 8, 0x80, 0, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] = bytes else {
        return None;
    };
    (LIT0..LIT0 + 32)
        .contains(&lit)
        .then(|| u16::from(lit - LIT0))
}

#[cfg(test)]
mod tests;

/// Whether `code` is only alignment padding: `int3` or x86 `nop` forms (`90`, `66 90`,
/// `0f 1f /0` with its ModRM, SIB and displacement, behind `66` and segment prefixes), as
/// assemblers and linkers fill the space between functions.
pub(crate) fn is_padding(code: &[u8]) -> bool {
    let mut i = 0;
    while i < code.len() {
        let start = i;
        while i < code.len() && matches!(code[i], 0x66 | 0x2e | 0x3e | 0x26 | 0x64 | 0x65) {
            i += 1;
        }
        match code.get(i..) {
            Some([0x90 | 0xcc, ..]) => i += 1,
            Some([0x0f, 0x1f, modrm, rest @ ..]) if modrm & 0x38 == 0 => {
                let (md, rm) = (modrm >> 6, modrm & 7);
                let sib = md != 3 && rm == 4;
                let disp = match md {
                    0 if rm == 5 => 4,
                    0 if sib && rest.first().is_some_and(|s| s & 7 == 5) => 4,
                    1 => 1,
                    2 => 4,
                    _ => 0,
                };
                i += 3 + usize::from(sib) + disp;
            }
            _ => return false,
        }
        // A prefix alone (or over 14 of them) is no instruction we know.
        if i - start > 15 {
            return false;
        }
    }
    i == code.len()
}
