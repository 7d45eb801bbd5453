//! Memoized unwinding. The unwinder is a pure function of its starting registers (pc, sp, bp)
//! and of the stack words it reads. When a hook is entered again with the same sp (and an
//! equivalent bp) and every word the last walk read still holds an equivalent value, the walk
//! would produce the same frames, so they are reused instead of recomputed. Checking is a
//! handful of loads and compares; a loop that allocates from one call site hits every time.
//!
//! "Equivalent": return addresses must be equal. A saved frame pointer only matters as an
//! address the unwinder may read: every value outside the stack (a heap pointer or a counter
//! in code built without frame pointers) makes such reads fail alike, so those values form one
//! class. Each entry also carries a tag the caller may use to remember what it derived from the
//! stack (the ledger keeps the stack's id there).

use super::capture::CapturedStack;

const SLOTS: usize = 16;
/// Walks that read more words than this are not memoized.
const MAX_READS: usize = 48;
/// Values this far below the stack pointer may still reach the stack once offset by a rule.
const BELOW_STACK_MARGIN: u64 = 4096;

/// The stack range a walk may read, and the classes of values it reads there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StackRange {
    pub low: u64,
    pub high: u64,
    /// Reads must be checked (a stack the program switched to; see capture.rs).
    pub checked: bool,
}

impl StackRange {
    /// Values a frame pointer may hold that could lead a read into the stack stay themselves;
    /// all others are one class.
    #[inline]
    pub fn class_of(&self, value: u64) -> u64 {
        // One unsigned compare for "low - margin <= value < high", without branches: this runs
        // for every checked read of every memoized allocation.
        let low = self.low.saturating_sub(BELOW_STACK_MARGIN);
        let in_stack = value.wrapping_sub(low) < self.high.wrapping_sub(low);
        if value == 0 || in_stack {
            value
        } else {
            OUTSIDE
        }
    }
}

/// The class of every value a walk cannot follow into the stack.
const OUTSIDE: u64 = u64::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MemoKey {
    /// The module snapshot the walk used: a module change invalidates every entry.
    pub snapshot: usize,
    pub sp: u64,
    /// The starting frame pointer's class.
    pub bp: u64,
    /// Where the walk was told to end (the start of the code range it ends at; 0: nowhere).
    pub stop: u64,
}

/// The stack words one walk read, in order.
pub struct ReadLog {
    reads: [(u64, u64); MAX_READS],
    exact: [bool; MAX_READS],
    len: usize,
    overflowed: bool,
}

impl ReadLog {
    pub fn new() -> ReadLog {
        ReadLog {
            reads: [(0, 0); MAX_READS],
            exact: [true; MAX_READS],
            len: 0,
            overflowed: false,
        }
    }

    #[inline]
    pub fn push(&mut self, addr: u64, value: u64) {
        if self.len == MAX_READS {
            self.overflowed = true;
        } else {
            self.reads[self.len] = (addr, value);
            self.len += 1;
        }
    }

    /// After the walk: reads that produced a frame's return address must match exactly; the
    /// others (saved frame pointers) only by class. A class other than "outside the stack" has
    /// one member, so those reads are exact too.
    /// Orders the reads for checking: the exact ones first, then those that must only stay
    /// outside the stack. Returns how many are exact.
    fn classify(&mut self, frames: &[u64], range: StackRange) -> usize {
        for i in 0..self.len {
            let value = self.reads[i].1;
            self.exact[i] = frames.contains(&value) || range.class_of(value) != OUTSIDE;
        }
        let mut exact = 0;
        for i in 0..self.len {
            if self.exact[i] {
                self.reads.swap(i, exact);
                self.exact.swap(i, exact);
                exact += 1;
            }
        }
        exact
    }
}

pub struct Entry {
    key: MemoKey,
    range: StackRange,
    /// The reads to check: `reads[..n_exact]` must hold exactly the same values,
    /// `reads[n_exact..n_reads]` values outside the stack.
    reads: [(u64, u64); MAX_READS],
    n_exact: usize,
    n_reads: usize,
    pub stack: CapturedStack,
    /// Free for the caller: 0 when the entry is new.
    pub tag: u64,
}

pub struct Memo {
    entries: [Option<Entry>; SLOTS],
}

impl Memo {
    pub fn new() -> Memo {
        Memo {
            entries: std::array::from_fn(|_| None),
        }
    }

