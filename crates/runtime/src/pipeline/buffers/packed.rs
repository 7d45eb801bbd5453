//! Packing a row on the program's thread: its numbers and spans of the arenas of the thread's
//! current [`Chunk`], its texts copied there; and unpacking it on the writer's thread into a
//! whole [`EventRow`]. A chunk is filled by one thread only and read by the writer behind it
//! (the parent module says why no lock is taken per row).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use msmemscope_core::events::abi::{BlockAttrs, StrRef};
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

use super::Queued;

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

    pub(super) fn len(&self) -> usize {
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
pub(super) struct BareBlock {
    pub(super) allocation_id: u64,
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) used: u64,
    pub(super) total: u64,
    /// [`BARE_USED`], [`BARE_TOTAL`]: which of the two are given.
    pub(super) given: u64,
}

pub(super) const BARE_USED: u64 = 1;
pub(super) const BARE_TOTAL: u64 = 2;
// The two forms are told apart by their queued length.
const _: () = assert!(std::mem::size_of::<BareBlock>() != std::mem::size_of::<BlockAttrs>());

impl BareBlock {
    pub(super) fn of(b: &BlockAttrs) -> BareBlock {
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

    pub(super) fn attrs(&self) -> BlockAttrs {
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
pub(super) fn queued_size(b: &BlockAttrs) -> usize {
    if b.owner {
        std::mem::size_of::<BlockAttrs>()
    } else {
        std::mem::size_of::<BareBlock>()
    }
}

/// A range of a chunk's arena (a chunk's arenas are shorter than 64 Ki entries).
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) start: u16,
    pub(super) len: u16,
}

impl Span {
    pub(super) const EMPTY: Span = Span { start: 0, len: 0 };

