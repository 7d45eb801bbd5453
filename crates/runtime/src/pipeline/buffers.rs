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

use std::cell::{Cell, OnceCell};
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::events::abi::{BlockAttrs, StrRef};
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

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

/// A row's texts, borrowed from its producer for the call, as bytes: they are read as UTF-8
/// when unpacked, on the writer's thread.
pub struct Texts<'a> {
    pub name: &'a [u8],
    pub attrs: Attrs<'a>,
    pub python_stack: &'a [u8],
}

/// A row's Attr column as its producer handed it over.
#[derive(Clone, Copy)]
pub enum Attrs<'a> {
    None,
    /// Rendered by the producer (a checked JSON object).
    Json(&'a [u8]),
    /// A block row's numbers and interned texts, rendered when the row is written.
    Block(BlockAttrs),
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
        row.attrs_json = match self.attrs {
            Attrs::None => None,
            Attrs::Json(a) => Some(String::from_utf8_lossy(a).into_owned()),
            Attrs::Block(b) => {
                let mut text = String::new();
                // SAFETY: a block's texts are interned by its producer (the ABI's promise).
                unsafe { b.render(&mut text) };
                Some(text)
            }
        };
        row.python_stack = String::from_utf8_lossy(self.python_stack).into_owned();
        row
    }

    fn len(&self) -> usize {
        let attrs = match self.attrs {
            Attrs::None => 0,
            Attrs::Json(a) => a.len(),
            Attrs::Block(b) => queued_size(&b),
        };
        self.name.len() + attrs + self.python_stack.len()
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

/// A block row's Attr without the owner member (every FREE row's), as queued: the texts are
/// not rendered without it, so only the numbers are kept, in a third of a [`BlockAttrs`]'s
/// bytes (each byte a row queues is one the program's thread writes).
#[derive(Clone, Copy)]
struct BareBlock {
    allocation_id: u64,
    addr: u64,
    size: u64,
    used: u64,
    total: u64,
    /// [`BARE_USED`], [`BARE_TOTAL`]: which of the two are given.
    given: u64,
}

const BARE_USED: u64 = 1;
const BARE_TOTAL: u64 = 2;
// The two forms are told apart by their queued length.
const _: () = assert!(std::mem::size_of::<BareBlock>() != std::mem::size_of::<BlockAttrs>());

impl BareBlock {
    fn of(b: &BlockAttrs) -> BareBlock {
        BareBlock {
            allocation_id: b.allocation_id,
            addr: b.addr,
            size: b.size,
            used: b.used.unwrap_or(0),
            total: b.total.unwrap_or(0),
            given: if b.used.is_some() { BARE_USED } else { 0 }
                | if b.total.is_some() { BARE_TOTAL } else { 0 },
        }
    }

    fn attrs(&self) -> BlockAttrs {
        BlockAttrs {
            allocation_id: self.allocation_id,
            addr: self.addr,
            size: self.size,
            used: (self.given & BARE_USED != 0).then_some(self.used),
            total: (self.given & BARE_TOTAL != 0).then_some(self.total),
            owner: false,
            category: StrRef::EMPTY,
            labels: StrRef::EMPTY,
            site: StrRef::EMPTY,
            frame: StrRef::EMPTY,
            op: StrRef::EMPTY,
            module: StrRef::EMPTY,
        }
    }
}

/// The bytes a block's Attr takes in a chunk's arena.
fn queued_size(b: &BlockAttrs) -> usize {
    if b.owner {
        std::mem::size_of::<BlockAttrs>()
    } else {
        std::mem::size_of::<BareBlock>()
    }
}

/// A range of a chunk's arena (a chunk's arenas are shorter than 64 Ki entries).
#[derive(Clone, Copy)]
struct Span {
    start: u16,
    len: u16,
}

impl Span {
    const EMPTY: Span = Span { start: 0, len: 0 };

    fn range(self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + self.len as usize
    }
}

/// [`Packed::flags`]: the row has a Ptr; what its `attrs` span holds.
const HAS_PTR: u8 = 1;
/// The Attr text.
const ATTRS_JSON: u8 = 2;
/// A [`BlockAttrs`], its bytes (unaligned).
const ATTRS_BLOCK: u8 = 4;
/// An op row's name, interned by its producer: its bytes are at `ptr` (an op row has no Ptr),
/// and the `name` span's length is theirs.
const NAME_INTERNED: u8 = 8;
/// The row's name is `N/A` (every block row's), which is not copied into the arena.
const NAME_NA: u8 = 16;
/// The dump's Name of a row that names nothing.
const NA: &[u8] = b"N/A";

/// A row queued without its own strings: its numbers and spans of its chunk's arenas. Kept
/// small (56 bytes): each row's bytes are fresh cache lines for the program's thread to write,
/// so the process and thread ids, the same for every row of a chunk, are the chunk's, and the
/// sequence number is counted from the chunk's first.
#[derive(Clone, Copy)]
struct Packed {
    ts_ns: u64,
    ptr: u64,
    event: Event,
    event_type: EventType,
    device: DeviceId,
    /// The row's sequence number less the chunk's first row's.
    seq: u32,
    name: Span,
    attrs: Span,
    python_stack: Span,
    c_frames: Span,
    flags: u8,
}

/// Where [`Chunk::place`] put the next row: its slot, the arenas' ends before it, and its
/// sequence number counted from the chunk's first row.
struct Place {
    row: usize,
    text: usize,
    frames: usize,
    seq: u32,
}

/// An operator's ATEN_START/ATEN_END row, stamped (`tid` by [`push_op`]): the hot producer's
/// most frequent row, queued without texts to copy.
#[derive(Clone, Copy)]
pub struct OpRow {
    pub event_type: EventType,
    /// Interned by the producer: valid and unchanged until the process exits.
    pub name: &'static [u8],
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u64,
}

impl OpRow {
    /// The row's numbers, as any row's (`tid` left for [`push_packed`] to stamp).
    pub fn numbers(&self) -> Numbers {
        Numbers {
            event: Event::OpLaunch,
            event_type: self.event_type,
            ts_ns: self.ts_ns,
            pid: self.pid,
            tid: 0,
            device: DeviceId::None,
            ptr: None,
        }
    }

    /// The row's texts, as any row's: the name alone.
    pub fn texts(&self) -> Texts<'static> {
        Texts {
            name: self.name,
            attrs: Attrs::None,
            python_stack: b"",
        }
    }
}

