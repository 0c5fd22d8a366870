//! Line numbers from a code object's line table, per version: `co_lnotab` (3.8, 3.9),
//! 3.10's `co_linetable` (PEP 626 pairs), and the 3.11+ location table (PEP 657). The last
//! step of naming a Python frame.

/// 3.8, 3.9: the line of the instruction at byte offset `addr`, as `PyCode_Addr2Line` finds
/// it: (address increment, signed line increment) pairs, applied while the address stays
/// at or below `addr`.
pub(super) fn line_lnotab(table: &[u8], first_line: i64, addr: u64) -> i64 {
    let mut line = first_line;
    let mut at = 0u64;
    for pair in table.chunks_exact(2) {
        at += u64::from(pair[0]);
        if at > addr {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

/// 3.10: the line of the instruction at byte offset `addr`: (byte length, signed line delta)
/// pairs, each a range `[end, end + length)`; a delta of -128 marks a range without a line
/// (None), whose delta is not applied.
pub(super) fn line_310(table: &[u8], first_line: i64, addr: u64) -> Option<i64> {
    let mut line = first_line;
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if (start..end).contains(&addr) {
            return here;
        }
    }
    None
}

/// The line of the instruction at code unit `index`, from `table` starting at `first_line`
/// (`co_firstlineno`); None when the table says the instruction has no line or ends first.
pub(super) fn line_at(table: &[u8], first_line: i64, index: u64) -> Option<i64> {
    let mut line = first_line;
    let mut addr = 0u64;
    let mut i = 0usize;
    while i < table.len() {
        let head = table[i];
        i += 1;
        let code = (head >> 3) & 15;
        let units = u64::from(head & 7) + 1;
        let (delta, has_line) = match code {
            15 => (0, false),
            14 => {
                let d = svarint(table, &mut i)?;
                // end line, start and end columns
                for _ in 0..3 {
                    varint(table, &mut i)?;
                }
                (d, true)
            }
            13 => (svarint(table, &mut i)?, true),
            10..=12 => {
                i += 2;
                (i64::from(code) - 10, true)
            }
            _ => {
                i += 1;
                (0, true)
            }
        };
        line += delta;
        if index < addr + units {
            return has_line.then_some(line);
        }
        addr += units;
        // The next entry starts with its top bit set; anything else is a corrupt table.
        if i < table.len() && table[i] & 0x80 == 0 {
            return None;
        }
    }
    None
}

/// 6-bit chunks, least significant first, 0x40 = more follow.
fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let b = *t.get(*i)?;
        *i += 1;
        value |= u64::from(b & 63) << shift;
        if b & 64 == 0 || shift > 56 {
            return Some(value);
        }
        shift += 6;
    }
}

fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
    let v = varint(t, i)?;
    let magnitude = (v >> 1) as i64;
    Some(if v & 1 == 1 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::{line_310, line_at, line_lnotab};

    #[test]
    fn lnotab_of_3_8() {
        // Line 2 from byte 0, +2 from byte 4, +1 from byte 8; an address step over 255
        // bytes is split into (255, 0), (n, delta).
        let table = [0, 1, 4, 2, 4, 1];
        assert_eq!(line_lnotab(&table, 1, 0), 2);
        assert_eq!(line_lnotab(&table, 1, 3), 2);
        assert_eq!(line_lnotab(&table, 1, 4), 4);
        assert_eq!(line_lnotab(&table, 1, 10), 5);
        assert_eq!(line_lnotab(&[255, 0, 10, 3, 2, -1i8 as u8], 1, 264), 1);
        assert_eq!(line_lnotab(&[255, 0, 10, 3, 2, -1i8 as u8], 1, 265), 4);
        assert_eq!(line_lnotab(&[255, 0, 10, 3, 2, -1i8 as u8], 1, 267), 3);
    }

    #[test]
    fn linetable_of_3_10() {
        // 4 bytes at first_line + 1, 6 bytes without a line, 2 bytes at -1 from the last
        // line, an empty range that moves the line, then 2 bytes.
        let table = [4, 1, 6, -128i8 as u8, 2, -1i8 as u8, 0, 5, 2, 0];
        assert_eq!(line_310(&table, 10, 0), Some(11));
        assert_eq!(line_310(&table, 10, 3), Some(11));
        assert_eq!(line_310(&table, 10, 4), None);
        assert_eq!(line_310(&table, 10, 10), Some(10));
        assert_eq!(line_310(&table, 10, 12), Some(15));
        assert_eq!(line_310(&table, 10, 14), None);
    }

    #[test]
    fn short_one_line_and_long_forms() {
        // 2 units on the first line (short form), 1 unit one line down (one-line form 11),
        // 3 units five lines down (long form 14: +5 as svarint 10), 1 unit without a line.
        let table = [
            0x80 | 1, // short form (code 0), 2 units
            0x00,
            0x80 | (11 << 3),
            4,
            8,
            0x80 | (14 << 3) | 2,
            10,
            0,
            1,
            1,
            0x80 | (15 << 3),
        ];
        assert_eq!(line_at(&table, 7, 0), Some(7));
        assert_eq!(line_at(&table, 7, 1), Some(7));
        assert_eq!(line_at(&table, 7, 2), Some(8));
        assert_eq!(line_at(&table, 7, 3), Some(13));
        assert_eq!(line_at(&table, 7, 5), Some(13));
        assert_eq!(line_at(&table, 7, 6), None);
        assert_eq!(line_at(&table, 7, 7), None);
    }

    #[test]
    fn negative_delta_and_no_column_form() {
        // 1 unit at +3 (form 13, svarint 6), then 1 unit at -2 (form 13, svarint 5).
        let table = [0x80 | (13 << 3), 6, 0x80 | (13 << 3), 5];
        assert_eq!(line_at(&table, 10, 0), Some(13));
        assert_eq!(line_at(&table, 10, 1), Some(11));
    }
}
