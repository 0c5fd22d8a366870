//! The kernel layout on hand-made tables: a rule that crosses a page boundary, a gap of
//! empty pages, shared rules, a full rule table. The real binaries (libc, ld.so, fx-unwind)
//! are checked row by row in tests/tests/unwind_layout.rs.
use profiler_common::unwind::kind;

use super::*;

fn row(pc: u32, kind: u8, cfa_off: u16) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_off,
        rbp_off: 0,
        kind,
    }
}

/// `t` placed at entry `start` of an array with junk before and after it.
fn placed(t: &KernelTable, start: u32) -> Vec<u32> {
    let mut words = vec![0xdead_beef; start as usize + t.words.len() + 7];
    t.write_to(&mut words[start as usize..], start);
    words
}

fn kernel(t: &KernelTable, rules: &Rules, pc: u64) -> Option<UnwindRule> {
    let start = 5;
    lookup(
        &placed(t, start),
        rules.as_slice(),
        start,
        t.pages,
        t.first_page,
        pc,
    )
}

#[test]
fn a_rule_that_starts_in_one_page_covers_the_next() {
    // A function at 0x1_fff0 whose rule (rsp+16 from 0x1_fff4) runs on into page 2.
    let rows = [
        row(0x1_fff0, kind::CFA_RSP, 8),
        row(0x1_fff4, kind::CFA_RSP, 16),
        row(0x2_0010, kind::CFA_RSP, 8),
        row(0x2_0020, kind::NONE, 0),
    ];
    let mut rules = Rules::default();
    let t = KernelTable::new(&rows, &[], &mut rules).unwrap();
    assert_eq!((t.first_page, t.pages), (1, 2));
    // Three index entries and the four rows, none added: page 2 starts under rsp+16, the
    // last row of page 1, and page 1 below its first row under nothing (NONE).
    assert_eq!(t.len(), 3 + 4);
    let rsp16 = Some(rows[1].rule());
    for pc in [0x1_fff4, 0x1_ffff, 0x2_0000, 0x2_000f] {
        assert_eq!(kernel(&t, &rules, pc), rsp16, "{pc:#x}");
    }
    assert_eq!(kernel(&t, &rules, 0x2_0010), Some(rows[2].rule()));
    assert_eq!(kernel(&t, &rules, 0x1_fff3), Some(rows[0].rule()));
    assert_eq!(
        kernel(&t, &rules, 0x1_0000).map(|r| r.kind),
        Some(kind::NONE)
    );
    assert_eq!(
        kernel(&t, &rules, 0x2_0020).map(|r| r.kind),
        Some(kind::NONE)
    );
    // Outside the pages: no row at all, as the kernel says.
    assert_eq!(kernel(&t, &rules, 0xffff), None);
    assert_eq!(kernel(&t, &rules, 0x3_0000), None);
}

#[test]
fn a_gap_of_empty_pages_holds_one_row_each() {
    // Code at 0x40_1000, then nothing until a second text section at 0x48_0100.
    let rows = [
        row(0x40_1000, kind::CFA_RSP, 8),
        row(0x40_1200, kind::NONE, 0),
        row(0x48_0100, kind::CFA_RSP, 8),
        row(0x48_0180, kind::NONE, 0),
    ];
    let mut rules = Rules::default();
    let t = KernelTable::new(&rows, &[], &mut rules).unwrap();
    assert_eq!((t.first_page, t.pages), (0x40, 9));
    // 10 index entries and the four rows: the seven pages between have none of their own
    // (their index entries equal the next), and are under the NONE row at 0x40_1200.
    assert_eq!(t.len(), 10 + 4);
    for page in 0x41..0x48u64 {
        for off in [0, 0x8000, 0xffff] {
            let pc = (page << 16) + off;
            assert_eq!(kernel(&t, &rules, pc).map(|r| r.kind), Some(kind::NONE));
        }
    }
    // Page 0x48 below its first row: still the gap's NONE, from page 0x40's last row.
    assert_eq!(
        kernel(&t, &rules, 0x48_00ff).map(|r| r.kind),
        Some(kind::NONE)
    );
    assert_eq!(kernel(&t, &rules, 0x48_0100), Some(rows[2].rule()));
    assert_eq!(kernel(&t, &rules, 0x40_11ff), Some(rows[0].rule()));
}

