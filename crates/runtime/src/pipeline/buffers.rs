//! Per-thread event buffers: each producing thread queues its rows in buffers of its own, and
//! the writer thread drains every thread's.
//!
//! The hot producers (the PyTorch capture, through the C ABI) queue a packed row: its numbers,
//! and its texts copied into the arena of the thread's current [`Chunk`]. A chunk has a fixed
//! size and is filled by one thread only, which publishes each row with a release store of the
//! chunk's row count; the writer reads the published rows behind it. Queueing such a row so
//! takes no lock, no read-modify-write and no heap allocation on the program's thread: each
//! locked instruction is a full fence, and on the thread of a busy PyTorch program the fence
//! of a per-row lock, waiting for the row's stores, cost more than the rest of the row. The
//! row's strings are made (and freed) on the writer's thread. A full chunk goes to the writer
//! through the thread's hand-off lock, which also hands back the chunks the writer emptied.
//!
//! Rarer producers (steps, marks, the OOM watch) and rows too large for a chunk queue a whole
//! [`EventRow`] through the hand-off lock.
//!
//! [`packed`] packs and unpacks rows; this module holds each thread's buffer and its hand-off
//! lock; [`backlog`] is the writer's side.

mod backlog;
mod packed;
#[cfg(test)]
mod tests;

use std::cell::{Cell, OnceCell};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::events::EventRow;

pub use backlog::Backlog;
use packed::Chunk;
pub use packed::{Attrs, Numbers, OpRow, Texts};

/// A row and its sequence number: rows with equal timestamps are written in the order of
/// their sequence numbers, which count each thread's rows in the order it queued them.
pub struct Queued {
    pub seq: u64,
    pub row: EventRow,
    /// Raw C frames to symbolize in the writer, when the C stack was asked for.
    pub c_frames: Vec<u64>,
    /// The Attr text's storage while the row has none. The writer reads every packed row into
    /// one `Queued`: a string dropped at each row without an Attr (an op's) was allocated again
    /// at the next row with one. glibc's per-thread cache hands a thread blocks that other
    /// threads allocated, so that churn freed and grew blocks of the program's arena, taking
    /// the lock the program's own allocations take: on a PyTorch CPU training loop it was
    /// nearly every contended wait on that lock.
    pub attrs_spare: String,
}

/// What passes between a thread and the writer under the thread's hand-off lock. Chunks stay
/// boxed: the thread's `current` points at one, wherever it is listed.
#[derive(Default)]
#[allow(clippy::vec_box)]
struct Handoff {
    /// Chunks the thread filled, oldest first.
    full: Vec<Box<Chunk>>,
    /// Chunks the writer emptied.
    free: Vec<Box<Chunk>>,
    /// Whole rows.
    rows: Vec<Queued>,
    /// Chunks mapped for the thread so far (a busy thread in a steady state maps none).
    #[cfg(test)]
    mapped: usize,
}

#[derive(Default)]
pub struct ThreadBuffer {
    /// The chunk the thread fills now (null before its first packed row). Set by the thread,
    /// under the hand-off lock; owned by this buffer.
    current: AtomicPtr<Chunk>,
    handoff: Mutex<Handoff>,
}

impl ThreadBuffer {
    fn current(&self) -> Option<&Chunk> {
        let ptr = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null `current` came from `Box::into_raw` and is freed only when the
        // buffer is dropped (its thread has ended, and the writer holds the last reference).
        (!ptr.is_null()).then(|| unsafe { &*ptr })
    }

    /// The thread: hands its full chunk (if any) to the writer and makes a fresh one current;
    /// `None` when no chunk can be had.
    fn rotate(&self) -> Option<&Chunk> {
        let mut handoff = self.handoff.lock().ok()?;
        let fresh = match handoff.free.pop() {
            Some(chunk) => chunk,
            None => {
                let chunk = Chunk::new()?;
                #[cfg(test)]
                {
                    handoff.mapped += 1;
                }
                chunk
            }
        };
        handoff.full.try_reserve(1).ok()?;
        let old = self.current.load(Ordering::Relaxed);
        if !old.is_null() {
            // SAFETY: `old` came from `Box::into_raw`; it is the writer's from now on.
            handoff.full.push(unsafe { Box::from_raw(old) });
        }
        let fresh = Box::into_raw(fresh);
        self.current.store(fresh, Ordering::Release);
        drop(handoff);
        // SAFETY: just made current; freed only with the buffer.
        Some(unsafe { &*fresh })
    }

