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

use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

/// A row and its sequence number: rows with equal timestamps are written in the order of
/// their sequence numbers, which count each thread's rows in the order it queued them.
pub struct Queued {
    pub seq: u64,
    pub row: EventRow,
    /// Raw C frames to symbolize in the writer, when the C stack was asked for.
    pub c_frames: Vec<u64>,
}

/// A row's texts, borrowed from its producer for the call, as bytes: they are read as UTF-8
/// when unpacked, on the writer's thread.
pub struct Texts<'a> {
    pub name: &'a [u8],
    /// The Attr column as the producer rendered it (a checked JSON object), if any.
    pub attrs_json: Option<&'a [u8]>,
    pub python_stack: &'a [u8],
}

impl Texts<'_> {
    /// A whole row of `event`/`event_type` on `device` at `ptr`, with these texts read as
    /// UTF-8 (invalid sequences replaced); not stamped.
    pub fn row(
        &self,
        event: Event,
        event_type: EventType,
        device: DeviceId,
        ptr: Option<u64>,
    ) -> EventRow {
        let mut row = EventRow::new(event, event_type, String::from_utf8_lossy(self.name));
        row.device = device;
        row.ptr = ptr;
        row.attrs_json = self
            .attrs_json
            .map(|a| String::from_utf8_lossy(a).into_owned());
        row.python_stack = String::from_utf8_lossy(self.python_stack).into_owned();
        row
    }

    fn len(&self) -> usize {
        self.name.len() + self.attrs_json.map_or(0, <[u8]>::len) + self.python_stack.len()
    }
}

/// A row's numbers, stamped.
#[derive(Clone, Copy)]
pub struct Numbers {
    pub event: Event,
    pub event_type: EventType,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u64,
    pub device: DeviceId,
    pub ptr: Option<u64>,
}

/// A range of a chunk's arena.
#[derive(Clone, Copy)]
struct Span {
    start: u32,
    end: u32,
}

/// A row queued without its own strings: spans of its chunk's arenas.
#[derive(Clone, Copy)]
struct Packed {
    seq: u64,
    numbers: Numbers,
    name: Span,
    attrs_json: Option<Span>,
    python_stack: Span,
    c_frames: Span,
}

/// Rows, text bytes and C frames one chunk holds: about 100 KiB, which a busy thread fills in
/// a few milliseconds and which stays in its core's cache meanwhile.
const CHUNK_ROWS: usize = 512;
const CHUNK_TEXT: usize = 48 << 10;
const CHUNK_FRAMES: usize = 2048;
/// Emptied chunks a thread keeps for its next ones.
const FREE_CHUNKS: usize = 8;

/// A fixed block of packed rows that one thread fills (its current chunk) and the writer reads
/// behind it. The filling thread writes a row's slot and arena bytes past everything published,
/// then publishes the row with a release store of `len`; the writer reads only published rows
/// (an acquire load of `len`). Once the chunk is handed over full, only the writer touches it
/// until it hands it back empty, through the hand-off lock.
struct Chunk {
    /// The memory of the three arrays below (unmapped when the chunk is dropped).
    _region: Region,
    /// `CHUNK_ROWS` row slots, `CHUNK_FRAMES` frames and `CHUNK_TEXT` bytes, in `region`.
    rows: *mut MaybeUninit<Packed>,
    frames: *mut u64,
    text: *mut u8,
    /// Rows published.
    len: AtomicUsize,
    /// Arena bytes and frames in use: the filling thread's (the writer's once handed over).
    text_len: AtomicUsize,
    frames_len: AtomicUsize,
    /// Rows the writer has taken: the writer's.
    taken: AtomicUsize,
}

// SAFETY: the arrays are written by the one thread filling the chunk, only past what `len`
// published, and read by the writer only up to it (release/acquire on `len`); a chunk handed
// over changes hands under the hand-off lock.
unsafe impl Sync for Chunk {}
// SAFETY: as above; the region belongs to the chunk, whichever thread drops it.
unsafe impl Send for Chunk {}