    #[inline]
    fn slot(key: &MemoKey) -> usize {
        ((key.sp >> 4) as usize ^ (key.sp >> 12) as usize) % SLOTS
    }

    /// The slot of the entry for `key` if the stack still reads the same.
    #[inline]
    pub fn lookup(&self, key: &MemoKey, range: StackRange) -> Option<usize> {
        if range.checked {
            // A stack the program switched to: its words are read only through the kernel's
            // checks, which the direct reads below skip.
            return None;
        }
        let slot = Self::slot(key);
        let entry = self.entries[slot].as_ref()?;
        if entry.key != *key || entry.range != range {
            return None;
        }
        let reads = entry.reads.get(..entry.n_reads)?;
        let (exact, classed) = reads.split_at(entry.n_exact.min(reads.len()));
        // SAFETY (both loops): every recorded address was inside this thread's stack range, at
        // or above the same sp as now, so it is mapped and readable.
        for &(addr, expected) in exact {
            // SAFETY: see above.
            if unsafe { *(addr as *const u64) } != expected {
                return None;
            }
        }
        for &(addr, _) in classed {
            // SAFETY: see above.
            if range.class_of(unsafe { *(addr as *const u64) }) != OUTSIDE {
                return None;
            }
        }
        Some(slot)
    }

    /// The entry in `slot` (from [`Memo::lookup`]).
    #[inline]
    pub fn entry(&mut self, slot: usize) -> Option<&mut Entry> {
        self.entries[slot].as_mut()
    }

    /// Remembers a walk; returns the new entry, or `None` when the walk cannot be memoized.
    pub fn store(
        &mut self,
        key: MemoKey,
        range: StackRange,
        mut log: ReadLog,
        stack: &CapturedStack,
    ) -> Option<&mut Entry> {
        if log.overflowed {
            return None;
        }
        let n_exact = log.classify(stack.as_slice(), range);
        let slot = &mut self.entries[Self::slot(&key)];
        *slot = Some(Entry {
            key,
            range,
            reads: log.reads,
            n_exact,
            n_reads: log.len,
            stack: *stack,
            tag: 0,
        });
        slot.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_keep_stack_values_and_merge_the_rest() {
        let range = StackRange {
            low: 0x10_000,
            high: 0x20_000,
            checked: false,
        };
        assert_eq!(range.class_of(0x18_000), 0x18_000);
        assert_eq!(range.class_of(0x10_000 - 16), 0x10_000 - 16);
        assert_eq!(range.class_of(0), 0);
        assert_eq!(range.class_of(0x20_000), u64::MAX);
        assert_eq!(range.class_of(0x5555_0000), u64::MAX);
        assert_eq!(range.class_of(7), u64::MAX);
    }

    /// A fake stack: the memo must hit while the words read are unchanged, miss when a return
    /// address changes, and hit when only a saved non-stack frame pointer changes.
    #[test]
    fn validates_reads() {
        let mut words = vec![0u64; 64];
        let base = words.as_ptr() as u64;
        let range = StackRange {
            low: base,
            high: base + 64 * 8,
            checked: false,
        };
        words[3] = 0x4000_1234; // a return address
        words[5] = 0xdead_beef_0000; // a saved rbp holding heap data
        let key = MemoKey {
            snapshot: 1,
            sp: base,
            bp: u64::MAX,
            stop: 0,
        };
        let mut stack = CapturedStack::empty();
        stack.frames[0] = 0x4000_1234;
        stack.len = 1;
        let mut log = ReadLog::new();
        log.push(base + 3 * 8, words[3]);
        log.push(base + 5 * 8, words[5]);
        let mut memo = Memo::new();
        memo.store(key, range, log, &stack).unwrap().tag = 42;
        let tag = |memo: &mut Memo| {
            memo.lookup(&key, range)
                .and_then(|s| memo.entry(s))
                .map(|e| e.tag)
        };
        assert_eq!(tag(&mut memo), Some(42));
        words[5] = 0xfeed_0000_0000;
        assert_eq!(tag(&mut memo), Some(42));
        words[5] = base + 8; // now a stack address: different class
        assert!(memo.lookup(&key, range).is_none());
        words[5] = 0xfeed_0000_0000;
        words[3] = 0x4000_9999;
        assert!(memo.lookup(&key, range).is_none());
        let other_sp = MemoKey {
            sp: base + 8,
            ..key
        };
        assert!(memo.lookup(&other_sp, range).is_none());
        std::hint::black_box(&words);
    }
}
