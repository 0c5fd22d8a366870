//! Names, frames and stacks in the store, each kept once (written by `write_window`, read by
//! `read`). Under process churn most of the store's bytes were these, not the counts: a
//! UNIQUE index held every name and every stack's text a second time. Now each row carries a
//! 31-bit hash with a plain index (4 bytes a row; equal hashes are told apart by comparing
//! the row), and a stack is a blob of varints: its frame ids root first, each as the zigzag
//! delta from the one before (a stack's frames are mostly interned together, so a delta is
//! mostly one byte, against ~5 bytes of decimal text a frame). A store from before is
//! rebuilt into this form when the agent opens it (`migrate`); ids do not change.
use std::collections::HashMap;

use rusqlite::{Connection, Transaction, params, types::ValueRef};

use crate::profile::{FrameKind, Profile, VarintReader, VarintWriter};

/// A frame row: (kernel, name id, module id, address, binary id).
pub(super) type FrameKey = (bool, i64, i64, i64, i64);

/// The three tables; `INDEXES` after `migrate`, which needs the old tables without them.
pub(super) const TABLES: &str = "
-- Comms, cgroup paths, frame names, modules and binaries (`path TAB build id`, or empty).
CREATE TABLE IF NOT EXISTS names(id INTEGER PRIMARY KEY, text TEXT NOT NULL,
  hash INTEGER NOT NULL);
-- A frame: kind (1 = kernel), name and module (names), address (kernel) or file offset
-- (user), binary (names).
CREATE TABLE IF NOT EXISTS frames(
  id INTEGER PRIMARY KEY, kernel INTEGER NOT NULL, name INTEGER NOT NULL,
  module INTEGER NOT NULL, addr INTEGER NOT NULL, binary INTEGER NOT NULL,
  hash INTEGER NOT NULL);
-- A stack: frame ids, root first, as zigzag varint deltas (`encode_stack`).
CREATE TABLE IF NOT EXISTS stacks(id INTEGER PRIMARY KEY, frames BLOB NOT NULL,
  hash INTEGER NOT NULL);
";

pub(super) const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS names_hash ON names(hash);
CREATE INDEX IF NOT EXISTS frames_hash ON frames(hash);
CREATE INDEX IF NOT EXISTS stacks_hash ON stacks(hash);
";

/// FNV-1a folded to 31 bits: stable across builds and toolchains (it is stored), and
/// small enough for SQLite to store in 4 bytes. Collisions only cost a comparison.
fn hash(bytes: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    ((h ^ (h >> 31) ^ (h >> 62)) & 0x7fff_ffff) as i64
}

fn frame_hash(k: &FrameKey) -> i64 {
    let mut b = Vec::with_capacity(33);
    b.push(u8::from(k.0));
    for v in [k.1, k.2, k.3, k.4] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    hash(&b)
}

/// A stack's frame ids as stored.
pub(super) fn encode_stack(ids: &[i64]) -> Vec<u8> {
    let mut w = VarintWriter(Vec::with_capacity(ids.len() * 2));
    let mut prev = 0i64;
    for &id in ids {
        w.i(id.wrapping_sub(prev)).expect("writing to a Vec");
        prev = id;
    }
    w.0
}

/// Why a stored stack does not decode.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("a stack")]
    Varint(#[source] std::io::Error),
    #[error("a stack that is neither blob nor text")]
    NotBlobOrText,
}

/// A stored stack's frame ids: the blob, or the comma-separated text of older stores (read
/// read-only, so never rebuilt).
pub(super) fn decode_stack(v: ValueRef<'_>) -> Result<Vec<i64>, StackError> {
    match v {
        ValueRef::Blob(b) => {
            let mut r = VarintReader::new(b, u64::MAX);
            let mut ids = Vec::with_capacity(b.len());
            let mut prev = 0i64;
            while r.remaining() > 0 {
                prev = prev.wrapping_add(r.i().map_err(StackError::Varint)?);
                ids.push(prev);
            }
            Ok(ids)
        }
        ValueRef::Text(t) => Ok(String::from_utf8_lossy(t)
            .split(',')
            .filter_map(|f| f.parse().ok())
            .collect()),
        _ => Err(StackError::NotBlobOrText),
    }
}

/// The id of name `text`, inserting it on first sight.
pub(super) fn name(
    tx: &Transaction<'_>,
    cache: &mut HashMap<String, i64>,
    text: &str,
) -> rusqlite::Result<i64> {
    if let Some(&id) = cache.get(text) {
        return Ok(id);
    }
    let h = hash(text.as_bytes());
    let found: Option<i64> = tx
        .prepare_cached("SELECT id FROM names WHERE hash = ?1 AND text = ?2")?
        .query_row(params![h, text], |r| r.get(0))
        .map(Some)
        .or_else(none_if_missing)?;
    let id = match found {
        Some(id) => id,
        None => {
            tx.prepare_cached("INSERT INTO names(text, hash) VALUES (?1, ?2)")?
                .execute(params![text, h])?;
            tx.last_insert_rowid()
        }
    };
    cache.insert(text.to_owned(), id);
    Ok(id)
}

/// The id of stack `ids` (frame ids, root first), inserting it on first sight.
pub(super) fn stack(
    tx: &Transaction<'_>,
    cache: &mut HashMap<Vec<u8>, i64>,
    ids: &[i64],
) -> rusqlite::Result<i64> {
    let blob = encode_stack(ids);
    if let Some(&id) = cache.get(&blob) {
        return Ok(id);
    }
    let h = hash(&blob);
    let found: Option<i64> = tx
        .prepare_cached("SELECT id FROM stacks WHERE hash = ?1 AND frames = ?2")?
        .query_row(params![h, blob], |r| r.get(0))
        .map(Some)
        .or_else(none_if_missing)?;
    let id = match found {
        Some(id) => id,
        None => {
            tx.prepare_cached("INSERT INTO stacks(frames, hash) VALUES (?1, ?2)")?
                .execute(params![blob, h])?;
            tx.last_insert_rowid()
        }
    };
    cache.insert(blob, id);
    Ok(id)
}