/// Rows, text bytes and C frames one chunk holds: about 100 KiB, which a busy thread fills in
/// a few milliseconds and which stays in its core's cache meanwhile.
const CHUNK_ROWS: usize = 512;
const CHUNK_TEXT: usize = 48 << 10;
const CHUNK_FRAMES: usize = 2048;
// A span's start and length are 16-bit.
const _: () = assert!(CHUNK_TEXT <= u16::MAX as usize);
const _: () = assert!(CHUNK_FRAMES <= u16::MAX as usize);
/// Emptied chunks a thread keeps for its next ones: at least this many, and up to as many as
/// the writer lately held for it, within the most.
const FREE_CHUNKS: usize = 8;
const MAX_FREE_CHUNKS: usize = 64;

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
    /// Of every row in the chunk: the first row's sequence number, the process and thread
    /// ids. Set with the first row, before `len` publishes it.
    first_seq: AtomicU64,
    pid: AtomicU32,
    tid: AtomicU64,
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
            first_seq: AtomicU64::new(0),
            pid: AtomicU32::new(0),
            tid: AtomicU64::new(0),
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

    /// Where the next row goes, when the chunk has room for it and `text` more arena bytes and
    /// `frames` more frames (and the row is the chunk's process's and thread's, near enough in
    /// sequence to its first). Only the thread filling the chunk calls this.
    #[inline(always)]
    fn place(&self, seq: u64, pid: u32, tid: u64, text: usize, frames: usize) -> Option<Place> {
        let n = self.len.load(Ordering::Relaxed);
        let t = self.text_len.load(Ordering::Relaxed);
        let f = self.frames_len.load(Ordering::Relaxed);
        if n >= CHUNK_ROWS || t + text > CHUNK_TEXT || f + frames > CHUNK_FRAMES {
            return None;
        }
        if n == 0 {
            self.first_seq.store(seq, Ordering::Relaxed);
            self.pid.store(pid, Ordering::Relaxed);
            self.tid.store(tid, Ordering::Relaxed);
        } else if tid != self.tid.load(Ordering::Relaxed) || pid != self.pid.load(Ordering::Relaxed)
        {
            return None;
        }
        let seq = u32::try_from(seq.wrapping_sub(self.first_seq.load(Ordering::Relaxed))).ok()?;
        Some(Place {
            row: n,
            text: t,
            frames: f,
            seq,
        })
    }

    /// Writes the row at `place` and publishes it, with the arenas used up to `text_end` and
    /// `frames_end`.
    #[inline(always)]
    fn publish(&self, place: &Place, packed: Packed, text_end: usize, frames_end: usize) {
        // SAFETY: slot `place.row` is unpublished (it was `len`), so only this thread touches it.
        unsafe { (*self.rows.add(place.row)).write(packed) };
        if text_end != place.text {
            self.text_len.store(text_end, Ordering::Relaxed);
        }
        if frames_end != place.frames {
            self.frames_len.store(frames_end, Ordering::Relaxed);
        }
        self.len.store(place.row + 1, Ordering::Release);
    }

    /// Appends and publishes a row; false when the chunk has no room for it (see
    /// [`Chunk::place`]).
    fn push(&self, seq: u64, numbers: Numbers, texts: &Texts, frames: &[u64]) -> bool {
        let Some(place) = self.place(seq, numbers.pid, numbers.tid, texts.len(), frames.len())
        else {
            return false;
        };
        let mut at = place.text;
        let mut block = Span::EMPTY;
        if let Attrs::Block(b) = &texts.attrs {
            // Written as the struct (its padding is no byte a slice may show), unaligned.
            let size = queued_size(b);
            // SAFETY: `at..at + size` lies inside the arena (`place` checked `texts.len()`,
            // which counts the struct) and past every published row's bytes.
            unsafe {
                if b.owner {
                    self.text.add(at).cast::<BlockAttrs>().write_unaligned(*b);
                } else {
                    self.text
                        .add(at)
                        .cast::<BareBlock>()
                        .write_unaligned(BareBlock::of(b));
                }
            }
            block = Span {
                start: at as u16,
                len: size as u16,
            };
            at += size;
        }
        let mut copy = |bytes: &[u8]| {
            // Most rows have empty texts (an op's attrs and stack): no call to copy nothing.
            if !bytes.is_empty() {
                // SAFETY: `at..at + len` lies inside the arena (checked by `place`) and past
                // every published row's bytes: nobody reads it until `len` publishes this row.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.text.add(at), bytes.len());
                }
            }
            // Both fit in 16 bits: the arena is shorter (checked by `place`).
            let span = Span {
                start: at as u16,
                len: bytes.len() as u16,
            };
            at += bytes.len();
            span
        };
        let (name, name_flag) = if texts.name == NA {
            (Span::EMPTY, NAME_NA)
        } else {
            (copy(texts.name), 0)
        };
        let (attrs, attrs_flag) = match &texts.attrs {
            Attrs::None => (Span::EMPTY, 0),
            Attrs::Json(a) => (copy(a), ATTRS_JSON),
            Attrs::Block(_) => (block, ATTRS_BLOCK),
        };
        let python_stack = copy(texts.python_stack);
        let f = place.frames;
        if !frames.is_empty() {
            // SAFETY: as for the text, in the frames arena.
            unsafe {
                std::ptr::copy_nonoverlapping(frames.as_ptr(), self.frames.add(f), frames.len());
            }
        }
        let packed = Packed {
            ts_ns: numbers.ts_ns,
            ptr: numbers.ptr.unwrap_or(0),
            event: numbers.event,
            event_type: numbers.event_type,
            device: numbers.device,
            seq: place.seq,
            name,
            attrs,
            python_stack,
            c_frames: Span {
                start: f as u16,
                len: frames.len() as u16,
            },
            flags: attrs_flag | name_flag | if numbers.ptr.is_some() { HAS_PTR } else { 0 },
        };
        self.publish(&place, packed, at, f + frames.len());
        true
    }

    /// Appends and publishes an op row (OP_LAUNCH, no device, no Ptr) whose name is interned:
    /// the row keeps the name's address, and nothing goes into the arenas. False as for
    /// [`Chunk::push`], or when the name is too long for a span (its row is copied then).
    #[inline(always)]
    fn push_op(&self, seq: u64, op: &OpRow) -> bool {
        let Ok(name_len) = u16::try_from(op.name.len()) else {
            return false;
        };
        let Some(place) = self.place(seq, op.pid, op.tid, 0, 0) else {
            return false;
        };
        let packed = Packed {
            ts_ns: op.ts_ns,
            ptr: op.name.as_ptr() as u64,
            event: Event::OpLaunch,
            event_type: op.event_type,
            device: DeviceId::None,
            seq: place.seq,
            name: Span {
                start: 0,
                len: name_len,
            },
            attrs: Span::EMPTY,
            python_stack: Span::EMPTY,
            c_frames: Span::EMPTY,
            flags: NAME_INTERNED,
        };
        self.publish(&place, packed, place.text, place.frames);
        true
    }

    /// The writer: the first published row not read yet, and its slot.
    fn unread(&self) -> Option<(usize, &Packed)> {
        let taken = self.taken.load(Ordering::Relaxed);
        if taken >= self.len.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: slot `taken` < `len` was published (acquire above) and is not written again
        // until the chunk is emptied, by the writer.
        Some((taken, unsafe { (*self.rows.add(taken)).assume_init_ref() }))
    }

    /// The writer: the key (time, sequence number) of the first row not read yet.
    fn head_key(&self) -> Option<(u64, u64)> {
        self.unread().map(|(_, p)| (p.ts_ns, self.seq_of(p)))
    }

    /// The writer: a published row's sequence number.
    fn seq_of(&self, p: &Packed) -> u64 {
        self.first_seq
            .load(Ordering::Relaxed)
            .wrapping_add(u64::from(p.seq))
    }

    /// The writer: reads the first row not read yet into `out` (its strings' and frames'
    /// capacity reused); false when there is none.
    fn next_into(&self, out: &mut Queued) -> bool {
        let Some((slot, p)) = self.unread() else {
            return false;
        };
        self.unpack_into(p, out);
        self.taken.store(slot + 1, Ordering::Relaxed);
        true
    }

    fn bytes(&self, span: Span) -> &[u8] {
        let range = span.range();
        if range.end > CHUNK_TEXT {
            return &[];
        }
        // SAFETY: the span is a published row's, inside the arena, and not written again
        // until the chunk is emptied.
        unsafe { std::slice::from_raw_parts(self.text.add(range.start), range.len()) }
    }

    /// The block copied into the arena at `span` (none if the span cannot hold one).
    fn block_attrs(&self, span: Span) -> Option<BlockAttrs> {
        let bytes = self.bytes(span);
        let len = bytes.len();
        // `push` copied a `BlockAttrs` or a `BareBlock`, told apart by their length.
        if len == std::mem::size_of::<BlockAttrs>() {
            // SAFETY: the bytes of a `BlockAttrs`, read unaligned.
            Some(unsafe { bytes.as_ptr().cast::<BlockAttrs>().read_unaligned() })
        } else if len == std::mem::size_of::<BareBlock>() {
            // SAFETY: the bytes of a `BareBlock`, read unaligned.
            Some(unsafe { bytes.as_ptr().cast::<BareBlock>().read_unaligned() }.attrs())
        } else {
            None
        }
    }

    fn frames_of(&self, span: Span) -> &[u64] {
        let range = span.range();
        if range.is_empty() || range.end > CHUNK_FRAMES {
            return &[];
        }
        // SAFETY: as for `bytes`, in the frames arena.
        unsafe { std::slice::from_raw_parts(self.frames.add(range.start), range.len()) }
    }

    /// Makes `out` the whole row of `p`, in the strings `out` already has.
    fn unpack_into(&self, p: &Packed, out: &mut Queued) {
        let row = &mut out.row;
        let mut attrs = row
            .attrs_json
            .take()
            .unwrap_or_else(|| std::mem::take(&mut out.attrs_spare));
        row.reset(p.event, p.event_type);
        let name = if p.flags & NAME_INTERNED != 0 {
            // SAFETY: the producer's interned name, valid until the process exits (the ABI's
            // promise), `p.name.len` bytes at `p.ptr`.
            unsafe { std::slice::from_raw_parts(p.ptr as *const u8, p.name.len as usize) }
        } else if p.flags & NAME_NA != 0 {
            NA
        } else {
            self.bytes(p.name)
        };
        text_into(&mut row.name, name);
        row.ts_ns = p.ts_ns;
        row.pid = self.pid.load(Ordering::Relaxed);
        row.tid = self.tid.load(Ordering::Relaxed);
        row.device = p.device;
        row.ptr = (p.flags & HAS_PTR != 0).then_some(p.ptr);
        let block = (p.flags & ATTRS_BLOCK != 0)
            .then(|| self.block_attrs(p.attrs))
            .flatten();
        if p.flags & ATTRS_JSON != 0 {
            text_into(&mut attrs, self.bytes(p.attrs));
            row.attrs_json = Some(attrs);
        } else if let Some(b) = block {
            // With what the online analyses read of it (size, owner, site...): found while
            // rendering, not searched for in the text by each analysis.
            // SAFETY: a block's texts are interned by its producer (the ABI's promise).
            unsafe { b.render_into_row(attrs, row) };
        } else {
            out.attrs_spare = attrs;
        }
        text_into(&mut row.python_stack, self.bytes(p.python_stack));
        out.seq = self.seq_of(p);
        out.c_frames.clear();
        out.c_frames.extend_from_slice(self.frames_of(p.c_frames));
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

static REGISTRY: Mutex<Vec<Arc<ThreadBuffer>>> = Mutex::new(Vec::new());
/// Sequence numbers of rows queued by threads that are exiting (they have no buffer).
static ORPHAN_SEQ: AtomicU64 = AtomicU64::new(0);

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

/// Rows from threads whose thread-local buffer is already gone (emitted during thread exit).
static ORPHANS: Mutex<Vec<Queued>> = Mutex::new(Vec::new());

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
                if let Ok(mut registry) = REGISTRY.lock() {
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

/// The writer's side of one thread's buffer: the full chunks it took, oldest first, then the
/// chunk the thread was filling when they were taken, read behind the thread. Chunks stay
/// boxed, as in the hand-off.
#[allow(clippy::vec_box)]
struct Reader {
    buffer: Arc<ThreadBuffer>,
    chunks: VecDeque<Box<Chunk>>,
    /// The thread's current chunk when the full ones were last taken (null when it was among
    /// them, or the thread had none). Read after `chunks`: every row in it is newer.
    current: *const Chunk,
    /// Chunks read to the end, for the thread to fill again.
    emptied: Vec<Box<Chunk>>,
    /// The most chunks the writer held for the thread at a recent drain (one less per drain
    /// since).
    held_peak: usize,
}

// SAFETY: `current` points into the buffer the reader holds, whose chunks only the writer
// frees (or the buffer's drop, once the reader has let it go).
unsafe impl Send for Reader {}

impl Reader {
    fn new(buffer: Arc<ThreadBuffer>) -> Reader {
        Reader {
            buffer,
            chunks: VecDeque::new(),
            current: std::ptr::null(),
            emptied: Vec::new(),
            held_peak: 0,
        }
    }

    /// Takes the chunks the thread filled since the last call, and its whole rows (to `loose`).
    fn refill(&mut self, loose: &mut VecDeque<Queued>) {
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
    fn head(&mut self) -> Option<&Chunk> {
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

    fn head_key(&mut self) -> Option<(u64, u64)> {
        self.head()?.head_key()
    }

    /// Gives the emptied chunks back to the thread, keeping as many as the writer lately held
    /// for it at the most (at least [`FREE_CHUNKS`], at most [`MAX_FREE_CHUNKS`]); the rest are
    /// unmapped. Rows wait for the watermark, so while the writer holds a thread's chunks the
    /// thread fills about as many again, and how many it fills between two drains varies with
    /// when the writer wakes: keeping only what one drain emptied had a busy PyTorch thread map
    /// a quarter of its chunks afresh (and fault in their pages), while the surplus of the
    /// next drain was unmapped.
    fn give_back(&mut self) {
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
    fn finished(&mut self) -> bool {
        // Held by the registry and this reader alone: the thread's own reference is gone.
        Arc::strong_count(&self.buffer) <= 2 && self.head().is_none() && !self.buffer.has_rows()
    }
}

/// The rows queued and not written yet, kept where the threads queued them: packed rows stay in
/// their chunks, and each is made a whole row (in one reused row) only when it is written. So
/// the writer moves no row and holds no row's strings between drains, however far behind it is.
pub struct Backlog {
    readers: Vec<Reader>,
    /// Whole rows (steps, marks, OOM rows, rows too large for a chunk, rows of exiting
    /// threads), ordered by key.
    loose: VecDeque<Queued>,
    /// The row each packed row is read into.
    scratch: Queued,
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
        }
    }
}

/// Rows are written in the order of (time, sequence number).
fn key(q: &Queued) -> (u64, u64) {
    (q.row.ts_ns, q.seq)
}

impl Backlog {
    /// Takes what every thread has queued since the last call. Threads that have ended and
    /// whose rows were all written are forgotten.
    pub fn refill(&mut self) {
        let Ok(mut registry) = REGISTRY.lock() else {
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
        if let Ok(mut orphans) = ORPHANS.lock() {
            self.loose.extend(orphans.drain(..));
        }
        if self.loose.len() > before {
            self.loose.make_contiguous().sort_by_key(key);
        }
    }

    /// Takes what `buffers` queued since the last call, with a reader for each buffer new here.
    fn take_from(&mut self, buffers: &[Arc<ThreadBuffer>]) {
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
    fn refill_from(&mut self, buffers: &[Arc<ThreadBuffer>]) {
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
            attrs: attrs.map_or(Attrs::None, Attrs::Json),
            python_stack: stack,
        }
    }

    /// A whole STEP row named `name`, stamped `ts_ns`, numbered `seq`.
    fn step_row(name: &str, ts_ns: u64, seq: u64) -> Queued {
        let mut row = EventRow::new(Event::System, EventType::Step, name);
        row.ts_ns = ts_ns;
        Queued {
            seq,
            row,
            c_frames: Vec::new(),
            attrs_spare: String::new(),
        }
    }

    /// Every row written so far: (sequence number, row, C frames), cloned out of the reused one.
    fn write_all(backlog: &mut Backlog, buffers: &[Arc<ThreadBuffer>]) -> Vec<Queued> {
        backlog.refill_from(buffers);
        let mut out = Vec::new();
        backlog.write_until(u64::MAX, |q| {
            out.push(Queued {
                seq: q.seq,
                row: q.row.clone(),
                c_frames: q.c_frames.clone(),
                attrs_spare: String::new(),
            })
        });
        out
    }

    #[test]
    fn packed_rows_come_back_whole_and_reused_rows_carry_nothing_over() {
        let buffer = Arc::new(ThreadBuffer::default());
        let buffers = [buffer.clone()];
        let mut backlog = Backlog::default();
        let first = texts(
            b"aten::addmm",
            Some(br#"{"size":1024,"owner":"PTA@weight"}"#),
            b"t.py(3): f\nt.py(9): <module>",
        );
        assert!(buffer.push_packed(2, numbers(Event::Malloc, 0x10), &first, &[0xa, 0xb]));
        assert!(buffer.push_row(step_row("1", 7, 1)).is_none());
        let out = write_all(&mut backlog, &buffers);
        assert!(!buffer.has_rows());
        // Whole rows and packed ones are written in the order of (time, sequence number).
        let [b, a] = &out[..] else {
            panic!("{} rows", out.len())
        };
        assert_eq!((b.seq, a.seq), (1, 2));
        assert_eq!(a.row.name, "aten::addmm");
        assert_eq!((a.row.ts_ns, a.row.pid, a.row.tid), (7, 11, 13));
        assert_eq!((a.row.device, a.row.ptr), (DeviceId::Cuda(1), Some(0x10)));
        assert_eq!(a.row.attr_u64("size"), Some(1024));
        assert_eq!(a.row.python_stack, "t.py(3): f\nt.py(9): <module>");
        assert_eq!(a.c_frames, vec![0xa, 0xb]);
        assert_eq!(b.row.name, "1");

        // The next rows are read into the same row as the first: the new values are read,
        // and nothing of the old row stays.
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
        let out = write_all(&mut backlog, &buffers);
        let [c, d] = &out[..] else {
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

    /// An op row keeps its interned name's address: it comes back as the row a copied name
    /// makes (no device, no Ptr, no texts), in queueing order with the rows around it, and
    /// a following block row is unaffected by it. A name no span can measure goes copied.
    #[test]
    fn op_rows_keep_the_address_of_their_interned_name() {
        static NAME: &[u8] = b"aten::addmm.default";
        let buffer = Arc::new(ThreadBuffer::default());
        let mut backlog = Backlog::default();
        let op = |event_type, ts_ns| OpRow {
            event_type,
            name: NAME,
            ts_ns,
            pid: 11,
            tid: 13,
        };
        assert!(buffer.push_op(1, &op(EventType::AtenStart, 5)));
        assert!(buffer.push_packed(
            2,
            numbers(Event::Malloc, 0x10),
            &texts(b"N/A", None, b""),
            &[]
        ));
        assert!(buffer.push_op(3, &op(EventType::AtenEnd, 7)));
        let long: &'static [u8] = Box::leak(vec![b'x'; 70_000].into_boxed_slice());
        assert!(!buffer.push_op(
            4,
            &OpRow {
                name: long,
                ..op(EventType::AtenEnd, 8)
            }
        ));
        let out = write_all(&mut backlog, std::slice::from_ref(&buffer));
        let got: Vec<_> = out
            .iter()
            .map(|q| {
                let r = &q.row;
                (
                    q.seq,
                    r.event,
                    r.event_type,
                    r.name.as_str(),
                    r.ts_ns,
                    r.ptr,
                    r.device,
                )
            })
            .collect();
        let name = "aten::addmm.default";
        assert_eq!(
            got,
            [
                (
                    1,
                    Event::OpLaunch,
                    EventType::AtenStart,
                    name,
                    5,
                    None,
                    DeviceId::None
                ),
                (
                    2,
                    Event::Malloc,
                    EventType::Pta,
                    "N/A",
                    7,
                    Some(0x10),
                    DeviceId::Cuda(1)
                ),
                (
                    3,
                    Event::OpLaunch,
                    EventType::AtenEnd,
                    name,
                    7,
                    None,
                    DeviceId::None
                ),
            ]
        );
        for q in &out {
            assert_eq!((q.row.pid, q.row.tid), (11, 13));
            assert!(q.row.attrs_json.is_none() && q.row.python_stack.is_empty());
            assert!(q.c_frames.is_empty());
        }
    }

    /// Rows stay small: each one's bytes are fresh cache lines for the program's thread.
    /// The writer keeps the Attr text's string across rows without one: after an op row, a
    /// short Attr is written into the long one's string, not into a string of its own.
    #[test]
    fn rows_without_an_attr_keep_the_attr_string_for_the_next() {
        let buffer = Arc::new(ThreadBuffer::default());
        let mut backlog = Backlog::default();
        let long = format!(r#"{{"site":"{}"}}"#, "x".repeat(200));
        let rows = [
            texts(b"m", Some(long.as_bytes()), b""),
            texts(b"aten::mm.default", None, b""),
            texts(b"m", Some(br#"{"size":1}"#), b""),
        ];
        for (seq, t) in (1..).zip(&rows) {
            assert!(buffer.push_packed(seq, numbers(Event::Malloc, seq), t, &[]));
        }
        backlog.refill_from(std::slice::from_ref(&buffer));
        let mut seen = Vec::new();
        backlog.write_until(u64::MAX, |q| {
            seen.push(q.row.attrs_json.as_ref().map(|a| (a.clone(), a.capacity())));
        });
        let [Some((a, _)), None, Some((c, capacity))] = &seen[..] else {
            panic!("{seen:?}")
        };
        assert_eq!((a, c.as_str()), (&long, r#"{"size":1}"#));
        assert!(*capacity >= long.len(), "capacity {capacity}");
    }

    #[test]
    fn a_packed_row_is_56_bytes() {
        assert_eq!(std::mem::size_of::<Packed>(), 56);
    }

    /// A row keeps its own sequence number and ids, which its chunk holds once for all its
    /// rows: a row that does not share them with the chunk's first starts a chunk of its own.
    #[test]
    fn sequence_numbers_and_ids_come_back_as_queued() {
        let buffer = Arc::new(ThreadBuffer::default());
        let mut backlog = Backlog::default();
        let row = texts(b"aten::mm.default", None, b"");
        let far = 5 << 32;
        for (seq, tid) in [(3, 13), (4, 13), (far, 13), (far + 1, 14), (far + 2, 13)] {
            let mut n = numbers(Event::OpLaunch, seq);
            n.tid = tid;
            assert!(buffer.push_packed(seq, n, &row, &[]));
        }
        let out = write_all(&mut backlog, std::slice::from_ref(&buffer));
        let got: Vec<(u64, u64, u32)> = out.iter().map(|q| (q.seq, q.row.tid, q.row.pid)).collect();
        assert_eq!(
            got,
            vec![
                (3, 13, 11),
                (4, 13, 11),
                (far, 13, 11),
                (far + 1, 14, 11),
                (far + 2, 13, 11)
            ]
        );
        assert_eq!(buffer.handoff.lock().unwrap().mapped, 4);
    }

    /// A block row goes as numbers and interned texts; its Attr column is rendered when it is
    /// read, packed or (too large for a chunk) whole, the same either way.
    #[test]
    fn a_block_row_is_rendered_when_read() {
        use msmemscope_core::events::abi::{BlockRecord, BLOCK_OWNER, BLOCK_USED};
        let record = BlockRecord {
            event: Event::Malloc as u32,
            event_type: EventType::Pta as u32,
            device_kind: 1,
            device_index: 0,
            ptr: 0x1000,
            allocation_id: 5,
            size: 256,
            flags: BLOCK_USED | BLOCK_OWNER,
            reserved: 0,
            used: 512,
            total: 0,
            category: StrRef::new("activation"),
            labels: StrRef::EMPTY,
            site: StrRef::new("train.py:7 (step)"),
            frame: StrRef::EMPTY,
            op: StrRef::new("aten::mm"),
            module: StrRef::EMPTY,
            python_stack: StrRef::EMPTY,
        };
        let expected = r#"{"allocation_id":5,"addr":"0x0000000000001000","size":256,"used":512,"owner":"PTA@activation","site":"train.py:7 (step)","op":"aten::mm"}"#;
        let (read, queued, whole) = block_round_trip(&record, Event::Malloc, DeviceId::Cpu);
        assert_eq!(queued, std::mem::size_of::<BlockAttrs>());
        assert_eq!(read.row.attrs_json.as_deref(), Some(expected));
        assert_eq!(read.row.attr_u64("allocation_id"), Some(5));
        assert_eq!(whole.attrs_json.as_deref(), Some(expected));
    }

    /// A block row of `record` queued alone in a fresh buffer and read back, the arena bytes it
    /// took, and the whole row its texts make.
    fn block_round_trip(
        record: &msmemscope_core::events::abi::BlockRecord,
        event: Event,
        device: DeviceId,
    ) -> (Queued, usize, EventRow) {
        let block = Texts {
            name: b"N/A",
            attrs: Attrs::Block(BlockAttrs::of(record)),
            python_stack: b"",
        };
        let buffer = Arc::new(ThreadBuffer::default());
        let mut backlog = Backlog::default();
        assert!(buffer.push_packed(0, numbers(event, record.ptr), &block, &[]));
        let queued = buffer
            .current()
            .map_or(0, |c| c.text_len.load(Ordering::Relaxed));
        let mut out = write_all(&mut backlog, std::slice::from_ref(&buffer));
        let whole = block.row(event, EventType::Pta, device, Some(record.ptr));
        (out.remove(0), queued, whole)
    }

    /// A block row without the owner member (a FREE row) queues its numbers alone, and reads
    /// back as the same Attr as its whole row; its `N/A` name takes no arena byte.
    #[test]
    fn a_block_row_without_owner_queues_its_numbers_alone() {
        use msmemscope_core::events::abi::{BlockRecord, BLOCK_TOTAL, BLOCK_USED};
        let record = |flags, used, total| BlockRecord {
            event: Event::Free as u32,
            event_type: EventType::Pta as u32,
            device_kind: 2,
            device_index: 1,
            ptr: 0xdead_beef_0000,
            allocation_id: u64::MAX,
            size: 1 << 40,
            flags,
            reserved: 0,
            used,
            total,
            // Not rendered without the owner member, so not queued either.
            category: StrRef::new("activation"),
            labels: StrRef::EMPTY,
            site: StrRef::new("train.py:7 (step)"),
            frame: StrRef::EMPTY,
            op: StrRef::EMPTY,
            module: StrRef::EMPTY,
            python_stack: StrRef::EMPTY,
        };
        let cases = [
            (
                record(BLOCK_USED | BLOCK_TOTAL, 7, 0),
                r#"{"allocation_id":18446744073709551615,"addr":"0x0000deadbeef0000","size":1099511627776,"used":7,"total":0}"#,
            ),
            (
                record(BLOCK_TOTAL, 7, 9),
                r#"{"allocation_id":18446744073709551615,"addr":"0x0000deadbeef0000","size":1099511627776,"total":9}"#,
            ),
            (
                record(0, 7, 9),
                r#"{"allocation_id":18446744073709551615,"addr":"0x0000deadbeef0000","size":1099511627776}"#,
            ),
        ];
        for (record, expected) in cases {
            let (read, queued, whole) = block_round_trip(&record, Event::Free, DeviceId::Cuda(1));
            assert_eq!(queued, std::mem::size_of::<BareBlock>());
            assert_eq!(read.row.name, "N/A");
            assert_eq!(read.row.attrs_json.as_deref(), Some(expected));
            assert_eq!(whole.attrs_json.as_deref(), Some(expected));
        }
    }

    #[test]
    fn full_chunks_are_handed_over_in_order_and_emptied_ones_used_again() {
        let buffer = Arc::new(ThreadBuffer::default());
        let buffers = [buffer.clone()];
        let mut backlog = Backlog::default();
        let mut out = Vec::new();
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
                out.extend(write_all(&mut backlog, &buffers));
            }
        }
        out.extend(write_all(&mut backlog, &buffers));
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

    /// A thread that fills an uneven number of chunks between drains, while the rows of the
    /// last twenty chunks wait for the watermark, maps no new chunk once it has run a while:
    /// the writer gives back as many as it held for the thread.
    #[test]
    fn a_busy_thread_in_a_steady_state_maps_no_new_chunk() {
        let buffer = Arc::new(ThreadBuffer::default());
        let buffers = [buffer.clone()];
        let mut backlog = Backlog::default();
        let lag = 20 * CHUNK_ROWS as u64;
        let mut seq = 0u64;
        let mut written = 0u64;
        let mapped = || buffer.handoff.lock().unwrap().mapped;
        let mut after_warmup = 0;
        for round in 0..120 {
            if round == 40 {
                after_warmup = mapped();
            }
            let chunks = [2u64, 12, 3, 10, 1, 14, 4][round % 7];
            for _ in 0..chunks * CHUNK_ROWS as u64 {
                let mut n = numbers(Event::OpLaunch, seq);
                n.ts_ns = seq;
                assert!(buffer.push_packed(seq, n, &texts(b"aten::mm.default", None, b""), &[]));
                seq += 1;
            }
            backlog.refill_from(&buffers);
            written += backlog.write_until(seq.saturating_sub(lag), |_| {}) as u64;
        }
        // Rows stamped at the watermark are written too.
        assert_eq!(written, seq - lag + 1);
        assert!(
            after_warmup > 20,
            "mapped {after_warmup} chunks to begin with"
        );
        assert_eq!(mapped(), after_warmup);
    }

    /// Rows younger than the watermark stay where they are, and come first at the next write.
    #[test]
    fn rows_after_the_watermark_wait_in_their_chunk() {
        let buffer = Arc::new(ThreadBuffer::default());
        let buffers = [buffer.clone()];
        let mut backlog = Backlog::default();
        for seq in 0..10u64 {
            let mut n = numbers(Event::Malloc, seq);
            n.ts_ns = 100 + seq;
            assert!(buffer.push_packed(seq, n, &texts(b"N/A", None, b""), &[]));
        }
        backlog.refill_from(&buffers);
        let mut first = Vec::new();
        assert_eq!(backlog.write_until(104, |q| first.push(q.seq)), 5);
        assert_eq!(first, vec![0, 1, 2, 3, 4]);
        let rest: Vec<u64> = write_all(&mut backlog, &buffers)
            .iter()
            .map(|q| q.seq)
            .collect();
        assert_eq!(rest, vec![5, 6, 7, 8, 9]);
    }

    /// Two threads' rows come out merged by time, each thread's in its own order; a thread
    /// that queued nothing holds nothing up.
    #[test]
    fn the_rows_of_several_threads_are_merged_by_time() {
        let (a, b) = (
            Arc::new(ThreadBuffer::default()),
            Arc::new(ThreadBuffer::default()),
        );
        let idle = Arc::new(ThreadBuffer::default());
        let mut backlog = Backlog::default();
        for (buffer, times) in [(&a, [1u64, 4, 5, 9]), (&b, [2, 3, 6, 7])] {
            for (seq, ts) in times.into_iter().enumerate() {
                let mut n = numbers(Event::Malloc, ts);
                n.ts_ns = ts;
                assert!(buffer.push_packed(seq as u64, n, &texts(b"N/A", None, b""), &[]));
            }
        }
        assert!(b.push_row(step_row("8", 8, 9)).is_none());
        let times: Vec<u64> = write_all(&mut backlog, &[idle, a, b])
            .iter()
            .map(|q| q.row.ts_ns)
            .collect();
        assert_eq!(times, (1..=9).collect::<Vec<_>>());
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
                        assert!(buffer.push_row(step_row(&name, 7, seq)).is_none());
                    } else {
                        assert!(buffer.push_packed(seq, numbers(Event::OpLaunch, seq), &row, &[]));
                    }
                }
            })
        };
        let buffers = [buffer.clone()];
        let mut backlog = Backlog::default();
        let mut out = Vec::new();
        while !producer.is_finished() {
            out.extend(write_all(&mut backlog, &buffers));
        }
        producer.join().unwrap();
        out.extend(write_all(&mut backlog, &buffers));
        let mut seqs: Vec<u64> = out.iter().map(|q| q.seq).collect();
        // Packed rows arrive in the order queued; whole rows may come a drain early.
        let packed: Vec<u64> = seqs.iter().copied().filter(|s| s % 1000 != 999).collect();
        assert!(packed.windows(2).all(|w| w[0] < w[1]));
        seqs.sort_unstable();
        assert_eq!(seqs, (0..total).collect::<Vec<_>>());
        assert!(out.iter().all(|q| q.row.name == q.seq.to_string()));
    }
}