#[test]
fn rules_are_shared_and_a_full_table_adds_none() {
    let mut rules = Rules::default();
    let a = [
        row(0x1000, kind::CFA_RSP, 8),
        row(0x1010, kind::CFA_RSP, 16),
    ];
    let b = [
        row(0x9000, kind::CFA_RSP, 16),
        row(0x9010, kind::CFA_RBP, 16),
    ];
    KernelTable::new(&a, &[], &mut rules).unwrap();
    assert_eq!(rules.len(), 3, "NONE, rsp+8, rsp+16");
    KernelTable::new(&b, &[], &mut rules).unwrap();
    assert_eq!(rules.len(), 4, "rsp+16 is shared, rbp+16 is new");
    // Fill the table up to one free slot, then ask for two new rules.
    let mut pc = 0;
    let fill: Vec<UnwindRow> = (4..MAX_RULES)
        .map(|i| {
            pc += 16;
            UnwindRow {
                pc,
                cfa_off: i as u16,
                rbp_off: -1,
                kind: kind::CFA_RSP,
            }
        })
        .collect();
    KernelTable::new(&fill, &[], &mut rules).unwrap();
    assert_eq!(rules.len(), MAX_RULES as usize);
    let two_new = [
        row(0x1000, kind::CFA_RBP, 24),
        row(0x1010, kind::CFA_RBP, 32),
    ];
    assert!(KernelTable::new(&two_new, &[], &mut rules).is_err());
    assert_eq!(rules.len(), MAX_RULES as usize, "nothing added on failure");
    // Known rules only: fits.
    assert!(KernelTable::new(&a, &[], &mut rules).is_ok());
}

#[test]
fn the_page_index_is_made_absolute_where_the_slice_lands() {
    let rows = [
        row(0x1_0000, kind::CFA_RSP, 8),
        row(0x1_0040, kind::NONE, 0),
    ];
    let mut rules = Rules::default();
    let t = KernelTable::new(&rows, &[], &mut rules).unwrap();
    let words = placed(&t, 100);
    assert_eq!(&words[100..104], &[102, 104, 1, 1 << 22]);
    assert_eq!(t.len(), 4);
    assert_eq!(KernelTable::new(&[], &[], &mut rules).unwrap().len(), 0);
}

/// docs/unwinding.md's worked example, word for word.
#[test]
fn the_documented_example() {
    let rows = [
        row(0x1_fff0, kind::CFA_RSP, 8),
        row(0x1_fff4, kind::CFA_RSP, 16),
        row(0x2_0010, kind::CFA_RSP, 8),
        row(0x2_0020, kind::NONE, 0),
    ];
    let mut rules = Rules::default();
    let t = KernelTable::new(&rows, &[], &mut rules).unwrap();
    let words = placed(&t, 1000);
    assert_eq!(
        &words[1000..1007],
        &[
            1003,
            1005,
            1007,
            0xfff0_0001,
            0xfff4_0002,
            0x0010_0001,
            0x0020_0000
        ]
    );
    assert_eq!(rules.as_slice()[1], rows[0].rule());
    assert_eq!(rules.as_slice()[2], rows[1].rule());
    let at = |pc| lookup(&words, rules.as_slice(), 1000, t.pages, t.first_page, pc);
    assert_eq!(at(0x2_0004), Some(rows[1].rule()));
    assert_eq!(at(0x1_0000), Some(UnwindRule::default()));
}

#[test]
fn padding_gaps_are_left_out_and_their_neighbours_merged() {
    // f (rsp+8) to 0x1009, padding to 0x1010, g (rsp+8) to 0x1020, then a gap of real
    // bytes without CFI to 0x1030, h (rsp+16) to 0x1040.
    let rows = [
        row(0x1000, kind::CFA_RSP, 8),
        row(0x1009, kind::NONE, 0),
        row(0x1010, kind::CFA_RSP, 8),
        row(0x1020, kind::NONE, 0),
        row(0x1030, kind::CFA_RSP, 16),
        row(0x1040, kind::NONE, 0),
    ];
    let mut rules = Rules::default();
    let exact = KernelTable::new(&rows, &[], &mut rules).unwrap();
    let t = KernelTable::new(&rows, &[0x1009], &mut rules).unwrap();
    // Two rows fewer: the padding's NONE and g's row, now f's rule going on.
    assert_eq!(t.len(), exact.len() - 2);
    let rsp8 = Some(rows[0].rule());
    for pc in [0x1000, 0x1008, 0x1009, 0x100f, 0x1010, 0x101f] {
        assert_eq!(kernel(&t, &rules, pc), rsp8, "{pc:#x}");
    }
    // The gap that is not padding keeps its NONE.
    assert_eq!(kernel(&t, &rules, 0x1020).map(|r| r.kind), Some(kind::NONE));
    assert_eq!(kernel(&t, &rules, 0x1030), Some(rows[4].rule()));
    // A padding entry on a row that is not a gap changes nothing.
    let same = KernelTable::new(&rows, &[0x1000], &mut rules).unwrap();
    assert_eq!(same, exact);
}
