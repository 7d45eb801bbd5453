//! The blocks live at a point of a dump: the one model of allocation identity the analyses
//! build on (leaks, check_leaks, decompose, rank_summary, inefficient, the OOM summary and the
//! OOM watch), each keeping its own facts about a block beside it.
//!
//! # Rules (the same for every analysis)
//! - A block is a `MALLOC` row of a pool (`PTA`, `HAL`, `HOST`) with a Ptr. Its identity is
//!   (Device Id, pool, Ptr): a `PTA` block carved at the start of a `HAL` segment is another
//!   block than the segment.
//! - A `MALLOC` at an identity already live replaces that block: its `FREE` was not recorded
//!   (filtered out, or lost with a process). The replaced block is handed back, so that the
//!   analysis takes it out of what it counts.
//! - A `FREE` ends the live block at its identity, unless both rows carry an `allocation_id`
//!   and the ids differ: then the `FREE` is of an earlier block at that address and ends
//!   nothing. A `FREE` of an identity not live (its `MALLOC` came before the dump, or was
//!   filtered out) ends nothing.
//! - Rows without a Ptr are no block's.

use super::fast_map::FastMap;
use crate::events::{DeviceId, Event, EventRow, EventType};

/// The memory pools blocks live in (the MALLOC/FREE Event Types).
pub fn is_pool(t: EventType) -> bool {
    matches!(t, EventType::Pta | EventType::Hal | EventType::Host)
}

/// A live block's identity: its device, pool and Ptr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockKey {
    pub device: DeviceId,
    pub pool: EventType,
    pub ptr: u64,
}

impl std::hash::Hash for BlockKey {
    /// One word: the Ptr with the device and pool folded into its top bits, which real
    /// addresses leave clear (equal words of different keys only share a bucket). The maps
    /// of live blocks hash one on every MALLOC and FREE row.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let device = match self.device {
            DeviceId::None => 0,
            DeviceId::Cpu => 1,
            DeviceId::Cuda(index) => 2 + u64::from(index),
        };
        state.write_u64(self.ptr ^ (device << 8 | self.pool as u64) << 48);
    }
}

/// What a row does to the live blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockChange {
    Malloc(BlockKey),
    Free(BlockKey),
}

impl BlockChange {
    /// The change `row` makes: `None` for a row that is no pool's MALLOC or FREE with a Ptr.
    pub fn of(row: &EventRow) -> Option<BlockChange> {
        let key = |ptr| BlockKey {
            device: row.device,
            pool: row.event_type,
            ptr,
        };
        match (row.event, row.ptr) {
            (Event::Malloc, Some(ptr)) if is_pool(row.event_type) => {
                Some(BlockChange::Malloc(key(ptr)))
            }
            (Event::Free, Some(ptr)) if is_pool(row.event_type) => {
                Some(BlockChange::Free(key(ptr)))
            }
            _ => None,
        }
    }

    /// The block the row is about.
    pub fn key(self) -> BlockKey {
        match self {
            BlockChange::Malloc(key) | BlockChange::Free(key) => key,
        }
    }
}

/// A live block: the analysis's value and the MALLOC's `allocation_id` ([`NO_ID`]: none),
/// kept in one word since at a few hundred thousand blocks every lookup misses the cache.
struct Entry<V> {
    allocation_id: u64,
    value: V,
}

/// The `allocation_id` of a block whose MALLOC had none (ids count up from 0 or 1).
const NO_ID: u64 = u64::MAX;

impl<V> Entry<V> {
    fn allocation_id(&self) -> Option<u64> {
        (self.allocation_id != NO_ID).then_some(self.allocation_id)
    }
}

/// The live blocks, each with the analysis's `V`.
pub struct LiveBlocks<V> {
    blocks: FastMap<BlockKey, Entry<V>>,
    /// Where each live block with an `allocation_id` is, when the analysis asked for it.
    by_allocation: Option<FastMap<u64, BlockKey>>,
}

impl<V> Default for LiveBlocks<V> {
    fn default() -> Self {
        LiveBlocks {
            blocks: FastMap::default(),
            by_allocation: None,
        }
    }
}