/// Anonymous memory mapped for one chunk. Chunks are made on the program's thread and may be
/// freed on the writer's: mapped, they take nothing from the program's heap.
struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    fn new(len: usize) -> Option<Region> {
        // SAFETY: a fresh private anonymous mapping; nothing else is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(Region {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Chunk {
    fn new() -> Option<Box<Chunk>> {
        let rows_bytes = CHUNK_ROWS * std::mem::size_of::<Packed>();
        let frames_bytes = CHUNK_FRAMES * std::mem::size_of::<u64>();
        let region = Region::new(rows_bytes + frames_bytes + CHUNK_TEXT)?;
        let base = region.ptr;
        // SAFETY: the offsets lie inside the region; a mapping is page-aligned and a row's
        // size is a multiple of 8, so the rows and the frames are aligned.
        let (rows, frames, text) = unsafe {
            (
                base.cast::<MaybeUninit<Packed>>(),
                base.add(rows_bytes).cast::<u64>(),
                base.add(rows_bytes + frames_bytes),
            )
        };
        let chunk = Chunk {
            _region: region,
            rows,
            frames,
            text,
            len: AtomicUsize::new(0),
            text_len: AtomicUsize::new(0),
            frames_len: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
        };
        let mut one = Vec::new();
        one.try_reserve_exact(1).ok()?;
        one.push(chunk);
        let raw = Box::into_raw(one.into_boxed_slice()).cast::<Chunk>();
        // SAFETY: a boxed one-element slice has the layout of a box of its element.
        Some(unsafe { Box::from_raw(raw) })
    }

    /// Whether a row with these texts and frames could ever fit (in an empty chunk).
    fn holds(texts: &Texts, frames: &[u64]) -> bool {
        texts.len() <= CHUNK_TEXT && frames.len() <= CHUNK_FRAMES
    }

    /// Appends and publishes a row; false when the chunk has no room for it. Only the thread
    /// filling the chunk calls this.
    fn push(&self, seq: u64, numbers: Numbers, texts: &Texts, frames: &[u64]) -> bool {
        let n = self.len.load(Ordering::Relaxed);
        let t = self.text_len.load(Ordering::Relaxed);
        let f = self.frames_len.load(Ordering::Relaxed);
        if n >= CHUNK_ROWS || t + texts.len() > CHUNK_TEXT || f + frames.len() > CHUNK_FRAMES {
            return false;
        }
        let mut at = t;
        let mut copy = |bytes: &[u8]| {
            // SAFETY: `at..at + len` lies inside the arena (checked above) and past every
            // published row's bytes: nobody reads it until `len` publishes this row.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.text.add(at), bytes.len());
            }
            let span = Span {
                start: at as u32,
                end: (at + bytes.len()) as u32,
            };
            at += bytes.len();
            span
        };
        let name = copy(texts.name);
        let attrs_json = texts.attrs_json.map(&mut copy);
        let python_stack = copy(texts.python_stack);
        // SAFETY: as for the text, in the frames arena.
        unsafe {
            std::ptr::copy_nonoverlapping(frames.as_ptr(), self.frames.add(f), frames.len());
        }
        let packed = Packed {
            seq,
            numbers,
            name,
            attrs_json,
            python_stack,
            c_frames: Span {
                start: f as u32,
                end: (f + frames.len()) as u32,
            },
        };
        // SAFETY: slot `n` is unpublished (n == len), so only this thread touches it.
        unsafe { (*self.rows.add(n)).write(packed) };
        self.text_len.store(at, Ordering::Relaxed);
        self.frames_len.store(f + frames.len(), Ordering::Relaxed);
        self.len.store(n + 1, Ordering::Release);
        true
    }

    /// The writer: every published row not taken yet, as whole rows (made from `spare`'s
    /// first), to the end of `out`.
    fn take_into(&self, out: &mut VecDeque<Queued>, spare: &mut Vec<EventRow>) {
        let len = self.len.load(Ordering::Acquire);
        let taken = self.taken.load(Ordering::Relaxed);
        out.reserve(len.saturating_sub(taken));
        for i in taken..len {
            // SAFETY: slot `i` < `len` was published (acquire above) and is never written again
            // until the chunk is emptied, by this thread.
            let p = unsafe { (*self.rows.add(i)).assume_init_read() };
            out.push_back(self.unpack(&p, spare));
        }
        self.taken.store(len, Ordering::Relaxed);
    }

    fn bytes(&self, span: Span) -> &[u8] {
        let (start, end) = (span.start as usize, span.end as usize);
        if start > end || end > CHUNK_TEXT {
            return &[];
        }
        // SAFETY: the span is a published row's, inside the arena, and not written again
        // until the chunk is emptied.
        unsafe { std::slice::from_raw_parts(self.text.add(start), end - start) }
    }

    fn frames_of(&self, span: Span) -> Vec<u64> {
        let (start, end) = (span.start as usize, span.end as usize);
        if start >= end || end > CHUNK_FRAMES {
            return Vec::new();
        }
        // SAFETY: as for `bytes`, in the frames arena.
        unsafe { std::slice::from_raw_parts(self.frames.add(start), end - start).to_vec() }
    }

    /// The whole row of `p`, in a row from `spare` when it has one (its strings' capacity
    /// reused).
    fn unpack(&self, p: &Packed, spare: &mut Vec<EventRow>) -> Queued {
        let n = p.numbers;
        let mut row = match spare.pop() {
            Some(mut row) => {
                let attrs = row.attrs_json.take();
                row.reset(n.event, n.event_type);
                row.attrs_json = attrs;
                row
            }
            None => EventRow::new(n.event, n.event_type, String::new()),
        };
        text_into(&mut row.name, self.bytes(p.name));
        row.ts_ns = n.ts_ns;
        row.pid = n.pid;
        row.tid = n.tid;
        row.device = n.device;
        row.ptr = n.ptr;
        row.attrs_json = match p.attrs_json {
            Some(span) => {
                let mut attrs = row.attrs_json.take().unwrap_or_default();
                text_into(&mut attrs, self.bytes(span));
                Some(attrs)
            }
            None => None,
        };
        text_into(&mut row.python_stack, self.bytes(p.python_stack));
        Queued {
            seq: p.seq,
            row,
            c_frames: self.frames_of(p.c_frames),
        }
    }

    /// The writer, on a chunk handed over: empty again.
    fn clear(&self) {
        self.len.store(0, Ordering::Relaxed);
        self.taken.store(0, Ordering::Relaxed);
        self.text_len.store(0, Ordering::Relaxed);
        self.frames_len.store(0, Ordering::Relaxed);
    }

    fn untaken(&self) -> bool {
        self.len.load(Ordering::Acquire) > self.taken.load(Ordering::Relaxed)
    }
}

