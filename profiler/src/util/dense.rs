//! Interning, used at every stage that stores a value once and refers to it by number
//! (collect's raw stacks and JIT names, the profile's strings, frames, binaries and stacks,
//! the outputs' roots and heat-map keys), and the one fast hasher for keys we made ourselves.
use std::{
    borrow::Borrow,
    collections::HashMap,
    hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState},
};

/// Values stored once each and numbered densely in first-seen order, so a `u32` stands for
/// the value and `items()[id]` gives it back.
#[derive(Clone, Debug)]
pub(crate) struct Dense<K, S = RandomState> {
    ids: HashMap<K, u32, S>,
    items: Vec<K>,
}

impl<K, S: Default> Default for Dense<K, S> {
    fn default() -> Self {
        Self {
            ids: HashMap::default(),
            items: Vec::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> Dense<K, S> {
    /// The id of `key`, stored on first sight.
    pub(crate) fn intern(&mut self, key: K) -> u32 {
        let next = self.items.len() as u32;
        *self.ids.entry(key.clone()).or_insert_with(|| {
            self.items.push(key);
            next
        })
    }

    /// The id of `key` if it was interned.
    pub(crate) fn id<Q>(&self, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ids.get(key).copied()
    }

    /// `intern` for a borrowed key (a `&str` for a `String`): no allocation when it is known.
    pub(crate) fn intern_ref<Q>(&mut self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.id(key) {
            Some(id) => id,
            None => self.intern(key.to_owned()),
        }
    }
}

impl<K, S> Dense<K, S> {
    /// Every value, by id.
    pub(crate) fn items(&self) -> &[K] {
        &self.items
    }

    pub(crate) fn into_items(self) -> Vec<K> {
        self.items
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

impl<K, S> std::ops::Index<u32> for Dense<K, S> {
    type Output = K;

    fn index(&self, id: u32) -> &K {
        &self.items[id as usize]
    }
}

/// FxHash (rustc's): for keys we made (small integers, ids) and pids (the kernel hands them
/// out in order: no process picks its own), where flooding is no concern and SipHash would
/// dominate a pass over millions of samples, or the agent's drain under churn.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A `HashMap` with `FxHasher`.
pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with `FxHasher`.
pub(crate) type FxSet<K> = std::collections::HashSet<K, BuildHasherDefault<FxHasher>>;
/// A `Dense` with `FxHasher`.
pub(crate) type FxDense<K> = Dense<K, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_in_first_seen_order_and_stable() {
        let mut d: Dense<String> = Dense::default();
        assert_eq!(d.intern_ref("b"), 0);
        assert_eq!(d.intern("a".to_owned()), 1);
        assert_eq!(d.intern_ref("b"), 0);
        assert_eq!(d.items(), ["b", "a"]);
        assert_eq!(d[1], "a");
        assert_eq!(d.len(), 2);
    }

    #[test]
    fn fx_hashes_small_keys_apart() {
        use std::hash::BuildHasher as _;
        let build = BuildHasherDefault::<FxHasher>::default();
        let mut hashes: Vec<u64> = (0..1000u32)
            .map(|i| build.hash_one((i % 10, i / 10)))
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), 1000);
    }
}
