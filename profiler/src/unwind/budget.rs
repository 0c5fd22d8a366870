//! The row budget of UNWIND_ROWS (`--unwind-memory`), used by the `loader`: which row ranges
//! hold a binary's table and which are free. Tables come and go (a binary evicted, another
//! loaded), so free space is kept as ranges, merged with their neighbours when freed, and
//! handed out first-fit.
use std::collections::BTreeMap;

/// Free ranges of a fixed array of rows.
#[derive(Debug)]
pub(crate) struct RowSpace {
    capacity: u32,
    /// start -> length, not overlapping, never adjacent (merged when freed).
    free: BTreeMap<u32, u32>,
}

impl RowSpace {
    pub(crate) fn new(capacity: u32) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self { capacity, free }
    }

    /// Rows in use.
    pub(crate) fn used(&self) -> u32 {
        self.capacity - self.free.values().sum::<u32>()
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The start of `len` free rows, now taken; None when no free range is that long.
    pub(crate) fn alloc(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let (&start, &have) = self.free.iter().find(|(_, l)| **l >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        Some(start)
    }

    /// Gives back rows `start..start + len` (taken by `alloc`).
    pub(crate) fn release(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let (mut start, mut len) = (start, len);
        if let Some((&prev, &plen)) = self.free.range(..start).next_back()
            && prev + plen == start
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&nlen) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nlen;
        }
        debug_assert!(start + len <= self.capacity);
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_ranges_merge_and_are_reused() {
        let mut s = RowSpace::new(100);
        let a = s.alloc(30).unwrap();
        let b = s.alloc(30).unwrap();
        let c = s.alloc(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(s.alloc(20), None, "only 10 rows are left");
        assert_eq!(s.used(), 90);
        s.release(a, 30);
        s.release(c, 30);
        // 0..30 and 60..100 are free, not one range of 70.
        assert_eq!(s.alloc(50), None);
        s.release(b, 30);
        assert_eq!(s.used(), 0);
        assert_eq!(s.alloc(100), Some(0), "all three merged into one range");
    }

    #[test]
    fn first_fit_splits_a_range() {
        let mut s = RowSpace::new(10);
        assert_eq!(s.alloc(4), Some(0));
        assert_eq!(s.alloc(4), Some(4));
        s.release(0, 4);
        assert_eq!(s.alloc(2), Some(0));
        assert_eq!(s.alloc(2), Some(2));
        assert_eq!(s.alloc(2), Some(8));
        assert_eq!(s.alloc(1), None);
        assert_eq!(s.alloc(0), None);
    }
}