    /// The thread: queues a row with `push` into the current chunk, or into a fresh one when
    /// the current one is full and the row `fits` an empty chunk.
    #[inline(always)]
    fn push_with(&self, fits: bool, push: impl Fn(&Chunk) -> bool) -> bool {
        if self.current().is_some_and(&push) {
            return true;
        }
        fits && self.rotate().is_some_and(push)
    }

    /// The thread: queues a packed row.
    fn push_packed(&self, seq: u64, numbers: Numbers, texts: &Texts, frames: &[u64]) -> bool {
        self.push_with(Chunk::holds(texts, frames), |chunk| {
            chunk.push(seq, numbers, texts, frames)
        })
    }

    /// The thread: queues an op row (see [`Chunk::push_op`]).
    fn push_op(&self, seq: u64, op: &OpRow) -> bool {
        self.push_with(u16::try_from(op.name.len()).is_ok(), |chunk| {
            chunk.push_op(seq, op)
        })
    }

    /// The thread: queues a whole row (given back when it cannot be queued).
    fn push_row(&self, q: Queued) -> Option<Queued> {
        let Ok(mut handoff) = self.handoff.lock() else {
            return Some(q);
        };
        if handoff.rows.try_reserve(1).is_err() {
            return Some(q);
        }
        handoff.rows.push(q);
        None
    }

    fn has_rows(&self) -> bool {
        self.current().is_some_and(Chunk::untaken)
            || self
                .handoff
                .lock()
                .is_ok_and(|h| !h.rows.is_empty() || !h.full.is_empty())
    }
}

impl Drop for ThreadBuffer {
    fn drop(&mut self) {
        let ptr = *self.current.get_mut();
        if !ptr.is_null() {
            // SAFETY: came from `Box::into_raw`; nobody else holds the buffer any more.
            drop(unsafe { Box::from_raw(ptr) });
        }
    }
}

/// Every queue the writer drains: the buffers of the threads that queued rows, and the whole
/// rows of threads that were exiting (their buffer was gone).
pub(super) struct Queues {
    pub(super) buffers: Mutex<Vec<Arc<ThreadBuffer>>>,
    /// Rows from threads whose thread-local buffer is already gone (emitted during thread exit).
    pub(super) orphans: Mutex<Vec<Queued>>,
    /// The orphans' sequence numbers.
    orphan_seq: AtomicU64,
}

/// The process's queues: a thread queues from inside a hook, where no session or pipeline
/// reference can be passed, and the writer drains them through its [`Backlog`].
pub(super) static QUEUES: Queues = Queues {
    buffers: Mutex::new(Vec::new()),
    orphans: Mutex::new(Vec::new()),
    orphan_seq: AtomicU64::new(0),
};

/// What a thread keeps for queueing rows: its buffer, the sequence number of its next row, and
/// its kernel id. One thread-local without a destructor for the three, read at every row (in a
/// shared library each thread-local lookup is a call); it stays readable while the thread
/// exits, so a row queued then still has its thread's id.
struct Local {
    /// The thread's buffer, held by [`Owner`] (null before the first row and once the owner
    /// let it go).
    buffer: Cell<*const ThreadBuffer>,
    seq: Cell<u64>,
    /// 0 until first asked.
    tid: Cell<u64>,
}

impl Local {
    fn tid(&self) -> u64 {
        let mut tid = self.tid.get();
        if tid == 0 {
            // SAFETY: gettid has no preconditions.
            tid = unsafe { libc::gettid() } as u64;
            self.tid.set(tid);
        }
        tid
    }
}

