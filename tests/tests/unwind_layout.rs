//! The kernel's table layout (4-byte rows in 64 KiB pages behind a page index, rules shared
//! in a table of their own; profiler::unwind::kernel_rows) against the compiler's own table:
//! for libc, ld.so and the fx-unwind fixture, every row boundary and addresses inside each
//! range, looked up the way the kernel walk does (`kernel_rows::lookup`, a copy of
//! profiler-ebpf's `find_row` over the same arrays), give the rule `Table::lookup` gives,
//! except in the gaps that are only padding, which the kernel's form leaves out (there it
//! gives the rule of the code before). No root needed: nothing is loaded into the kernel.

use profiler::testkit::unwind::{KernelTable, Rules, Table, compile, lookup};
use profiler_common::unwind::{UnwindRow, UnwindRule, kind};

const FIXTURE: &str = env!("FIXTURE_FX_UNWIND");

/// Compiles `path`, converts its table after `rules` already holds others' rules, places it at
/// an offset in a larger array, and compares both lookups; returns the addresses checked.
fn check(path: &str, rules: &mut Rules) -> usize {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let table: Table = compile(&data).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        table.rows.len() > 10,
        "{path}: only {} rows",
        table.rows.len()
    );
    assert!(
        !table.padding.is_empty(),
        "{path}: no padding gap found, the layout's main saving untested"
    );
    let kernel = KernelTable::new(&table.rows, &table.padding, rules).expect("room for the rules");
    let start = 1234;
    let mut words = vec![u32::MAX; start as usize + kernel.len() as usize + 16];
    kernel.write_to(&mut words[start as usize..], start);
    let in_kernel = |pc: u64| {
        lookup(
            &words,
            rules.as_slice(),
            start,
            kernel.pages,
            kernel.first_page,
            pc,
        )
    };
    let (mut checked, mut padding) = (0, 0);
    for (i, pair) in table.rows.windows(2).enumerate() {
        let (from, to) = (u64::from(pair[0].pc), u64::from(pair[1].pc));
        if table.padding.binary_search(&pair[0].pc).is_ok() {
            // Left out: the rule before the gap goes on (no walk looks an address up here).
            let before = table.rows[i.checked_sub(1).expect("a gap follows a row")].rule();
            assert_eq!(
                in_kernel(from),
                Some(before),
                "{path}: padding at {from:#x}"
            );
            padding += 1;
            continue;
        }
        // The boundary, the next byte, the middle, the last byte of the range.
        for pc in [from, from + 1, from + (to - from) / 2, to - 1] {
            if pc >= to {
                continue;
            }
            let want = table.lookup(pc).map(UnwindRow::rule);
            assert_eq!(
                in_kernel(pc),
                want,
                "{path}: pc {pc:#x} in the row at {from:#x}"
            );
            checked += 1;
        }
    }
    // The last row (a gap after the last function) and just past it.
    let last = table.rows.last().expect("rows");
    let none = Some(UnwindRule::default());
    assert_eq!(in_kernel(u64::from(last.pc)), none, "{path}: the last row");
    assert_eq!(last.kind, kind::NONE);
    // Below the first row: the compiler has none; the kernel finds none or NONE (the first
    // page's added row), and walks stop there either way.
    let first = u64::from(table.rows[0].pc);
    if first > 0 {
        assert!(
            in_kernel(first - 1).is_none_or(|r| r == UnwindRule::default()),
            "{path}: below the first row"
        );
    }
    let bytes = f64::from(kernel.len()) * 4.0;
    let kernel_rows = kernel.len() - kernel.pages - 1;
    eprintln!(
        "{path}: {} compiled rows ({padding} padding gaps left out), {kernel_rows} kernel rows in {} pages, {} kernel entries: {:.3} bytes a compiled row, {:.3} a kernel row (before rules); {checked} addresses agree",
        table.rows.len(),
        kernel.pages,
        kernel.len(),
        bytes / table.rows.len() as f64,
        bytes / f64::from(kernel_rows),
    );
    checked
}

#[test]
fn kernel_layout_finds_every_rule_the_table_has() {
    // One rule table for all three, as in the kernel: later binaries share earlier rules.
    let mut rules = Rules::default();
    let mut total = 0;
    for path in [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
        FIXTURE,
    ] {
        total += check(path, &mut rules);
    }
    eprintln!("{} distinct rules for the three", rules.len());
    assert!(total > 10_000, "only {total} addresses checked");
}
