//! The compiler against binutils' own interpretation of the same CFI
//! (`readelf --debug-dump=frames-interp`): at every row readelf prints, our row for that
//! address must give the same CFA rule, RBP rule and stop condition.
use super::*;

/// One row of readelf's table: address, CFA text ("rsp+8", "exp"), RBP text ("c-16", "u",
/// None when not shown) and RA text.
struct ReadelfRow {
    loc: u64,
    cfa: String,
    rbp: Option<String>,
    ra: String,
}

fn readelf_rows(path: &str) -> Vec<ReadelfRow> {
    let out = std::process::Command::new("readelf")
        .args(["-W", "--debug-dump=frames-interp", path])
        .output()
        .expect("readelf (binutils) runs");
    // readelf exits 1 on Debian's libc (a warning it does not print); the rows count below
    // catches a readelf that printed nothing.
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    let mut in_fde = false;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.contains(" FDE ") {
            in_fde = true;
            continue;
        }
        if line.contains(" CIE") {
            in_fde = false;
            continue;
        }
        if words.first() == Some(&"LOC") {
            columns = words.iter().map(|w| (*w).to_owned()).collect();
            continue;
        }
        // Rows start with a 16-digit address (not "000256cc ZERO terminator").
        if !in_fde || words.len() != columns.len() || words[0].len() != 16 {
            continue;
        }
        let Ok(loc) = u64::from_str_radix(words[0], 16) else {
            continue;
        };
        let col = |name: &str| columns.iter().position(|c| c == name).map(|i| words[i]);
        rows.push(ReadelfRow {
            loc,
            cfa: words[1].to_owned(),
            rbp: col("rbp").map(str::to_owned),
            ra: col("ra").expect("an ra column").to_owned(),
        });
    }
    rows
}

/// A signal trampoline's FDE as `readelf --debug-dump=frames` prints it (frames-interp shows
/// its expressions as "exp" only): its range and the `DW_OP_breg7 (rsp): N` offsets of the
/// CFA (dereferenced), RIP and RBP.
#[derive(Debug, Default)]
struct SignalFde {
    lo: u64,
    hi: u64,
    cfa: Option<i64>,
    rip: Option<i64>,
    rbp: Option<i64>,
}

fn signal_fdes(path: &str) -> Vec<SignalFde> {
    let out = std::process::Command::new("readelf")
        .args(["-W", "--debug-dump=frames", path])
        .output()
        .expect("readelf (binutils) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let breg7 = |line: &str| {
        let rest = line.split("DW_OP_breg7 (rsp): ").nth(1)?;
        rest.split([';', ')']).next()?.trim().parse::<i64>().ok()
    };
    let (mut signal_cies, mut fdes) = (Vec::new(), Vec::<SignalFde>::new());
    let (mut last_cie, mut in_signal_fde) = (String::new(), false);
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() == 4 && words[3] == "CIE" {
            last_cie = words[0].to_owned();
            in_signal_fde = false;
        } else if line.contains("Augmentation:") && line.contains('S') {
            signal_cies.push(format!("cie={last_cie}"));
        } else if line.contains(" FDE ") {
            in_signal_fde = signal_cies.iter().any(|c| line.contains(c.as_str()));
            if in_signal_fde {
                let range = line.split("pc=").nth(1).expect("an FDE range");
                let (lo, hi) = range.split_once("..").expect("lo..hi");
                fdes.push(SignalFde {
                    lo: u64::from_str_radix(lo, 16).unwrap(),
                    hi: u64::from_str_radix(hi, 16).unwrap(),
                    ..SignalFde::default()
                });
            }
        } else if in_signal_fde && let Some(fde) = fdes.last_mut() {
            if line.contains("def_cfa_expression") && line.contains("DW_OP_deref") {
                fde.cfa = breg7(line);
            } else if line.contains("r16 (rip)") {
                fde.rip = breg7(line);
            } else if line.contains("r6 (rbp)") {
                fde.rbp = breg7(line);
            }
        }
    }
    fdes
}

