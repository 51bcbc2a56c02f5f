//! Handle tables: every C handle is an opaque tagged index into one of these, never a
//! pointer to Rust memory, so a null, stale (destroyed) or mistyped handle is detected and
//! answered with `FRT_ERR_INVALID` instead of being dereferenced.
//!
//! A handle is `tag << 56 | generation << 32 | (index + 1)`. The generation changes each time
//! a slot is reused, so a handle to a destroyed object never aliases a new one (until the
//! 24-bit generation wraps, after 16 million reuses of the same slot).

use std::ffi::c_void;
use std::sync::{Arc, RwLock};

struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

pub struct Registry<T> {
    tag: u8,
    table: RwLock<Table<T>>,
}

const GEN_MASK: u32 = 0x00FF_FFFF;

impl<T> Registry<T> {
    pub const fn new(tag: u8) -> Self {
        Registry {
            tag,
            table: RwLock::new(Table {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    fn encode(&self, index: u32, generation: u32) -> *mut c_void {
        let h = (u64::from(self.tag) << 56)
            | (u64::from(generation & GEN_MASK) << 32)
            | (u64::from(index) + 1);
        h as usize as *mut c_void
    }

    fn decode(&self, h: *const c_void) -> Option<(usize, u32)> {
        let h = h as usize as u64;
        if h == 0 || (h >> 56) as u8 != self.tag {
            return None;
        }
        let low = (h & 0xFFFF_FFFF) as u32;
        if low == 0 {
            return None;
        }
        Some(((low - 1) as usize, ((h >> 32) as u32) & GEN_MASK))
    }

    pub fn insert(&self, value: T) -> *mut c_void {
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        let value = Some(Arc::new(value));
        match t.free.pop() {
            Some(i) => {
                let slot = &mut t.slots[i as usize];
                slot.generation = (slot.generation + 1) & GEN_MASK;
                slot.value = value;
                let g = slot.generation;
                self.encode(i, g)
            }
            None => {
                t.slots.push(Slot {
                    generation: 0,
                    value,
                });
                let i = (t.slots.len() - 1) as u32;
                self.encode(i, 0)
            }
        }
    }

    pub fn get(&self, h: *const c_void) -> Option<Arc<T>> {
        let (i, g) = self.decode(h)?;
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        let slot = t.slots.get(i)?;
        if slot.generation != g {
            return None;
        }
        slot.value.clone()
    }

    pub fn remove(&self, h: *const c_void) -> Option<Arc<T>> {
        let (i, g) = self.decode(h)?;
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        let slot = t.slots.get_mut(i)?;
        if slot.generation != g || slot.value.is_none() {
            return None;
        }
        let v = slot.value.take();
        t.free.push(i as u32);
        v
    }

    /// The handle of the first entry for which `pred` holds.
    pub fn find_handle(&self, pred: impl Fn(&T) -> bool) -> Option<*mut c_void> {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        t.slots
            .iter()
            .enumerate()
            .find(|(_, s)| s.value.as_deref().is_some_and(&pred))
            .map(|(i, s)| self.encode(i as u32, s.generation))
    }

    /// Removes every entry for which `pred` holds; returns them (to be dropped by the caller,
    /// outside the table's lock).
    pub fn remove_where(&self, pred: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut freed = Vec::new();
        for (i, slot) in t.slots.iter_mut().enumerate() {
            if slot.value.as_deref().is_some_and(&pred) {
                out.extend(slot.value.take());
                freed.push(i as u32);
            }
        }
        t.free.extend(freed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_null_and_mistyped_handles_miss() {
        let a: Registry<u32> = Registry::new(1);
        let b: Registry<u32> = Registry::new(2);
        let h = a.insert(5);
        assert_eq!(a.get(h).as_deref(), Some(&5));
        assert!(b.get(h).is_none(), "another type's table");
        assert!(a.get(std::ptr::null()).is_none());
        assert!(a.get(0xdead_beef as *const c_void).is_none());
        assert_eq!(a.remove(h).as_deref(), Some(&5));
        assert!(a.get(h).is_none(), "destroyed");
        assert!(a.remove(h).is_none(), "destroyed twice");
        let h2 = a.insert(6);
        assert_ne!(h, h2, "a reused slot gets a new handle");
        assert!(a.get(h).is_none());
        assert_eq!(a.get(h2).as_deref(), Some(&6));
        let gone = a.remove_where(|v| *v == 6);
        assert_eq!(gone.len(), 1);
        assert!(a.get(h2).is_none());
    }
}
