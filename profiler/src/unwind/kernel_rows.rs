//! The kernel's form of a compiled table, made by the `loader` as it copies a table into
//! UNWIND_ROWS: 4-byte rows cut in 64 KiB pages of file vaddr, each row the pc's offset in its
//! page (high 16 bits) and the index of its rule in the shared, deduplicated UNWIND_RULES (low
//! 16 bits), behind a page index that takes the walk straight to the page's rows. Userspace
//! keeps its own 8-byte `UnwindRow`s (the disk cache, walks of stack copies); only the kernel
//! sees this form. docs/unwinding.md ("The kernel's table format") has a worked example.
use std::collections::HashMap;

use profiler_common::unwind::{MAX_RULES, PAGE_SHIFT, UnwindRow, UnwindRule};

const PAGE_MASK: u32 = (1 << PAGE_SHIFT) - 1;

/// Every rule the kernel's rule table holds, by index: index 0 is the all-zero rule
/// (`kind::NONE`), which the kernel's zeroed array holds without a write. Rules are never
/// freed (a few thousand fill no more than a few pages): a binary evicted and loaded again
/// finds its rules there still.
#[derive(Debug)]
pub struct Rules {
    index: HashMap<UnwindRule, u16>,
    list: Vec<UnwindRule>,
}

/// The rule table has no room for a binary's new rules.
#[derive(Debug, thiserror::Error)]
#[error("the kernel's unwind rule table is full ({MAX_RULES} distinct rules)")]
pub struct RulesFull;

impl Default for Rules {
    fn default() -> Self {
        let none = UnwindRule::default();
        Self {
            index: HashMap::from([(none, 0)]),
            list: vec![none],
        }
    }
}

impl Rules {
    /// Rules held, the zero rule included.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Always false: the zero rule is there from the start.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Forgets the rules from index `len` on (added for a binary that was not loaded after
    /// all, their kernel writes failed).
    pub fn truncate(&mut self, len: usize) {
        for r in self.list.drain(len.max(1)..) {
            self.index.remove(&r);
        }
    }

    /// The rules by index, as the kernel's UNWIND_RULES holds them.
    pub fn as_slice(&self) -> &[UnwindRule] {
        &self.list
    }

    /// The index of every rule of `rows`, adding the new ones; none added when they would
    /// not all fit.
    fn intern(&mut self, rows: &[UnwindRow]) -> Result<Vec<u16>, RulesFull> {
        let mut new: Vec<UnwindRule> = rows
            .iter()
            .map(UnwindRow::rule)
            .filter(|r| !self.index.contains_key(r))
            .collect();
        new.sort_unstable_by_key(|r| (r.kind, r.cfa_off, r.rbp_off));
        new.dedup();
        if self.list.len() + new.len() > MAX_RULES as usize {
            return Err(RulesFull);
        }
        for r in new {
            self.index.insert(r, self.list.len() as u16);
            self.list.push(r);
        }
        Ok(rows.iter().map(|r| self.index[&r.rule()]).collect())
    }
}

/// A table in the kernel's form, its page index relative to the slice's own start until
/// `write_to` places it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KernelTable {
    /// The first row's file vaddr >> PAGE_SHIFT.
    pub first_page: u32,
    /// Pages from `first_page` on up to the last row's.
    pub pages: u32,
    /// `pages + 1` page-index entries (offsets in this slice), then the rows.
    pub words: Vec<u32>,
}