fn frame(
    tx: &Transaction<'_>,
    cache: &mut HashMap<FrameKey, i64>,
    key: FrameKey,
) -> rusqlite::Result<i64> {
    if let Some(&id) = cache.get(&key) {
        return Ok(id);
    }
    let h = frame_hash(&key);
    let found: Option<i64> = tx
        .prepare_cached(
            "SELECT id FROM frames WHERE hash = ?1 AND kernel = ?2 AND name = ?3 AND \
             module = ?4 AND addr = ?5 AND binary = ?6",
        )?
        .query_row(params![h, key.0, key.1, key.2, key.3, key.4], |r| r.get(0))
        .map(Some)
        .or_else(none_if_missing)?;
    let id = match found {
        Some(id) => id,
        None => {
            tx.prepare_cached(
                "INSERT INTO frames(kernel, name, module, addr, binary, hash) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![key.0, key.1, key.2, key.3, key.4, h])?;
            tx.last_insert_rowid()
        }
    };
    cache.insert(key, id);
    Ok(id)
}

fn none_if_missing<T>(e: rusqlite::Error) -> rusqlite::Result<Option<T>> {
    match e {
        rusqlite::Error::QueryReturnedNoRows => Ok(None),
        e => Err(e),
    }
}

/// The frame ids of `stack` of `p`, interned, root first.
pub(super) fn stack_frames(
    tx: &Transaction<'_>,
    names: &mut HashMap<String, i64>,
    frames: &mut HashMap<FrameKey, i64>,
    p: &Profile,
    stack: u32,
) -> rusqlite::Result<Vec<i64>> {
    let mut ids = Vec::new();
    for f in p.stack_frames(stack) {
        let binary = p
            .binaries
            .get(f.binary as usize)
            .filter(|b| !b.path.is_empty())
            .map_or(String::new(), |b| format!("{}\t{}", b.path, b.build_id));
        let key: FrameKey = (
            f.kind == FrameKind::Kernel,
            name(tx, names, p.str(f.name))?,
            name(tx, names, p.str(f.module))?,
            f.addr as i64,
            name(tx, names, &binary)?,
        );
        ids.push(frame(tx, frames, key)?);
    }
    Ok(ids)
}

/// Rebuilds the tables of a store from before hashes (UNIQUE indexes, stacks as text) into
/// this form, keeping every id; a store that has them, or has none of the tables, is left
/// as it is. One transaction: a crash midway leaves the old form.
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let old = |t: &str| -> rusqlite::Result<bool> {
        Ok(super::times::has_column(conn, t, "id")? && !super::times::has_column(conn, t, "hash")?)
    };
    let (names, frames, stacks) = (old("names")?, old("frames")?, old("stacks")?);
    if !(names || frames || stacks) {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    for (table, is_old) in [("names", names), ("frames", frames), ("stacks", stacks)] {
        if is_old {
            tx.execute_batch(&format!("ALTER TABLE {table} RENAME TO {table}_old;"))?;
        }
    }
    tx.execute_batch(TABLES)?;
    if names {
        let rows: Vec<(i64, String)> = tx
            .prepare("SELECT id, text FROM names_old")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut ins = tx.prepare("INSERT INTO names(id, text, hash) VALUES (?1, ?2, ?3)")?;
        for (id, text) in rows {
            ins.execute(params![id, text, hash(text.as_bytes())])?;
        }
    }
    if frames {
        let rows: Vec<(i64, FrameKey)> = tx
            .prepare("SELECT id, kernel, name, module, addr, binary FROM frames_old")?
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?),
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut ins = tx.prepare(
            "INSERT INTO frames(id, kernel, name, module, addr, binary, hash) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for (id, k) in rows {
            ins.execute(params![id, k.0, k.1, k.2, k.3, k.4, frame_hash(&k)])?;
        }
    }
    if stacks {
        let rows: Vec<(i64, Vec<i64>)> = tx
            .prepare("SELECT id, frames FROM stacks_old")?
            .query_map([], |r| {
                Ok((r.get(0)?, decode_stack(r.get_ref(1)?).unwrap_or_default()))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut ins = tx.prepare("INSERT INTO stacks(id, frames, hash) VALUES (?1, ?2, ?3)")?;
        for (id, ids) in rows {
            let blob = encode_stack(&ids);
            let h = hash(&blob);
            ins.execute(params![id, blob, h])?;
        }
    }
    for (table, is_old) in [("names", names), ("frames", frames), ("stacks", stacks)] {
        if is_old {
            tx.execute_batch(&format!("DROP TABLE {table}_old;"))?;
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_blob_round_trip() {
        for ids in [
            vec![],
            vec![1],
            vec![5, 6, 7, 3, 100_000, 2],
            vec![i64::MAX, 0, 1],
        ] {
            let blob = encode_stack(&ids);
            assert_eq!(decode_stack(ValueRef::Blob(&blob)).unwrap(), ids);
        }
        // Frames interned together: one byte each.
        assert_eq!(encode_stack(&[1000, 1001, 1002, 1003]).len(), 2 + 3);
        assert_eq!(
            decode_stack(ValueRef::Text(b"12,7,9")).unwrap(),
            vec![12, 7, 9]
        );
        assert!(decode_stack(ValueRef::Blob(&[0x80])).is_err());
    }
}