impl<V> LiveBlocks<V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Also finds blocks by their `allocation_id` ([`LiveBlocks::by_allocation_id`]).
    pub fn with_allocation_index() -> Self {
        LiveBlocks {
            blocks: FastMap::default(),
            by_allocation: Some(FastMap::default()),
        }
    }

    /// A MALLOC row's block becomes live; the block it replaces, if one was live there.
    pub fn allocate(&mut self, key: BlockKey, allocation_id: Option<u64>, value: V) -> Option<V> {
        let old = self.blocks.insert(
            key,
            Entry {
                allocation_id: allocation_id.unwrap_or(NO_ID),
                value,
            },
        );
        // Every new block is indexed, not only one that replaces another.
        if let Some(old) = &old {
            self.unindex(key, old.allocation_id());
        }
        self.index(key, allocation_id);
        old.map(|old| old.value)
    }

    /// A FREE row: the block it ends, if any (the module's rules).
    pub fn free(&mut self, key: BlockKey, allocation_id: Option<u64>) -> Option<V> {
        let entry = self.blocks.get(&key)?;
        if let (Some(live), Some(freed)) = (entry.allocation_id(), allocation_id) {
            if live != freed {
                return None;
            }
        }
        let old = self.blocks.remove(&key)?;
        self.unindex(key, old.allocation_id());
        Some(old.value)
    }

    fn index(&mut self, key: BlockKey, allocation_id: Option<u64>) {
        if let (Some(index), Some(id)) = (self.by_allocation.as_mut(), allocation_id) {
            index.insert(id, key);
        }
    }

    fn unindex(&mut self, key: BlockKey, allocation_id: Option<u64>) {
        if let (Some(index), Some(id)) = (self.by_allocation.as_mut(), allocation_id) {
            if index.get(&id) == Some(&key) {
                index.remove(&id);
            }
        }
    }

    /// Applies `row` if it is a MALLOC (with `value`) or FREE of a pool block: the block that
    /// left, and what the row did. `value` is only called for a MALLOC.
    pub fn apply(
        &mut self,
        row: &EventRow,
        value: impl FnOnce() -> V,
    ) -> Option<(BlockChange, Option<V>)> {
        let change = BlockChange::of(row)?;
        let allocation_id = row.attr_u64("allocation_id");
        let gone = match change {
            BlockChange::Malloc(key) => self.allocate(key, allocation_id, value()),
            BlockChange::Free(key) => self.free(key, allocation_id),
        };
        Some((change, gone))
    }

    pub fn get(&self, key: &BlockKey) -> Option<&V> {
        self.blocks.get(key).map(|e| &e.value)
    }

    pub fn get_mut(&mut self, key: &BlockKey) -> Option<&mut V> {
        self.blocks.get_mut(key).map(|e| &mut e.value)
    }

    /// The live block with this `allocation_id` (only with [`LiveBlocks::with_allocation_index`]).
    pub fn by_allocation_id(&mut self, id: u64) -> Option<(BlockKey, &mut V)> {
        let key = *self.by_allocation.as_ref()?.get(&id)?;
        self.blocks.get_mut(&key).map(|e| (key, &mut e.value))
    }

    /// The key of the live block at `ptr` on `device` in the first of `pools` that has one
    /// (rows that name an address but no pool: holders, accesses).
    pub fn key_at_address(
        &self,
        device: DeviceId,
        ptr: u64,
        pools: &[EventType],
    ) -> Option<BlockKey> {
        pools
            .iter()
            .map(|&pool| BlockKey { device, pool, ptr })
            .find(|key| self.blocks.contains_key(key))
    }

    /// The live block at `ptr` on `device` in the first of `pools` that has one.
    pub fn at_address(
        &self,
        device: DeviceId,
        ptr: u64,
        pools: &[EventType],
    ) -> Option<(BlockKey, &V)> {
        pools.iter().find_map(|&pool| {
            let key = BlockKey { device, pool, ptr };
            self.blocks.get(&key).map(|e| (key, &e.value))
        })
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The live blocks, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BlockKey, &V)> {
        self.blocks.iter().map(|(k, e)| (*k, &e.value))
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
        if let Some(index) = self.by_allocation.as_mut() {
            index.clear();
        }
    }

    /// Every live block, taken out, in no particular order.
    pub fn drain(&mut self) -> impl Iterator<Item = (BlockKey, V)> + '_ {
        if let Some(index) = self.by_allocation.as_mut() {
            index.clear();
        }
        self.blocks.drain().map(|(k, e)| (k, e.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(event: Event, pool: EventType, ptr: u64, allocation_id: Option<u64>) -> EventRow {
        let mut r = EventRow::new(event, pool, "N/A");
        r.device = DeviceId::Cuda(0);
        r.ptr = Some(ptr);
        if let Some(id) = allocation_id {
            r.attrs.insert("allocation_id".into(), id.into());
        }
        r
    }

    fn apply(live: &mut LiveBlocks<u32>, r: &EventRow, v: u32) -> Option<u32> {
        live.apply(r, || v).and_then(|(_, gone)| gone)
    }

    #[test]
    fn the_rules() {
        let mut live = LiveBlocks::with_allocation_index();
        // Two pools at one address are two blocks.
        assert_eq!(
            apply(
                &mut live,
                &row(Event::Malloc, EventType::Hal, 0x100, None),
                1
            ),
            None
        );
        assert_eq!(
            apply(
                &mut live,
                &row(Event::Malloc, EventType::Pta, 0x100, Some(7)),
                2
            ),
            None
        );
        assert_eq!(live.len(), 2);
        // A new block is found by its allocation id.
        assert_eq!(live.by_allocation_id(7).map(|(_, v)| *v), Some(2));
        // A second MALLOC replaces the block and hands it back.
        assert_eq!(
            apply(
                &mut live,
                &row(Event::Malloc, EventType::Pta, 0x100, Some(8)),
                3
            ),
            Some(2)
        );
        assert!(live.by_allocation_id(7).is_none());
        assert_eq!(live.by_allocation_id(8).map(|(_, v)| *v), Some(3));
        // A FREE of an earlier allocation at the address ends nothing; the right one does.
        assert_eq!(
            apply(
                &mut live,
                &row(Event::Free, EventType::Pta, 0x100, Some(7)),
                0
            ),
            None
        );
        assert_eq!(live.len(), 2);
        assert_eq!(
            apply(
                &mut live,
                &row(Event::Free, EventType::Pta, 0x100, Some(8)),
                0
            ),
            Some(3)
        );
        assert!(live.by_allocation_id(8).is_none());
        // A FREE without an id ends the block; one of nothing live ends nothing.
        assert_eq!(
            apply(&mut live, &row(Event::Free, EventType::Hal, 0x100, None), 0),
            Some(1)
        );
        assert_eq!(
            apply(&mut live, &row(Event::Free, EventType::Hal, 0x100, None), 0),
            None
        );
        assert!(live.is_empty());
        // Rows that are no pool's block change nothing.
        let access = row(Event::Access, EventType::Pta, 0x100, None);
        assert!(live.apply(&access, || 9).is_none());
        let mut no_ptr = row(Event::Malloc, EventType::Pta, 0, None);
        no_ptr.ptr = None;
        assert!(live.apply(&no_ptr, || 9).is_none());
        assert!(live.is_empty());
    }

    #[test]
    fn found_at_an_address_in_the_pools_asked() {
        let mut live = LiveBlocks::new();
        apply(
            &mut live,
            &row(Event::Malloc, EventType::Hal, 0x200, None),
            1,
        );
        apply(
            &mut live,
            &row(Event::Malloc, EventType::Host, 0x200, None),
            2,
        );
        let pools = [EventType::Pta, EventType::Host, EventType::Hal];
        let found = live.at_address(DeviceId::Cuda(0), 0x200, &pools);
        assert_eq!(found.map(|(k, v)| (k.pool, *v)), Some((EventType::Host, 2)));
        assert!(live.at_address(DeviceId::Cuda(1), 0x200, &pools).is_none());
    }
}
