//! A key → value table with least-recently-used order; `get_touch`, `insert`, `remove` and
//! `pop_lru` are O(1). Used for a graph's variant table.
//!
//! Entries live in a slab (`Vec<Slot>`) threaded by an intrusive doubly linked list (most
//! recent at `head`); a hash map finds a key's slot. Touching an entry relinks two indices and
//! never allocates.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const NIL: usize = usize::MAX;

/// Hasher for u64 keys: one multiply (Fibonacci hashing). Keys are caller-chosen integers
/// (positions, step indices), not attacker-controlled.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

struct Slot<V> {
    key: u64,
    value: Option<V>,
    prev: usize,
    next: usize,
}

pub(crate) struct LruTable<V> {
    map: HashMap<u64, usize, BuildHasherDefault<KeyHasher>>,
    slots: Vec<Slot<V>>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
}

impl<V> LruTable<V> {
    pub fn with_capacity(cap: usize) -> Self {
        LruTable {
            map: HashMap::with_capacity_and_hasher(cap, Default::default()),
            slots: Vec::with_capacity(cap),
            free: Vec::with_capacity(cap),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// Looks a key up and marks it most recently used.
    pub fn get_touch(&mut self, key: u64) -> Option<&V> {
        let i = *self.map.get(&key)?;
        self.unlink(i);
        self.push_front(i);
        self.slots[i].value.as_ref()
    }

    /// Inserts or replaces; the entry becomes most recently used. Returns the replaced value.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if let Some(&i) = self.map.get(&key) {
            let old = self.slots[i].value.replace(value);
            self.unlink(i);
            self.push_front(i);
            return old;
        }
        let slot = Slot {
            key,
            value: Some(value),
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.map.insert(key, i);
        self.push_front(i);
        None
    }

    pub fn remove(&mut self, key: u64) -> Option<V> {
        let i = self.map.remove(&key)?;
        self.unlink(i);
        self.free.push(i);
        self.slots[i].value.take()
    }

    /// Removes the least recently used entry.
    pub fn pop_lru(&mut self) -> Option<(u64, V)> {
        if self.tail == NIL {
            return None;
        }
        let key = self.slots[self.tail].key;
        self.remove(key).map(|v| (key, v))
    }

    /// Keys from most to least recently used.
    pub fn keys_mru(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        let mut i = self.head;
        while i != NIL {
            out.push(self.slots[i].key);
            i = self.slots[i].next;
        }
        out
    }

    /// Removes every entry, returning the values.
    pub fn drain(&mut self) -> Vec<V> {
        self.map.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.slots.drain(..).filter_map(|s| s.value).collect()
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.slots[i].prev, self.slots[i].next);
        if prev != NIL {
            self.slots[prev].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.slots[next].prev = prev;
        } else {
            self.tail = prev;
        }
        self.slots[i].prev = NIL;
        self.slots[i].next = NIL;
    }

    fn push_front(&mut self, i: usize) {
        self.slots[i].prev = NIL;
        self.slots[i].next = self.head;
        if self.head != NIL {
            self.slots[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_follows_use() {
        let mut t = LruTable::with_capacity(4);
        for k in [1u64, 2, 3] {
            t.insert(k, k * 10);
        }
        assert_eq!(t.keys_mru(), vec![3, 2, 1]);
        assert_eq!(t.get_touch(1), Some(&10));
        assert_eq!(t.keys_mru(), vec![1, 3, 2]);
        assert_eq!(t.pop_lru(), Some((2, 20)));
        assert_eq!(t.keys_mru(), vec![1, 3]);
        assert_eq!(t.insert(3, 33), Some(30));
        assert_eq!(t.keys_mru(), vec![3, 1]);
        assert_eq!(t.remove(1), Some(10));
        assert_eq!(t.remove(1), None);
        assert_eq!(t.get_touch(9), None);
        assert_eq!(t.len(), 1);
        t.insert(7, 70);
        t.insert(8, 80);
        assert_eq!(t.keys_mru(), vec![8, 7, 3]);
        assert_eq!(t.pop_lru(), Some((3, 33)));
        assert_eq!(t.pop_lru(), Some((7, 70)));
        assert_eq!(t.pop_lru(), Some((8, 80)));
        assert_eq!(t.pop_lru(), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn slots_are_reused() {
        let mut t = LruTable::with_capacity(2);
        for k in 0..1000u64 {
            t.insert(k, k);
            if t.len() > 2 {
                t.pop_lru();
            }
        }
        assert_eq!(t.slots.len(), 3);
        assert_eq!(t.keys_mru(), vec![999, 998]);
    }
}
