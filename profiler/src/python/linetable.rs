//! Line numbers from a code object's `co_linetable` (the 3.11+ location table, PEP 626/657):
//! the last step of naming a Python frame.

/// The line of the instruction at code unit `index`, from `table` starting at `first_line`
/// (`co_firstlineno`); None when the table says the instruction has no line or ends first.
pub fn line_at(table: &[u8], first_line: i64, index: u64) -> Option<i64> {
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
    use super::line_at;

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