impl KernelTable {
    /// Converts sorted `rows` (a `table::Table`'s), interning their rules in `rules`. The
    /// `NONE` rows at `padding` (the table's gaps that hold only alignment padding, sorted)
    /// are left out, and a row then under the same rule as the one before it: the padding
    /// joins the function before it, and every other address keeps its rule. The rule in
    /// force where a page starts, when the page has no row at offset 0, is the row just
    /// before the page's rows in the slice (the last of an earlier page), so the page index
    /// is all the kernel's search needs and no row is added.
    pub fn new(rows: &[UnwindRow], padding: &[u32], rules: &mut Rules) -> Result<Self, RulesFull> {
        let rows = without_padding(rows, padding);
        let rows = &rows[..];
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Ok(Self::default());
        };
        let indexes = rules.intern(rows)?;
        let first_page = first.pc >> PAGE_SHIFT;
        let pages = (last.pc >> PAGE_SHIFT) - first_page + 1;
        let head = pages as usize + 1;
        let mut words = vec![0u32; head];
        words.reserve(rows.len());
        let mut i = 0;
        for p in 0..pages {
            let page = first_page + p;
            words[p as usize] = words.len() as u32;
            while let Some(r) = rows.get(i).filter(|r| r.pc >> PAGE_SHIFT == page) {
                words.push(((r.pc & PAGE_MASK) << 16) | u32::from(indexes[i]));
                i += 1;
            }
        }
        words[pages as usize] = words.len() as u32;
        Ok(Self {
            first_page,
            pages,
            words,
        })
    }

    /// Entries the slice takes in UNWIND_ROWS (page index and rows).
    pub fn len(&self) -> u32 {
        self.words.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Copies the slice into `dst` (its place in UNWIND_ROWS, which starts at entry
    /// `start`), the page index made absolute.
    pub fn write_to(&self, dst: &mut [u32], start: u32) {
        let head = if self.pages == 0 {
            0
        } else {
            self.pages as usize + 1
        };
        for (d, (i, w)) in dst.iter_mut().zip(self.words.iter().enumerate()) {
            *d = if i < head { w + start } else { *w };
        }
    }
}

/// `rows` without the `NONE` rows at `padding`, and without a row whose rule is the one
/// before it (equal neighbours the drop brought together).
fn without_padding(rows: &[UnwindRow], padding: &[u32]) -> Vec<UnwindRow> {
    let mut out: Vec<UnwindRow> = Vec::with_capacity(rows.len());
    for r in rows {
        let pad =
            r.kind == profiler_common::unwind::kind::NONE && padding.binary_search(&r.pc).is_ok();
        if pad || out.last().is_some_and(|p| p.rule() == r.rule()) {
            continue;
        }
        out.push(*r);
    }
    out
}

/// The kernel walk's lookup (profiler-ebpf `unwind::find_row`), step for step, over the same
/// arrays: the rule of file vaddr `pc` in the table whose page index starts at entry
/// `table_start` of `words` (UNWIND_ROWS), or None where the kernel finds none. For the
/// tests that check the kernel's layout against `Table::lookup`.
pub fn lookup(
    words: &[u32],
    rules: &[UnwindRule],
    table_start: u32,
    pages: u32,
    first_page: u32,
    pc: u64,
) -> Option<UnwindRule> {
    let pc = u32::try_from(pc).ok()?;
    let page = (pc >> PAGE_SHIFT).checked_sub(first_page)?;
    if page >= pages {
        return None;
    }
    let at = table_start.checked_add(page)? as usize;
    let (first, mut hi) = (*words.get(at)?, *words.get(at + 1)?);
    if first > hi {
        return None;
    }
    // The page's rows are first..hi; `lo` starts just before them, at the row in force
    // where the page starts (an earlier page's last row), or, before the binary's first
    // row, at the last index entry, which is no row: NONE there.
    let rows_start = table_start.checked_add(pages)?.checked_add(1)?;
    let off = pc & PAGE_MASK;
    let mut lo = first.checked_sub(1)?;
    // Invariant: row lo starts at or below off (or is the one before the page's first);
    // rows from hi on start above it.
    let mut i = 0;
    while i < profiler_common::unwind::SEARCH_STEPS && hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if *words.get(mid as usize)? >> 16 <= off {
            lo = mid;
        } else {
            hi = mid;
        }
        i += 1;
    }
    if lo < rows_start {
        return Some(UnwindRule::default());
    }
    let row = *words.get(lo as usize)?;
    rules.get((row & 0xffff) as usize).copied()
}

#[cfg(test)]
mod tests;
