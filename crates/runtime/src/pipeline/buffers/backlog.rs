//! The writer's side of the buffers: each thread's chunks and whole rows taken through its
//! hand-off lock, merged in the order of time, and the emptied chunks handed back.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use msmemscope_core::events::{Event, EventRow, EventType};

use super::packed::{Chunk, FREE_CHUNKS, MAX_FREE_CHUNKS};
use super::{Queued, Queues, ThreadBuffer, QUEUES};

/// The writer's side of one thread's buffer: the full chunks it took, oldest first, then the
/// chunk the thread was filling when they were taken, read behind the thread. Chunks stay
/// boxed, as in the hand-off.
#[allow(clippy::vec_box)]
pub(super) struct Reader {
    pub(super) buffer: Arc<ThreadBuffer>,
    pub(super) chunks: VecDeque<Box<Chunk>>,
    /// The thread's current chunk when the full ones were last taken (null when it was among
    /// them, or the thread had none). Read after `chunks`: every row in it is newer.
    pub(super) current: *const Chunk,
    /// Chunks read to the end, for the thread to fill again.
    pub(super) emptied: Vec<Box<Chunk>>,
    /// The most chunks the writer held for the thread at a recent drain (one less per drain
    /// since).
    pub(super) held_peak: usize,
}

// SAFETY: `current` points into the buffer the reader holds, whose chunks only the writer
// frees (or the buffer's drop, once the reader has let it go).
unsafe impl Send for Reader {}

impl Reader {
    pub(super) fn new(buffer: Arc<ThreadBuffer>) -> Reader {
        Reader {
            buffer,
            chunks: VecDeque::new(),
            current: std::ptr::null(),
            emptied: Vec::new(),
            held_peak: 0,
        }
    }

    /// Takes the chunks the thread filled since the last call, and its whole rows (to `loose`).
    pub(super) fn refill(&mut self, loose: &mut VecDeque<Queued>) {
        // The current chunk is read before the full ones are taken: if the thread hands it over
        // in between, it is among them, and no newer chunk is read before it. Every packed row
        // queued before a whole row taken here is published by then (the lock orders them).
        let current = self.buffer.current.load(Ordering::Acquire);
        let Ok(mut handoff) = self.buffer.handoff.lock() else {
            return;
        };
        loose.extend(handoff.rows.drain(..));
        let handed_over = handoff.full.iter().any(|c| std::ptr::eq(&**c, current));
        self.chunks.extend(handoff.full.drain(..));
        drop(handoff);
        self.current = if handed_over {
            std::ptr::null()
        } else {
            current.cast_const()
        };
    }

    /// The chunk holding this thread's next unread row, if any. Chunks read to the end are put
    /// aside for the thread.
    pub(super) fn head(&mut self) -> Option<&Chunk> {
        while let Some(front) = self.chunks.front() {
            if front.head_key().is_some() {
                return self.chunks.front().map(|c| &**c);
            }
            // A handed-over chunk is never written again: read to the end, it is done.
            if let Some(done) = self.chunks.pop_front() {
                done.clear();
                self.emptied.push(done);
            }
        }
        // SAFETY: the current chunk of the held buffer, or one it handed over since (waiting in
        // its hand-off for the next refill): either way not freed (see `Send` above).
        let current = unsafe { self.current.as_ref() }?;
        current.head_key().is_some().then_some(current)
    }

    pub(super) fn head_key(&mut self) -> Option<(u64, u64)> {
        self.head()?.head_key()
    }

    /// Gives the emptied chunks back to the thread, keeping as many as the writer lately held
    /// for it at the most (at least [`FREE_CHUNKS`], at most [`MAX_FREE_CHUNKS`]); the rest are
    /// unmapped. Rows wait for the watermark, so while the writer holds a thread's chunks the
    /// thread fills about as many again, and how many it fills between two drains varies with
    /// when the writer wakes: keeping only what one drain emptied had a busy PyTorch thread map
    /// a quarter of its chunks afresh (and fault in their pages), while the surplus of the
    /// next drain was unmapped.
    pub(super) fn give_back(&mut self) {
        let held = self.chunks.len() + self.emptied.len();
        self.held_peak = held.max(self.held_peak.saturating_sub(1));
        if self.emptied.is_empty() {
            return;
        }
        let keep = self.held_peak.clamp(FREE_CHUNKS, MAX_FREE_CHUNKS);
        if let Ok(mut handoff) = self.buffer.handoff.lock() {
            for chunk in self.emptied.drain(..) {
                if handoff.free.len() < keep && handoff.free.try_reserve(1).is_ok() {
                    handoff.free.push(chunk);
                }
            }
        }
        // Unmapped here when the hand-off could not be had.
        self.emptied.clear();
    }

