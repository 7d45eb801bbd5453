//! A per-thread memory of recently seen stacks and their ids, so an allocation from a known
//! call site finds its stack id without hashing the key or taking a shared lock. An entry is
//! valid only for the stack-table generation it was filled in (recycling changes ids).

use std::cell::UnsafeCell;

use crate::unwind::CapturedStack;

const SLOTS: usize = 64;

#[derive(Clone, Copy)]
struct Entry {
    stack: CapturedStack,
    id: u32,
    generation: u64,
}

thread_local! {
    static CACHE: UnsafeCell<Option<Box<[Option<Entry>; SLOTS]>>> = const { UnsafeCell::new(None) };
}

#[inline]
fn slot(stack: &CapturedStack) -> usize {
    let first = stack.frames[0] ^ (stack.frames[1] >> 3) ^ stack.len as u64;
    (super::hashing::mix(first) as usize) % SLOTS
}

/// The id this thread last used for `stack`, if still valid in `generation`.
#[inline]
pub fn lookup(stack: &CapturedStack, generation: u64) -> Option<u32> {
    CACHE
        .try_with(|cell| {
            // SAFETY: only this thread touches its cache, never re-entrantly (guard held).
            let cache = unsafe { &*cell.get() }.as_ref()?;
            let entry = cache[slot(stack)].as_ref()?;
            (entry.generation == generation && entry.stack.as_slice() == stack.as_slice())
                .then_some(entry.id)
        })
        .ok()
        .flatten()
}

pub fn remember(stack: &CapturedStack, id: u32, generation: u64) {
    let _ = CACHE.try_with(|cell| {
        // SAFETY: as in `lookup`.
        let cache = unsafe { &mut *cell.get() }.get_or_insert_with(|| Box::new([None; SLOTS]));
        cache[slot(stack)] = Some(Entry {
            stack: *stack,
            id,
            generation,
        });
    });
}
