//! One block-table shard's map from a block's address to its [`Block`]: open addressing with
//! linear probing and backward-shift deletion (no tombstones, so a churning program never
//! degrades the probe lengths).
//!
//! Written for the allocation hot path, where a general-purpose map costs several times more:
//! the key is the address itself (never 0, which marks an empty slot), a slot is the key and its
//! block side by side (one cache line for most probes), and growing never aborts the program: a
//! map that cannot get memory reports itself full, and the block goes to the overflow ledger.

use super::block_table::Block;
use crate::hashing::mix;

/// An empty slot's key: no block lives at address 0.
const EMPTY: usize = 0;
/// The smallest table allocated once the first block arrives.
const MIN_SLOTS: usize = 64;

#[derive(Clone, Copy)]
struct Slot {
    key: usize,
    block: Block,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 24);

const VACANT: Slot = Slot {
    key: EMPTY,
    block: Block {
        size: 0,
        alloc_ms: 0,
        stack: 0,
    },
};

#[derive(Default)]
pub struct BlockMap {
    /// A power of two in length, or empty before the first block.
    slots: Vec<Slot>,
    len: usize,
}

/// Why a block could not be stored.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfMemory;

impl BlockMap {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot where probing for `key` starts. Blocks are at least 16-byte aligned.
    #[inline]
    fn home(&self, key: usize) -> usize {
        mix((key >> 4) as u64) as usize & self.mask()
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline(always)]
    fn probe(&self, key: usize) -> usize {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].key;
            if k == key || k == EMPTY {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    pub fn contains_key(&self, key: usize) -> bool {
        key != EMPTY && !self.slots.is_empty() && self.slots[self.probe(key)].key == key
    }

    /// Stores `block` at `key`; returns the block it replaced. `key` 0 is never stored.
    #[inline]
    pub fn insert(&mut self, key: usize, block: Block) -> Result<Option<Block>, OutOfMemory> {
        if key == EMPTY {
            return Ok(None);
        }
        // At most three quarters full, so every probe meets an empty slot soon.
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow()?;
        }
        let i = self.probe(key);
        let slot = &mut self.slots[i];
        if slot.key == key {
            return Ok(Some(std::mem::replace(&mut slot.block, block)));
        }
        *slot = Slot { key, block };
        self.len += 1;
        Ok(None)
    }

    /// Takes the block at `key` out of the map.
    #[inline(always)]
    pub fn remove(&mut self, key: usize) -> Option<Block> {
        if key == EMPTY || self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut hole = self.probe(key);
        if self.slots[hole].key != key {
            return None;
        }
        let removed = self.slots[hole].block;
        self.len -= 1;
        // Backward shift: move later members of the probe run into the hole when their home
        // does not lie cyclically within (hole, i], so that every key stays reachable from its
        // home without crossing an empty slot.
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let k = self.slots[i].key;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[i];
                hole = i;
            }
        }
        self.slots[hole] = VACANT;
        Some(removed)
    }

    /// Doubles the table (or allocates the first), rehashing every block into it.
    #[cold]
    fn grow(&mut self) -> Result<(), OutOfMemory> {
        let new_len = (self.slots.len() * 2).max(MIN_SLOTS);
        let mut slots = Vec::new();
        slots.try_reserve_exact(new_len).map_err(|_| OutOfMemory)?;
        slots.resize(new_len, VACANT);
        let old = std::mem::replace(&mut self.slots, slots);
        for slot in old.into_iter().filter(|s| s.key != EMPTY) {
            let i = self.probe(slot.key);
            self.slots[i] = slot;
        }
        Ok(())
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &Block)> {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (s.key, &s.block))
    }

    pub fn values(&self) -> impl Iterator<Item = &Block> {
        self.iter().map(|(_, b)| b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn block(n: u64) -> Block {
        Block {
            size: n,
            alloc_ms: n as u32,
            stack: (n % 7) as u32,
        }
    }

    /// Random inserts, replacements and removals agree with a std HashMap at every step,
    /// including keys that collide in their home slot.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut map = BlockMap::default();
        let mut model: HashMap<usize, Block> = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A small key space, 16-aligned, so inserts replace and removals hit often.
            let key = ((x % 3000) as usize + 1) << 4;
            if x & 3 == 0 {
                assert_eq!(map.remove(key), model.remove(&key), "step {step}");
            } else {
                let b = block(step);
                assert_eq!(map.insert(key, b), Ok(model.insert(key, b)), "step {step}");
            }
            assert_eq!(map.len(), model.len());
        }
        for (&k, b) in &model {
            assert!(map.contains_key(k));
            assert_eq!(
                map.iter().find(|(key, _)| *key == k).map(|(_, b)| *b),
                Some(*b)
            );
        }
        assert_eq!(map.iter().count(), model.len());
        // Emptied completely, it holds nothing.
        for k in model.keys() {
            assert!(map.remove(*k).is_some());
        }
        assert!(map.is_empty());
        assert_eq!(map.iter().count(), 0);
    }

    #[test]
    fn null_is_never_a_block() {
        let mut map = BlockMap::default();
        assert_eq!(map.insert(0, block(1)), Ok(None));
        assert!(!map.contains_key(0));
        assert_eq!(map.remove(0), None);
        assert_eq!(map.len(), 0);
    }
}