    /// Whether the thread has ended and every row it queued has been read.
    pub(super) fn finished(&mut self) -> bool {
        // Held by the registry and this reader alone: the thread's own reference is gone.
        Arc::strong_count(&self.buffer) <= 2 && self.head().is_none() && !self.buffer.has_rows()
    }
}

/// The rows queued and not written yet, kept where the threads queued them: packed rows stay in
/// their chunks, and each is made a whole row (in one reused row) only when it is written. So
/// the writer moves no row and holds no row's strings between drains, however far behind it is.
pub struct Backlog {
    pub(super) readers: Vec<Reader>,
    /// Whole rows (steps, marks, OOM rows, rows too large for a chunk, rows of exiting
    /// threads), ordered by key.
    pub(super) loose: VecDeque<Queued>,
    /// The row each packed row is read into.
    pub(super) scratch: Queued,
    /// Where the threads queue their rows.
    queues: &'static Queues,
}

impl Default for Backlog {
    fn default() -> Self {
        Backlog {
            readers: Vec::new(),
            loose: VecDeque::new(),
            scratch: Queued {
                seq: 0,
                row: EventRow::new(Event::System, EventType::Step, String::new()),
                c_frames: Vec::new(),
                attrs_spare: String::new(),
            },
            queues: &QUEUES,
        }
    }
}

/// Rows are written in the order of (time, sequence number).
pub(super) fn key(q: &Queued) -> (u64, u64) {
    (q.row.ts_ns, q.seq)
}

impl Backlog {
    /// Takes what every thread has queued since the last call. Threads that have ended and
    /// whose rows were all written are forgotten.
    pub fn refill(&mut self) {
        let Ok(mut registry) = self.queues.buffers.lock() else {
            return;
        };
        let before = self.loose.len();
        self.take_from(&registry);
        let finished: Vec<Arc<ThreadBuffer>> = self
            .readers
            .iter_mut()
            .filter_map(|r| r.finished().then(|| r.buffer.clone()))
            .collect();
        if !finished.is_empty() {
            registry.retain(|b| !finished.iter().any(|f| Arc::ptr_eq(f, b)));
            self.readers
                .retain(|r| !finished.iter().any(|f| Arc::ptr_eq(f, &r.buffer)));
        }
        drop(registry);
        if let Ok(mut orphans) = self.queues.orphans.lock() {
            self.loose.extend(orphans.drain(..));
        }
        if self.loose.len() > before {
            self.loose.make_contiguous().sort_by_key(key);
        }
    }

    /// Takes what `buffers` queued since the last call, with a reader for each buffer new here.
    pub(super) fn take_from(&mut self, buffers: &[Arc<ThreadBuffer>]) {
        for buffer in buffers {
            if !self.readers.iter().any(|r| Arc::ptr_eq(&r.buffer, buffer)) {
                if self.readers.try_reserve(1).is_err() {
                    continue;
                }
                self.readers.push(Reader::new(buffer.clone()));
            }
        }
        for reader in &mut self.readers {
            reader.refill(&mut self.loose);
        }
    }

    /// [`Backlog::refill`] from the given buffers instead of the registry.
    #[cfg(test)]
    pub(super) fn refill_from(&mut self, buffers: &[Arc<ThreadBuffer>]) {
        self.take_from(buffers);
        self.loose.make_contiguous().sort_by_key(key);
    }

    /// Hands `write` every row taken so far that is stamped at or before `watermark`, oldest
    /// first (by time, then sequence number: the threads' rows, each thread's in the order it
    /// queued them, merged), and gives the emptied chunks back. Returns how many it handed.
    pub fn write_until(&mut self, watermark: u64, mut write: impl FnMut(&mut Queued)) -> usize {
        const LOOSE: usize = usize::MAX;
        // The readers with a row to write, and that row's key: threads that queued nothing
        // since (most of a program's, often) are not looked at again for each row.
        let mut heads: Vec<((u64, u64), usize)> = self
            .readers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, r)| r.head_key().map(|k| (k, i)))
            .collect();
        let mut written = 0;
        loop {
            let mut best = self.loose.front().map(|q| (key(q), LOOSE, 0));
            for (at, &(k, i)) in heads.iter().enumerate() {
                if best.is_none_or(|(b, _, _)| k < b) {
                    best = Some((k, i, at));
                }
            }
            let Some(((ts, _), from, at)) = best else {
                break;
            };
            if ts > watermark {
                break;
            }
            if from == LOOSE {
                if let Some(mut q) = self.loose.pop_front() {
                    write(&mut q);
                }
            } else {
                let reader = &mut self.readers[from];
                if reader
                    .head()
                    .is_some_and(|c| c.next_into(&mut self.scratch))
                {
                    write(&mut self.scratch);
                }
                match reader.head_key() {
                    Some(k) => heads[at].0 = k,
                    None => {
                        heads.swap_remove(at);
                    }
                }
            }
            written += 1;
        }
        for reader in &mut self.readers {
            reader.give_back();
        }
        written
    }
}
