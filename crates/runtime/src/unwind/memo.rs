//! Memoized unwinding. The unwinder is a pure function of its starting registers (pc, sp, bp)
//! and of the stack words it reads. When a hook is entered again with the same sp (and an
//! equivalent bp) and every word the last walk read still holds the same value, the walk would
//! produce the same frames, so they are copied instead of recomputed. Checking is a handful of
//! loads and compares; a loop that allocates from one call site hits every time.

use super::capture::CapturedStack;

const SLOTS: usize = 16;
/// Walks that read more words than this are not memoized.
const MAX_READS: usize = 48;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MemoKey {
    /// The module snapshot the walk used: a module change invalidates every entry.
    pub snapshot: usize,
    pub sp: u64,
    pub bp: u64,
}

/// The stack words one walk read, in order.
pub struct ReadLog {
    reads: [(u64, u64); MAX_READS],
    len: usize,
    overflowed: bool,
}

impl ReadLog {
    pub fn new() -> ReadLog {
        ReadLog {
            reads: [(0, 0); MAX_READS],
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

    /// A read outside the stack bounds: it fails the same way for the same key.
    #[inline]
    pub fn push_failed(&mut self) {}
}

struct Entry {
    key: MemoKey,
    reads: [(u64, u64); MAX_READS],
    n_reads: usize,
    stack: CapturedStack,
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

    /// Copies the memoized frames into `out` when the entry for `key` is still valid.
    #[inline]
    pub fn lookup(&self, key: &MemoKey, out: &mut CapturedStack) -> bool {
        let Some(entry) = &self.entries[Self::slot(key)] else {
            return false;
        };
        if entry.key != *key {
            return false;
        }
        for &(addr, value) in &entry.reads[..entry.n_reads] {
            // SAFETY: every recorded address was inside this thread's stack, at or above the
            // same sp as now, so it is mapped and readable.
            if unsafe { *(addr as *const u64) } != value {
                return false;
            }
        }
        *out = entry.stack;
        true
    }

    pub fn store(&mut self, key: MemoKey, log: &ReadLog, stack: &CapturedStack) {
        if log.overflowed {
            return;
        }
        self.entries[Self::slot(&key)] = Some(Entry {
            key,
            reads: log.reads,
            n_reads: log.len,
            stack: *stack,
        });
    }
}