/// Sets `out` to `bytes` read as UTF-8, in the capacity `out` already has.
fn text_into(out: &mut String, bytes: &[u8]) {
    out.clear();
    // The producer's bytes, unchecked until now.
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
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
            None => Chunk::new()?,
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

    /// The thread: queues a packed row.
    fn push_packed(&self, seq: u64, numbers: Numbers, texts: &Texts, frames: &[u64]) -> bool {
        if let Some(chunk) = self.current() {
            if chunk.push(seq, numbers, texts, frames) {
                return true;
            }
        }
        Chunk::holds(texts, frames)
            && self
                .rotate()
                .is_some_and(|chunk| chunk.push(seq, numbers, texts, frames))
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

    /// The writer: every row queued so far, to the end of `out`, in the order the thread
    /// queued them, except that whole rows come first (the writer orders all by time).
    fn drain_into(&self, out: &mut VecDeque<Queued>, spare: &mut Vec<EventRow>) {
        // The current chunk is read before the full ones are taken: if the thread hands it
        // over in between, it is among them, and no newer chunk is read before it. Every packed
        // row queued before a whole row taken here is published by then (the lock orders them).
        let current = self.current.load(Ordering::Acquire);
        let full = match self.handoff.lock() {
            Ok(mut handoff) => {
                out.extend(handoff.rows.drain(..));
                std::mem::take(&mut handoff.full)
            }
            Err(_) => return,
        };
        for chunk in &full {
            chunk.take_into(out, spare);
            chunk.clear();
        }
        let handed_over = full.iter().any(|c| std::ptr::eq(&**c, current));
        if !current.is_null() && !handed_over {
            // SAFETY: only this thread (the writer) frees chunks, or the buffer's drop: the
            // chunk is still current, or was handed over after the lock above and waits in
            // `full` for the next drain, which starts after what is taken now.
            unsafe { &*current }.take_into(out, spare);
        }
        if let Ok(mut handoff) = self.handoff.lock() {
            for chunk in full {
                if handoff.free.len() < FREE_CHUNKS && handoff.free.try_reserve(1).is_ok() {
                    handoff.free.push(chunk);
                }
            }
        }
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

static REGISTRY: Mutex<Vec<Arc<ThreadBuffer>>> = Mutex::new(Vec::new());
/// Sequence numbers of rows queued by threads that are exiting (they have no buffer).
static ORPHAN_SEQ: AtomicU64 = AtomicU64::new(0);

/// A thread's buffer and the sequence number of its next row.
struct Local {
    buffer: Option<Arc<ThreadBuffer>>,
    seq: u64,
}

thread_local! {
    static MINE: RefCell<Local> = const { RefCell::new(Local { buffer: None, seq: 0 }) };
}

/// Rows from threads whose thread-local buffer is already gone (emitted during thread exit).
static ORPHANS: Mutex<Vec<Queued>> = Mutex::new(Vec::new());

/// Runs `f` on this thread's buffer with the next sequence number; `None` when the thread has
/// none any more (it is exiting).
fn with_buffer<R>(f: impl FnOnce(&ThreadBuffer, u64) -> R) -> Option<R> {
    MINE.try_with(|mine| {
        let mut mine = mine.borrow_mut();
        let seq = mine.seq;
        mine.seq += 1;
        let buffer = mine.buffer.get_or_insert_with(|| {
            let buffer = Arc::new(ThreadBuffer::default());
            if let Ok(mut registry) = REGISTRY.lock() {
                registry.push(buffer.clone());
            }
            buffer
        });
        f(buffer, seq)
    })
    .ok()
}

fn orphan(mut q: Queued) {
    q.seq = ORPHAN_SEQ.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut orphans) = ORPHANS.lock() {
        orphans.push(q);
    }
}

/// Appends a whole row to this thread's buffer.
pub fn push(row: EventRow, c_frames: Vec<u64>) {
    let mut q = Some(Queued {
        seq: 0,
        row,
        c_frames,
    });
    let refused = with_buffer(|buffer, seq| {
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
pub fn push_packed(numbers: Numbers, texts: &Texts, c_frames: &[u64]) {
    let packed = with_buffer(|buffer, seq| buffer.push_packed(seq, numbers, texts, c_frames));
    if packed != Some(true) {
        push(whole(numbers, texts), c_frames.to_vec());
    }
}

fn whole(n: Numbers, texts: &Texts) -> EventRow {
    let mut row = texts.row(n.event, n.event_type, n.device, n.ptr);
    (row.ts_ns, row.pid, row.tid) = (n.ts_ns, n.pid, n.tid);
    row
}

/// Moves every row queued so far, from every thread, to the end of `out`. Rows written
/// before, handed back in `spare`, are reused for them.
pub fn drain_into(out: &mut VecDeque<Queued>, spare: &mut Vec<EventRow>) {
    let buffers: Vec<Arc<ThreadBuffer>> = match REGISTRY.lock() {
        Ok(registry) => registry.clone(),
        Err(_) => return,
    };
    if let Ok(mut orphans) = ORPHANS.lock() {
        out.extend(orphans.drain(..));
    }
    for buffer in &buffers {
        buffer.drain_into(out, spare);
    }
    drop(buffers);
    // Buffers only the registry still holds belong to exited threads; once drained they go.
    if let Ok(mut registry) = REGISTRY.lock() {
        registry.retain(|b| Arc::strong_count(b) > 1 || b.has_rows());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(event: Event, ptr: u64) -> Numbers {
        Numbers {
            event,
            event_type: EventType::Pta,
            ts_ns: 7,
            pid: 11,
            tid: 13,
            device: DeviceId::Cuda(1),
            ptr: Some(ptr),
        }
    }

    fn texts<'a>(name: &'a [u8], attrs: Option<&'a [u8]>, stack: &'a [u8]) -> Texts<'a> {
        Texts {
            name,
            attrs_json: attrs,
            python_stack: stack,
        }
    }

    #[test]
    fn packed_rows_come_back_whole_and_reused_rows_carry_nothing_over() {
        let buffer = ThreadBuffer::default();
        let first = texts(
            b"aten::addmm",
            Some(br#"{"size":1024,"owner":"PTA@weight"}"#),
            b"t.py(3): f\nt.py(9): <module>",
        );
        assert!(buffer.push_packed(1, numbers(Event::Malloc, 0x10), &first, &[0xa, 0xb]));
        let step = Queued {
            seq: 2,
            row: EventRow::new(Event::System, EventType::Step, "1"),
            c_frames: Vec::new(),
        };
        assert!(buffer.push_row(step).is_none());
        let mut out = VecDeque::new();
        let mut spare = Vec::new();
        buffer.drain_into(&mut out, &mut spare);
        assert!(!buffer.has_rows());
        // Whole rows come first; the writer orders rows by (time, sequence number).
        let [b, a] = &*out.make_contiguous() else {
            panic!("{} rows", out.len())
        };
        assert_eq!((a.seq, b.seq), (1, 2));
        assert_eq!(a.row.name, "aten::addmm");
        assert_eq!((a.row.ts_ns, a.row.pid, a.row.tid), (7, 11, 13));
        assert_eq!((a.row.device, a.row.ptr), (DeviceId::Cuda(1), Some(0x10)));
        assert_eq!(a.row.attr_u64("size"), Some(1024));
        assert_eq!(a.row.python_stack, "t.py(3): f\nt.py(9): <module>");
        assert_eq!(a.c_frames, vec![0xa, 0xb]);
        assert_eq!(b.row.name, "1");

        // The first row is reused for one whose Attr has the same length, in the same string:
        // the new value is read, and nothing of the old row stays.
        spare.extend(out.drain(..).map(|q| q.row));
        let second = texts(
            b"aten::mm",
            Some(br#"{"size":2048,"owner":"PTA@weight"}"#),
            b"",
        );
        assert!(buffer.push_packed(3, numbers(Event::Free, 0x20), &second, &[]));
        assert!(buffer.push_packed(
            4,
            numbers(Event::Free, 0x30),
            &texts(b"N/A", None, b"\xff"),
            &[]
        ));
        buffer.drain_into(&mut out, &mut spare);
        let [c, d] = &*out.make_contiguous() else {
            panic!("{} rows", out.len())
        };
        assert_eq!(
            (c.row.event, c.row.name.as_str()),
            (Event::Free, "aten::mm")
        );
        assert_eq!(c.row.attr_u64("size"), Some(2048));
        assert_eq!((c.row.python_stack.as_str(), c.c_frames.len()), ("", 0));
        assert_eq!(
            (d.row.name.as_str(), d.row.attrs_json.as_deref()),
            ("N/A", None)
        );
        assert!(d.row.attrs.is_empty() && d.row.c_stack.is_empty());
        assert_eq!(d.row.ptr, Some(0x30));
        // Bytes that are not UTF-8 are read, on the writer's side, with the replacement char.
        assert_eq!(d.row.python_stack, "\u{fffd}");
    }

    #[test]
    fn full_chunks_are_handed_over_in_order_and_emptied_ones_used_again() {
        let buffer = ThreadBuffer::default();
        let (mut out, mut spare) = (VecDeque::new(), Vec::new());
        let total = CHUNK_ROWS as u64 * 5 + 7;
        for seq in 0..total {
            let name = format!("aten::op{seq}");
            assert!(buffer.push_packed(
                seq,
                numbers(Event::OpLaunch, seq),
                &texts(name.as_bytes(), None, b""),
                &[seq]
            ));
            if seq == CHUNK_ROWS as u64 * 2 + 3 {
                buffer.drain_into(&mut out, &mut spare);
            }
        }
        buffer.drain_into(&mut out, &mut spare);
        let seqs: Vec<u64> = out.iter().map(|q| q.seq).collect();
        assert_eq!(seqs, (0..total).collect::<Vec<_>>());
        for q in &out {
            assert_eq!(q.row.name, format!("aten::op{}", q.seq));
            assert_eq!(q.c_frames, vec![q.seq]);
        }
        // The chunks emptied are filled again: one more chunk's rows take one of them.
        let free = || buffer.handoff.lock().unwrap().free.len();
        let kept = free();
        assert!(kept >= 1);
        for seq in total..total + CHUNK_ROWS as u64 {
            let row = texts(b"aten::op", None, b"");
            assert!(buffer.push_packed(seq, numbers(Event::OpLaunch, seq), &row, &[]));
        }
        assert_eq!(free(), kept - 1);
        // A row no chunk can hold is refused (the caller queues it whole).
        let huge = vec![b'x'; CHUNK_TEXT + 1];
        assert!(!buffer.push_packed(
            total,
            numbers(Event::Malloc, 1),
            &texts(b"N/A", None, &huge),
            &[]
        ));
    }

    #[test]
    fn a_writer_draining_while_the_thread_queues_gets_every_row_once_in_order() {
        let buffer = Arc::new(ThreadBuffer::default());
        let total: u64 = 200_000;
        let producer = {
            let buffer = buffer.clone();
            std::thread::spawn(move || {
                for seq in 0..total {
                    let name = seq.to_string();
                    let row = texts(name.as_bytes(), None, b"");
                    if seq % 1000 == 999 {
                        let whole = Queued {
                            seq,
                            row: EventRow::new(Event::System, EventType::Step, name),
                            c_frames: Vec::new(),
                        };
                        assert!(buffer.push_row(whole).is_none());
                    } else {
                        assert!(buffer.push_packed(seq, numbers(Event::OpLaunch, seq), &row, &[]));
                    }
                }
            })
        };
        let (mut out, mut spare) = (VecDeque::new(), Vec::new());
        while !producer.is_finished() {
            buffer.drain_into(&mut out, &mut spare);
            spare.extend(
                out.iter()
                    .skip(spare.len().min(out.len()))
                    .take(64)
                    .map(|q| q.row.clone()),
            );
        }
        producer.join().unwrap();
        buffer.drain_into(&mut out, &mut spare);
        let mut seqs: Vec<u64> = out.iter().map(|q| q.seq).collect();
        // Packed rows arrive in the order queued; whole rows may come a drain early.
        let packed: Vec<u64> = seqs.iter().copied().filter(|s| s % 1000 != 999).collect();
        assert!(packed.windows(2).all(|w| w[0] < w[1]));
        seqs.sort_unstable();
        assert_eq!(seqs, (0..total).collect::<Vec<_>>());
        assert!(out.iter().all(|q| q.row.name == q.seq.to_string()));
    }
}
