//! The userspace walk of stack copies: its rules on hand-made stacks, and on this test's
//! own stack with the real rows of its binary and libc.
use super::*;

fn row(pc: u32, kind: u8, cfa_off: u16, rbp_off: i8) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_off,
        rbp_off,
        kind,
    }
}

fn copy_of(sp: u64, words: &[u64]) -> (StackCopy, Vec<u8>) {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let regs = StackCopy {
        ip: 0,
        sp,
        bp: 0,
        len: bytes.len() as u64,
    };
    (regs, bytes)
}

fn binary(rows: Vec<UnwindRow>, by_frame_pointer: bool) -> Mapped {
    Mapped {
        start: 0x40_0000,
        end: 0x50_0000,
        bias: 0x40_0000,
        rows: Arc::new(Rows {
            by_frame_pointer,
            rows,
        }),
    }
}

/// leaf (CFA = RSP + 16) -> mid (CFA = RBP + 16, RBP saved at CFA - 16) -> entry (STOP).
#[test]
fn follows_rsp_and_rbp_rules_to_the_entry() {
    let m = binary(
        vec![
            row(0x1000, kind::CFA_RSP, 16, 0),
            row(0x2000, kind::CFA_RBP, 16, -2),
            row(0x3000, kind::STOP, 0, 0),
            row(0x4000, kind::NONE, 0, 0),
        ],
        false,
    );
    let sp = 0x7fff_0000;
    // sp: [pad, ra into mid], then mid's frame at 0x7fff0010: [saved rbp, ra into entry].
    let (mut regs, bytes) = copy_of(sp, &[0, 0x40_2010, 0x1234, 0x40_3010]);
    regs.ip = 0x40_1008;
    regs.bp = sp + 16; // mid's frame pointer: CFA = bp + 16 = sp + 32
    let copy = Copy {
        regs,
        stack: &bytes,
    };
    let (frames, why) = walk(std::slice::from_ref(&m), &copy);
    assert_eq!(frames, vec![0x40_1008, 0x40_2010, 0x40_3010]);
    assert_eq!(why, reason::NONE);
}

/// A return address beyond the copy is a read fault, an address in no mapping stops with
/// "no mapping", an address in a gap with "no unwind info".
#[test]
fn says_why_it_stops() {
    let m = binary(
        vec![
            row(0x1000, kind::CFA_RSP, 8, 0),
            row(0x2000, kind::NONE, 0, 0),
        ],
        false,
    );
    let (mut regs, bytes) = copy_of(0x7fff_0000, &[]);
    regs.ip = 0x40_1000;
    let copy = Copy {
        regs,
        stack: &bytes,
    };
    assert_eq!(
        walk(std::slice::from_ref(&m), &copy),
        (vec![0x40_1000], reason::READ_FAULT)
    );
    let (mut regs, bytes) = copy_of(0x7fff_0000, &[0x40_2100]);
    regs.ip = 0x40_1000;
    let copy = Copy {
        regs,
        stack: &bytes,
    };
    assert_eq!(
        walk(std::slice::from_ref(&m), &copy).1,
        reason::NO_ROW,
        "0x2100 lies in a gap"
    );
    let (mut regs, bytes) = copy_of(0x7fff_0000, &[0x90_0000]);
    regs.ip = 0x40_1000;
    let copy = Copy {
        regs,
        stack: &bytes,
    };
    assert_eq!(
        walk(std::slice::from_ref(&m), &copy).1,
        reason::NO_MAPPING,
        "no frame pointer to follow in unmapped code"
    );
}

/// A record's trailer: the registers, the length, then that many bytes; a length beyond
/// the record is refused.
#[test]
fn parses_the_record_trailer_and_refuses_a_short_one() {
    let mut t: Vec<u8> = [1u64, 2, 3, 8]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
    t.extend(42u64.to_ne_bytes());
    let c = Copy::parse(&t).expect("a whole trailer");
    assert_eq!((c.regs.ip, c.regs.sp, c.regs.bp), (1, 2, 3));
    assert_eq!(c.read(2), Some(42));
    assert_eq!(c.read(3), None, "past the copy");
    t.truncate(t.len() - 1);
    assert!(Copy::parse(&t).is_none());
}