fn check_against_readelf(path: &str) -> usize {
    let data = std::fs::read(path).expect("readable binary");
    let table = compile(&data).expect("compiles");
    let rows = readelf_rows(path);
    let signal = signal_fdes(path);
    assert!(
        rows.len() > 50,
        "{path}: readelf printed only {} rows",
        rows.len()
    );
    let mut checked = 0;
    for r in &rows {
        let ours = table
            .lookup(r.loc)
            .unwrap_or_else(|| panic!("{path}: no row at {:#x}", r.loc));
        let at = format!(
            "{path} at {:#x}: ours {ours:?}, readelf cfa {} rbp {:?} ra {}",
            r.loc, r.cfa, r.rbp, r.ra
        );
        if r.ra == "u" {
            assert_eq!(ours.kind, kind::STOP, "{at}");
            checked += 1;
            continue;
        }
        if r.ra != "c-8" {
            match signal.iter().find(|f| (f.lo..f.hi).contains(&r.loc)) {
                // CFA = *(rsp + N), RIP at rsp + N + 8, RBP at rsp + N + 8 x rbp_off.
                Some(f) => {
                    let (cfa, rip, rbp) = (f.cfa.unwrap(), f.rip.unwrap(), f.rbp.unwrap());
                    assert_eq!(rip, cfa + 8, "{at}: {f:?}");
                    assert_eq!(
                        (
                            ours.kind,
                            i64::from(ours.cfa_off),
                            i64::from(ours.rbp_off) * 8
                        ),
                        (kind::SIGNAL, cfa, rbp - cfa),
                        "{at}: {f:?}"
                    );
                    checked += 1;
                }
                None => assert_eq!(ours.kind, kind::UNSUPPORTED, "{at}"),
            }
            continue;
        }
        // A saved RBP we cannot express makes the whole row unsupported.
        let rbp_ok = match r.rbp.as_deref() {
            None | Some("u" | "s") => Some(0),
            Some(c) => c
                .strip_prefix("c-")
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|n| n % 8 == 0 && *n <= 1024)
                .map(|n| -(n / 8) as i8),
        };
        let Some(rbp_off) = rbp_ok else {
            assert_eq!(ours.kind, kind::UNSUPPORTED, "{at}");
            continue;
        };
        let expected_kind = [("rsp+", kind::CFA_RSP), ("rbp+", kind::CFA_RBP)]
            .into_iter()
            .find_map(|(prefix, k)| {
                let off = r.cfa.strip_prefix(prefix)?;
                Some((k, off.parse::<u16>().unwrap()))
            });
        match expected_kind {
            Some((k, off)) => {
                assert_eq!(
                    (ours.kind, ours.cfa_off, ours.rbp_off),
                    (k, off, rbp_off),
                    "{at}"
                );
            }
            // "exp": the PLT expression, or one we do not follow; other registers too.
            None => assert!(
                ours.kind == kind::PLT || ours.kind == kind::UNSUPPORTED,
                "{at}"
            ),
        }
        checked += 1;
    }
    checked
}

#[test]
fn libc_matches_readelf() {
    let checked = check_against_readelf("/lib/x86_64-linux-gnu/libc.so.6");
    assert!(checked > 20_000, "only {checked} rows compared");
}

#[test]
fn ld_so_matches_readelf() {
    let checked = check_against_readelf("/lib64/ld-linux-x86-64.so.2");
    assert!(checked > 1_000, "only {checked} rows compared");
}

/// libc's `__restore_rt` (the `S` augmentation) becomes one SIGNAL row: glibc's
/// sigcontext, RSP at 160 from the stack pointer, RBP 5 slots below it.
#[test]
fn libc_signal_frame_is_recognised() {
    let path = "/lib/x86_64-linux-gnu/libc.so.6";
    let fdes = signal_fdes(path);
    assert_eq!(fdes.len(), 1, "{fdes:?}");
    let table = compile(&std::fs::read(path).unwrap()).unwrap();
    let row = table.lookup(fdes[0].lo + 1).unwrap();
    assert_eq!(
        (row.kind, row.cfa_off, row.rbp_off),
        (kind::SIGNAL, 160, -5)
    );
}

/// libc's PLT uses the binutils expression, which becomes a PLT row with threshold 11.
#[test]
fn libc_plt_is_recognised() {
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let file = object::File::parse(&*data).unwrap();
    let plt = file.section_by_name(".plt").expect("libc has a .plt");
    let table = compile(&data).unwrap();
    let row = table.lookup(plt.address() + 0x20).unwrap();
    assert_eq!((row.kind, row.cfa_off), (kind::PLT, 11), "{row:?}");
}