    pub(super) fn range(self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + self.len as usize
    }
}

/// [`Packed::flags`]: the row has a Ptr; what its `attrs` span holds.
pub(super) const HAS_PTR: u8 = 1;
/// The Attr text.
pub(super) const ATTRS_JSON: u8 = 2;
/// A [`BlockAttrs`], its bytes (unaligned).
pub(super) const ATTRS_BLOCK: u8 = 4;
/// An op row's name, interned by its producer: its bytes are at `ptr` (an op row has no Ptr),
/// and the `name` span's length is theirs.
pub(super) const NAME_INTERNED: u8 = 8;
/// The row's name is `N/A` (every block row's), which is not copied into the arena.
pub(super) const NAME_NA: u8 = 16;
/// The dump's Name of a row that names nothing.
pub(super) const NA: &[u8] = b"N/A";

/// A row queued without its own strings: its numbers and spans of its chunk's arenas. Kept
/// small (56 bytes): each row's bytes are fresh cache lines for the program's thread to write,
/// so the process and thread ids, the same for every row of a chunk, are the chunk's, and the
/// sequence number is counted from the chunk's first.
#[derive(Clone, Copy)]
pub(super) struct Packed {
    pub(super) ts_ns: u64,
    pub(super) ptr: u64,
    pub(super) event: Event,
    pub(super) event_type: EventType,
    pub(super) device: DeviceId,
    /// The row's sequence number less the chunk's first row's.
    pub(super) seq: u32,
    pub(super) name: Span,
    pub(super) attrs: Span,
    pub(super) python_stack: Span,
    pub(super) c_frames: Span,
    pub(super) flags: u8,
}

/// Where [`Chunk::place`] put the next row: its slot, the arenas' ends before it, and its
/// sequence number counted from the chunk's first row.
pub(super) struct Place {
    pub(super) row: usize,
    pub(super) text: usize,
    pub(super) frames: usize,
    pub(super) seq: u32,
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
pub(super) const CHUNK_ROWS: usize = 512;
pub(super) const CHUNK_TEXT: usize = 48 << 10;
pub(super) const CHUNK_FRAMES: usize = 2048;
// A span's start and length are 16-bit.
const _: () = assert!(CHUNK_TEXT <= u16::MAX as usize);
const _: () = assert!(CHUNK_FRAMES <= u16::MAX as usize);
/// Emptied chunks a thread keeps for its next ones: at least this many, and up to as many as
/// the writer lately held for it, within the most.
pub(super) const FREE_CHUNKS: usize = 8;
pub(super) const MAX_FREE_CHUNKS: usize = 64;

/// A fixed block of packed rows that one thread fills (its current chunk) and the writer reads
/// behind it. The filling thread writes a row's slot and arena bytes past everything published,
/// then publishes the row with a release store of `len`; the writer reads only published rows
/// (an acquire load of `len`). Once the chunk is handed over full, only the writer touches it
/// until it hands it back empty, through the hand-off lock.
pub(super) struct Chunk {
    /// The memory of the three arrays below (unmapped when the chunk is dropped).
    pub(super) _region: Region,
    /// `CHUNK_ROWS` row slots, `CHUNK_FRAMES` frames and `CHUNK_TEXT` bytes, in `region`.
    pub(super) rows: *mut MaybeUninit<Packed>,
    pub(super) frames: *mut u64,
    pub(super) text: *mut u8,
    /// Rows published.
    pub(super) len: AtomicUsize,
    /// Arena bytes and frames in use: the filling thread's (the writer's once handed over).
    pub(super) text_len: AtomicUsize,
    pub(super) frames_len: AtomicUsize,
    /// Of every row in the chunk: the first row's sequence number, the process and thread
    /// ids. Set with the first row, before `len` publishes it.
    pub(super) first_seq: AtomicU64,
    pub(super) pid: AtomicU32,
    pub(super) tid: AtomicU64,
    /// Rows the writer has taken: the writer's.
    pub(super) taken: AtomicUsize,
}

// SAFETY: the arrays are written by the one thread filling the chunk, only past what `len`
// published, and read by the writer only up to it (release/acquire on `len`); a chunk handed
// over changes hands under the hand-off lock.
unsafe impl Sync for Chunk {}
// SAFETY: as above; the region belongs to the chunk, whichever thread drops it.
unsafe impl Send for Chunk {}

/// Anonymous memory mapped for one chunk. Chunks are made on the program's thread and may be
/// freed on the writer's: mapped, they take nothing from the program's heap.
pub(super) struct Region {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Region {
    pub(super) fn new(len: usize) -> Option<Region> {
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
    pub(super) fn new() -> Option<Box<Chunk>> {
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
    pub(super) fn holds(texts: &Texts, frames: &[u64]) -> bool {
        texts.len() <= CHUNK_TEXT && frames.len() <= CHUNK_FRAMES
    }

    /// Where the next row goes, when the chunk has room for it and `text` more arena bytes and
    /// `frames` more frames (and the row is the chunk's process's and thread's, near enough in
    /// sequence to its first). Only the thread filling the chunk calls this.
    #[inline(always)]
    pub(super) fn place(
        &self,
        seq: u64,
        pid: u32,
        tid: u64,
        text: usize,
        frames: usize,
    ) -> Option<Place> {
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
    pub(super) fn publish(
        &self,
        place: &Place,
        packed: Packed,
        text_end: usize,
        frames_end: usize,
    ) {
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
    pub(super) fn push(&self, seq: u64, numbers: Numbers, texts: &Texts, frames: &[u64]) -> bool {
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
    pub(super) fn push_op(&self, seq: u64, op: &OpRow) -> bool {
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
    pub(super) fn unread(&self) -> Option<(usize, &Packed)> {
        let taken = self.taken.load(Ordering::Relaxed);
        if taken >= self.len.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: slot `taken` < `len` was published (acquire above) and is not written again
        // until the chunk is emptied, by the writer.
        Some((taken, unsafe { (*self.rows.add(taken)).assume_init_ref() }))
    }

    /// The writer: the key (time, sequence number) of the first row not read yet.
    pub(super) fn head_key(&self) -> Option<(u64, u64)> {
        self.unread().map(|(_, p)| (p.ts_ns, self.seq_of(p)))
    }

    /// The writer: a published row's sequence number.
    pub(super) fn seq_of(&self, p: &Packed) -> u64 {
        self.first_seq
            .load(Ordering::Relaxed)
            .wrapping_add(u64::from(p.seq))
    }

    /// The writer: reads the first row not read yet into `out` (its strings' and frames'
    /// capacity reused); false when there is none.
    pub(super) fn next_into(&self, out: &mut Queued) -> bool {
        let Some((slot, p)) = self.unread() else {
            return false;
        };
        self.unpack_into(p, out);
        self.taken.store(slot + 1, Ordering::Relaxed);
        true
    }

    pub(super) fn bytes(&self, span: Span) -> &[u8] {
        let range = span.range();
        if range.end > CHUNK_TEXT {
            return &[];
        }
        // SAFETY: the span is a published row's, inside the arena, and not written again
        // until the chunk is emptied.
        unsafe { std::slice::from_raw_parts(self.text.add(range.start), range.len()) }
    }

    /// The block copied into the arena at `span` (none if the span cannot hold one).
    pub(super) fn block_attrs(&self, span: Span) -> Option<BlockAttrs> {
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

    pub(super) fn frames_of(&self, span: Span) -> &[u64] {
        let range = span.range();
        if range.is_empty() || range.end > CHUNK_FRAMES {
            return &[];
        }
        // SAFETY: as for `bytes`, in the frames arena.
        unsafe { std::slice::from_raw_parts(self.frames.add(range.start), range.len()) }
    }

    /// Makes `out` the whole row of `p`, in the strings `out` already has.
    pub(super) fn unpack_into(&self, p: &Packed, out: &mut Queued) {
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
    pub(super) fn clear(&self) {
        self.len.store(0, Ordering::Relaxed);
        self.taken.store(0, Ordering::Relaxed);
        self.text_len.store(0, Ordering::Relaxed);
        self.frames_len.store(0, Ordering::Relaxed);
    }

    pub(super) fn untaken(&self) -> bool {
        self.len.load(Ordering::Acquire) > self.taken.load(Ordering::Relaxed)
    }
}

/// Sets `out` to `bytes` read as UTF-8, in the capacity `out` already has.
pub(super) fn text_into(out: &mut String, bytes: &[u8]) {
    out.clear();
    // The producer's bytes, unchecked until now.
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}