/// This thread's own stack, copied as the sampler would (registers, then the bytes from RSP
/// up), walked with the real rows of the test binary and of libc, must reach the thread's
/// entry (libc's clone3, whose return address is undefined); and where this binary keeps
/// frame pointers (`-C force-frame-pointers`), the table walk must give the same return
/// addresses as following them.
#[test]
#[inline(never)]
fn walks_this_threads_own_stack_to_its_entry() {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, touches nothing.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
        );
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let top = maps
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .find(|(a, b)| *a <= sp && sp < *b)
        .expect("the stack's mapping")
        .1;
    let len = (top - sp).min(profiler_common::unwind::COPY_BYTES as u64);
    // SAFETY: [sp, sp + len) lies in this thread's stack mapping; the callers' frames above
    // RSP do not change while this function runs.
    let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len as usize) }.to_vec();
    let copy = Copy {
        regs: StackCopy { ip, sp, bp, len },
        stack: &stack,
    };
    let mappings = crate::unwind::proc_mappings(std::process::id()).unwrap();
    let mut unwinder = CopyUnwinder::new(UnwindMode::Dwarf, super::TablePolicy::All, None).unwrap();
    // The tables compile on the unwinder's thread: asked for, then waited for.
    while !unwinder.ready(&mappings) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (frames, why) = unwinder.unwind(&mappings, &copy);
    assert_eq!(why, reason::NONE, "{} frames: {frames:x?}", frames.len());
    assert!(frames.len() >= 4, "{frames:x?}");
    // The same stack by frame pointer, as long as the chain stays in this binary.
    let exe = mappings
        .iter()
        .filter(|m| {
            m.path
                .ends_with(std::env::current_exe().unwrap().file_name().unwrap())
        })
        .map(|m| (m.start, m.end))
        .collect::<Vec<_>>();
    let in_exe = |a: u64| exe.iter().any(|(s, e)| *s <= a && a < *e);
    let mut by_fp = vec![ip];
    let mut fp = bp;
    while let (Some(ra), Some(next)) = (copy.read(fp + 8), copy.read(fp)) {
        if !in_exe(ra) || next <= fp {
            break;
        }
        by_fp.push(ra);
        fp = next;
    }
    assert!(by_fp.len() >= 3, "frame pointers kept: {by_fp:x?}");
    assert_eq!(&frames[..by_fp.len()], &by_fp[..]);
}

/// Tables idle for `IDLE_TABLE` go (the agent's RSS kept every table any copy ever needed);
/// one a walk used lately stays, and one that went is asked for again when a copy needs it.
#[test]
fn idle_tables_are_dropped_and_asked_for_again() {
    let mappings = crate::unwind::proc_mappings(std::process::id()).unwrap();
    let mut unwinder = CopyUnwinder::new(UnwindMode::Dwarf, super::TablePolicy::All, None).unwrap();
    while !unwinder.ready(&mappings) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let held = unwinder.tables.lock().unwrap().len();
    assert!(held >= 2, "{held} tables for this test binary's mappings");
    let libc = mappings
        .iter()
        .find(|m| m.path.to_string_lossy().contains("libc.so"))
        .expect("libc mapped");
    let libc_key = libc.key().unwrap();
    let later = std::time::Instant::now() + IDLE_TABLE * 2;
    // libc's table used just before the sweep: kept; the others idle since they came.
    unwinder.used.insert(libc_key, later);
    unwinder.sweep(later);
    let kept: Vec<BinaryKey> = unwinder.tables.lock().unwrap().keys().copied().collect();
    assert_eq!(kept, vec![libc_key], "only the table used lately stays");
    assert!(
        !unwinder.ready(&mappings),
        "the dropped tables must be asked for again"
    );
    while !unwinder.ready(&mappings) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(unwinder.tables.lock().unwrap().len(), held);
}
