//! The loader's eviction (`Loader::make_room`): when UNWIND_ROWS has no room for a new
//! table, the least recently used binaries' tables go, and the kernel entries of the
//! processes that map them lose those mappings.
use std::collections::HashSet;

use super::{BinaryKey, Loader};

/// How long freed rows wait before they are written again: a kernel walk that looked up a
/// process's old entry just before it was rewritten may still read them. A walk runs for
/// microseconds in the sampler's interrupt; this is far longer.
const REUSE_GRACE: std::time::Duration = std::time::Duration::from_millis(2);

impl Loader {
    /// Takes `len` rows, evicting least recently used binaries when needed: first those no
    /// loaded process maps, then the others (whose processes' entries lose those mappings,
    /// so their walks stop there with "no mapping" and the collector has them loaded again).
    pub(super) fn make_room(
        &mut self,
        len: u32,
        key: BinaryKey,
        pinned: &HashSet<BinaryKey>,
    ) -> Option<u32> {
        if let Some(start) = self.space.alloc(len) {
            return Some(start);
        }
        let mut victims: Vec<(bool, u64, BinaryKey)> = self
            .binaries
            .iter()
            .filter(|(k, b)| b.table_len > 0 && **k != key && !pinned.contains(*k))
            .map(|(k, b)| (b.users > 0, b.last_used, *k))
            .collect();
        victims.sort_unstable();
        // Evict nothing when even all of them would not make room.
        let reclaimable: u64 = victims
            .iter()
            .filter_map(|(_, _, k)| self.binaries.get(k))
            .map(|b| u64::from(b.table_len))
            .sum();
        let free = u64::from(self.space.capacity() - self.space.used());
        if free + reclaimable < u64::from(len) {
            return None;
        }
        let mut freed = Vec::new();
        let mut start = None;
        for (_, _, victim) in victims {
            let Some(b) = self.binaries.remove(&victim) else {
                continue;
            };
            self.unmap_everywhere(victim);
            freed.push((b.table_start, b.table_len));
            self.space.release(b.table_start, b.table_len);
            self.stats.evicted += 1;
            log::debug!(
                "unwind memory full: evicted a table of {} rows",
                b.table_len
            );
            start = self.space.alloc(len);
            if start.is_some() {
                break;
            }
        }
        self.stats.slots_now = u64::from(self.space.used());
        if start.is_some() && !freed.is_empty() {
            std::thread::sleep(REUSE_GRACE);
        }
        start
    }

    /// Removes binary `key`'s mappings from every loaded process's kernel entry.
    fn unmap_everywhere(&mut self, key: BinaryKey) {
        let pids: Vec<u32> = self
            .loaded
            .iter()
            .filter(|(_, e)| e.iter().any(|(k, _)| *k == key))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in pids {
            if let Some(e) = self.loaded.get_mut(&pid) {
                e.retain(|(k, _)| *k != key);
            }
            if let Err(e) = self.write_entry(pid) {
                log::debug!("pid {pid}: cannot rewrite its unwind mappings: {e}");
            }
        }
    }
}
