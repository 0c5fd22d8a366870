//! Exact sample times in the store, between a window's samples (`write_window`) and the
//! profile `read` rebuilds: per counts row, a blob of LEB128 varints holding, for each of the
//! row's samples in time order, the delta of its offset from the previous one (the first from
//! the window's start), ns, then its CPU. About 5 bytes a sample: at 19 Hz a delta is ~4 bytes
//! (tens of ms in ns), a CPU number under 128 one byte; 19 Hz on 2 busy CPUs is ~0.7 MB/hour.
//!
//! Times can be dropped before their counts (`--keep-times`): the blob becomes NULL and the
//! window's `has_times` 0, and `read` then says the range has no exact times.
use rusqlite::Connection;

use crate::profile::{END_SLACK_NS, VarintReader, VarintWriter};

/// Columns added to stores made before exact times: old windows keep counts only
/// (`has_times` 0, `times` NULL) and are read as "no exact times".
const MIGRATIONS: &[(&str, &str, &str)] = &[
    (
        "counts",
        "times",
        "ALTER TABLE counts ADD COLUMN times BLOB",
    ),
    (
        "windows",
        "has_times",
        "ALTER TABLE windows ADD COLUMN has_times INTEGER NOT NULL DEFAULT 0",
    ),
];

/// Added to stores made before threads were kept: their rows read tid = pid.
const TID_COLUMN: (&str, &str, &str) =
    ("counts", "tid", "ALTER TABLE counts ADD COLUMN tid INTEGER");

/// Adds the time columns to a store that lacks them (a store written by an older agent).
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    for (table, column, sql) in MIGRATIONS.iter().chain([&TID_COLUMN]) {
        if !has_column(conn, table, column)? {
            conn.execute_batch(sql)?;
        }
    }
    Ok(())
}

/// Whether the store keeps threads (a read-only open of an older store cannot add them).
pub(super) fn has_tid(conn: &Connection) -> rusqlite::Result<bool> {
    has_column(conn, TID_COLUMN.0, TID_COLUMN.1)
}

/// Whether the store has the time columns (a read-only open cannot add them).
pub(super) fn has_columns(conn: &Connection) -> rusqlite::Result<bool> {
    for (table, column, _) in MIGRATIONS {
        if !has_column(conn, table, column)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `table` has `column` (schema checks for migrations; shared with `intern`).
pub(super) fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        if r.get::<_, String>(1)? == column {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Drops the times of windows that ended before `cutoff_ns` (their counts stay). The
/// index on `start_ns` bounds the scan; windows already without times are skipped.
pub(super) fn drop_older(conn: &Connection, cutoff_ns: i64) -> rusqlite::Result<u64> {
    // Cached statements: this runs at every window the agent stores.
    let tx = conn.unchecked_transaction()?;
    tx.prepare_cached(
        "UPDATE counts SET times = NULL WHERE window IN (SELECT id FROM windows WHERE \
         has_times = 1 AND start_ns + duration_ns < ?1)",
    )?
    .execute([cutoff_ns])?;
    let n = tx
        .prepare_cached(
            "UPDATE windows SET has_times = 0 WHERE has_times = 1 AND start_ns + duration_ns < ?1",
        )?
        .execute([cutoff_ns])?;
    tx.commit()?;
    Ok(n as u64)
}

/// Drops the times of the oldest tenth (at least one) of the windows that have them, for
/// `--max-size`; returns how many windows lost them (0: none had any).
pub(super) fn drop_oldest(conn: &Connection) -> rusqlite::Result<u64> {
    let timed: i64 = conn.query_row(
        "SELECT count(*) FROM windows WHERE has_times = 1",
        [],
        |r| r.get(0),
    )?;
    if timed == 0 {
        return Ok(0);
    }
    let tx = conn.unchecked_transaction()?;
    let oldest = "SELECT id FROM windows WHERE has_times = 1 ORDER BY start_ns LIMIT ?1";
    tx.execute(
        &format!("UPDATE counts SET times = NULL WHERE window IN ({oldest})"),
        [(timed / 10).max(1)],
    )?;
    let n = tx.execute(
        &format!("UPDATE windows SET has_times = 0 WHERE id IN ({oldest})"),
        [(timed / 10).max(1)],
    )?;
    tx.commit()?;
    Ok(n as u64)
}

/// The blob of one row's samples, `(offset from the window start ns, cpu)`; sorts them.
pub(super) fn encode(samples: &mut [(u64, u32)]) -> Vec<u8> {
    samples.sort_unstable();
    let mut w = VarintWriter(Vec::with_capacity(samples.len() * 5));
    let mut prev = 0;
    for &(offset, cpu) in samples.iter() {
        w.u(offset - prev).expect("writing to a Vec");
        w.u(u64::from(cpu)).expect("writing to a Vec");
        prev = offset;
    }
    w.0
}

/// Why a window's times blob does not hold its `n` samples.
#[derive(Debug, thiserror::Error)]
pub enum TimesError {
    #[error("{n} samples cannot fit in {bytes} bytes of times")]
    TooMany { n: u64, bytes: usize },
    #[error("times blob")]
    Varint(#[source] std::io::Error),
    #[error("a sample time lies past its window's end")]
    PastEnd,
    #[error("{0} bytes left after the times")]
    Trailing(usize),
}

/// The `n` samples of a blob, checked: exactly `n` of them, none past the window's end (plus
/// the slack of samples drained after the window was cut), no bytes left over.
pub(super) fn decode(blob: &[u8], n: u64, duration_ns: u64) -> Result<Vec<(u64, u32)>, TimesError> {
    // Each sample takes at least two bytes: a larger count cannot be in the blob.
    if n > blob.len() as u64 / 2 {
        return Err(TimesError::TooMany {
            n,
            bytes: blob.len(),
        });
    }
    let mut r = VarintReader::new(blob, u64::MAX);
    let end = duration_ns.saturating_add(END_SLACK_NS);
    let mut out = Vec::with_capacity(n as usize);
    let mut offset = 0u64;
    for _ in 0..n {
        offset = offset
            .checked_add(r.u().map_err(TimesError::Varint)?)
            .filter(|&o| o <= end)
            .ok_or(TimesError::PastEnd)?;
        out.push((offset, r.u32().map_err(TimesError::Varint)?));
    }
    if r.remaining() != 0 {
        return Err(TimesError::Trailing(r.remaining()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trip_and_checks() {
        let mut s = vec![(5_000_000_000, 1), (0, 0), (52_631_578, 1), (52_631_578, 0)];
        let blob = encode(&mut s);
        // 4 deltas (0, 52631578, 0, ~4.9e9) and 4 CPUs.
        assert_eq!(blob.len(), 1 + 4 + 1 + 5 + 4);
        assert_eq!(decode(&blob, 4, 10_000_000_000).unwrap(), s);
        assert!(
            decode(&blob, 3, 10_000_000_000)
                .unwrap_err()
                .to_string()
                .contains("left")
        );
        assert!(decode(&blob, 5, 10_000_000_000).is_err());
        assert!(decode(&blob[..blob.len() - 1], 4, 10_000_000_000).is_err());
        // A time far past the window (a corrupt or hostile store) is refused, not drawn.
        let mut far = vec![(END_SLACK_NS + 2_000_000_000, 0)];
        assert!(decode(&encode(&mut far), 1, 1_000_000_000).is_err());
    }
}