/// Holds the thread's reference to its buffer, let go when the thread exits; it clears
/// [`Local::buffer`] first.
struct Owner(OnceCell<Arc<ThreadBuffer>>);

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = MINE.try_with(|mine| mine.buffer.set(std::ptr::null()));
    }
}

thread_local! {
    static MINE: Local = const {
        Local {
            buffer: Cell::new(std::ptr::null()),
            seq: Cell::new(0),
            tid: Cell::new(0),
        }
    };
    static OWNER: Owner = const { Owner(OnceCell::new()) };
}

/// The kernel's id of this thread (what `Thread Id` shows).
pub fn thread_id() -> u64 {
    MINE.try_with(Local::tid).unwrap_or(0)
}

/// This thread's buffer, made and registered on first use; `None` once the thread let it go
/// (it is exiting).
#[cold]
fn own_buffer(mine: &Local) -> Option<*const ThreadBuffer> {
    let buffer = OWNER
        .try_with(|owner| {
            let buffer = owner.0.get_or_init(|| {
                let buffer = Arc::new(ThreadBuffer::default());
                if let Ok(mut registry) = QUEUES.buffers.lock() {
                    registry.push(buffer.clone());
                }
                buffer
            });
            Arc::as_ptr(buffer)
        })
        .ok()?;
    mine.buffer.set(buffer);
    Some(buffer)
}

/// Runs `f` on this thread's buffer with the next sequence number and the thread's id; `None`
/// when the thread has none any more (it is exiting).
#[inline]
fn with_buffer<R>(f: impl FnOnce(&ThreadBuffer, u64, u64) -> R) -> Option<R> {
    MINE.try_with(|mine| {
        let mut buffer = mine.buffer.get();
        if buffer.is_null() {
            buffer = own_buffer(mine)?;
        }
        let seq = mine.seq.get();
        mine.seq.set(seq + 1);
        // SAFETY: the owner's buffer, alive while the owner holds it: it clears `buffer` before
        // letting it go, and nothing here lets the thread exit meanwhile.
        Some(f(unsafe { &*buffer }, seq, mine.tid()))
    })
    .ok()
    .flatten()
}

fn orphan(mut q: Queued) {
    q.seq = QUEUES.orphan_seq.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut orphans) = QUEUES.orphans.lock() {
        orphans.push(q);
    }
}

/// Appends a whole row to this thread's buffer.
pub fn push(row: EventRow, c_frames: Vec<u64>) {
    let mut q = Some(Queued {
        seq: 0,
        row,
        c_frames,
        attrs_spare: String::new(),
    });
    let refused = with_buffer(|buffer, seq, _| {
        let mut mine = q.take()?;
        mine.seq = seq;
        buffer.push_row(mine)
    });
    if let Some(q) = refused.flatten().or(q) {
        orphan(q);
    }
}

/// Appends a row given by its numbers and borrowed texts, copying the texts into this thread's
/// chunk (a row no chunk can hold, or one queued while the thread exits, goes whole).
/// `numbers.tid` is stamped here, from the thread's local.
pub fn push_packed(mut numbers: Numbers, texts: &Texts, c_frames: &[u64]) {
    let packed = with_buffer(|buffer, seq, tid| {
        numbers.tid = tid;
        buffer.push_packed(seq, numbers, texts, c_frames)
    });
    if packed != Some(true) {
        numbers.tid = thread_id();
        push(whole(numbers, texts), c_frames.to_vec());
    }
}

/// Appends an op row, keeping the address of its interned name (a row no chunk can hold, or one
/// queued while the thread exits, is copied as any other).
pub fn push_op(mut op: OpRow) {
    let packed = with_buffer(|buffer, seq, tid| {
        op.tid = tid;
        buffer.push_op(seq, &op)
    });
    if packed != Some(true) {
        push_packed(op.numbers(), &op.texts(), &[]);
    }
}

fn whole(n: Numbers, texts: &Texts) -> EventRow {
    let mut row = texts.row(n.event, n.event_type, n.device, n.ptr);
    (row.ts_ns, row.pid, row.tid) = (n.ts_ns, n.pid, n.tid);
    row
}