/// Debian's libc keeps no frame pointers; the heuristic must say so.
#[test]
fn libc_has_no_frame_pointers() {
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let table = compile(&data).unwrap();
    assert!(
        table.fdes > 1000 && !table.keeps_frame_pointers(),
        "{} of {}",
        table.rbp_fdes,
        table.fdes
    );
}

/// A gap between FDEs is a NONE row, and merging leaves no two equal neighbours.
#[test]
fn rows_are_sorted_merged_and_gapped() {
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let table = compile(&data).unwrap();
    for w in table.rows.windows(2) {
        assert!(w[0].pc < w[1].pc, "{w:?}");
        assert!(!same_rule(w[0], w[1]), "{w:?}");
    }
    assert_eq!(table.rows.last().unwrap().kind, kind::NONE);
    assert!(table.rows.iter().any(|r| r.kind == kind::NONE));
}

/// A code segment that does not start on a page boundary in the file (lld's layout, Rust's
/// default linker): its mapping starts in the previous segment's last page, and the bias
/// must come from the code segment (found by its execute flag), not the one before it.
#[test]
fn bias_of_code_sharing_a_page_with_the_segment_before() {
    // This test binary: linked by lld, like every Rust binary here.
    let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let file = object::File::parse(&*data).unwrap();
    for s in file.segments() {
        let object::SegmentFlags::Elf { p_flags } = s.flags() else {
            continue;
        };
        let (off, _) = s.file_range();
        if p_flags & 1 == 0 || off % 4096 == 0 {
            continue;
        }
        // Mapped at 0x7f0000000000 from the page holding the segment's first byte.
        let start = 0x7f00_0000_0000;
        let bias = mapping_bias(&data, start, off & !4095).unwrap();
        assert_eq!(start + (off % 4096) - bias, s.address(), "{s:?}");
        return;
    }
    panic!("this test binary has no code segment off a page boundary");
}

#[test]
fn padding_is_nops_and_int3_only() {
    // What gcc, gas and lld put between functions: nop forms of 1 to 11 bytes, int3.
    let pads: [&[u8]; 9] = [
        &[0x90],
        &[0x66, 0x90],
        &[0x0f, 0x1f, 0x00],
        &[0x0f, 0x1f, 0x40, 0x00],
        &[0x0f, 0x1f, 0x44, 0x00, 0x00],
        &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
        &[0x0f, 0x1f, 0x80, 0, 0, 0, 0],
        &[0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
        &[0xcc, 0xcc, 0xcc],
    ];
    for p in pads {
        assert!(is_padding(p), "{p:02x?}");
    }
    assert!(is_padding(&pads.concat()));
    // Code, zeros, a nop cut short, a prefix alone, `0f 1f` with a reg field not 0.
    let not: [&[u8]; 6] = [
        &[0x0f, 0x05, 0xc3],
        &[0x00, 0x00],
        &[0x0f, 0x1f, 0x40],
        &[0x66],
        &[0x0f, 0x1f, 0x48, 0x00],
        &[0x90, 0xc3],
    ];
    for n in not {
        assert!(!is_padding(n), "{n:02x?}");
    }
}

#[test]
fn libc_padding_gaps_hold_only_padding() {
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let t = compile(&data).unwrap();
    // Most of libc's ~3,400 gaps between FDEs only align the next function.
    assert!(t.padding.len() > 3000, "{} padding gaps", t.padding.len());
    let file = object::File::parse(&*data).unwrap();
    let text = file.section_by_name(".text").unwrap();
    let (base, code) = (text.address(), text.data().unwrap());
    let mut seen = 0;
    for pc in &t.padding {
        let at = t.rows.partition_point(|r| r.pc <= *pc) - 1;
        let (row, next) = (t.rows[at], t.rows[at + 1]);
        assert_eq!((row.pc, row.kind), (*pc, kind::NONE));
        let (a, b) = (u64::from(row.pc), u64::from(next.pc));
        if a >= base && b <= base + code.len() as u64 {
            let bytes = &code[(a - base) as usize..(b - base) as usize];
            assert!(
                bytes.iter().all(|b| matches!(
                    b,
                    0x90 | 0xcc | 0x66 | 0x2e | 0x0f | 0x1f | 0x00 | 0x40 | 0x44 | 0x80 | 0x84
                )),
                "{bytes:02x?}"
            );
            seen += 1;
        }
    }
    assert!(seen > 3000, "{seen} gaps in .text");
}
