//! Per-thread event buffers. A producer appends to its own thread's buffer (a lock nobody else
//! takes except the writer, briefly, to swap the buffer out); the writer drains every buffer.
//!
//! The hot producers (the PyTorch capture, through the C ABI) queue a [`Packed`] row: its
//! numbers, and its texts copied into the batch's one byte arena. The application thread so
//! makes no heap allocation per row, and the row's strings are made and freed by the writer,
//! on its own thread (a string made on one thread and freed on another costs both threads a
//! lock on the first one's malloc arena). Rarer producers (steps, marks, the OOM watch) queue
//! a whole [`EventRow`].

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

/// A row and its global sequence number (ties between equal timestamps keep emit order).
pub struct Queued {
    pub seq: u64,
    pub row: EventRow,
    /// Raw C frames to symbolize in the writer, when the C stack was asked for.
    pub c_frames: Vec<u64>,
}

/// A row's texts, borrowed from its producer for the call.
pub struct Texts<'a> {
    pub name: &'a str,
    /// The Attr column as the producer rendered it (a checked JSON object), if any.
    pub attrs_json: Option<&'a str>,
    pub python_stack: &'a str,
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

/// A row queued without its own strings: ranges into its batch's arenas.
struct Packed {
    seq: u64,
    numbers: Numbers,
    name: Range<u32>,
    attrs_json: Option<Range<u32>>,
    python_stack: Range<u32>,
    c_frames: Range<u32>,
}

enum Entry {
    Packed(Packed),
    Row(Box<Queued>),
}

/// One thread's rows since the last drain, with the arenas their texts and frames live in.
#[derive(Default)]
struct Batch {
    entries: Vec<Entry>,
    text: Vec<u8>,
    frames: Vec<u64>,
}

impl Batch {
    /// Copies `s` into the text arena (`None` when the arena would pass 4 GiB).
    fn text(&mut self, s: &str) -> Option<Range<u32>> {
        let start = u32::try_from(self.text.len()).ok()?;
        let end = u32::try_from(self.text.len() + s.len()).ok()?;
        self.text.try_reserve(s.len()).ok()?;
        self.text.extend_from_slice(s.as_bytes());
        Some(start..end)
    }

    fn frames(&mut self, frames: &[u64]) -> Option<Range<u32>> {
        let start = u32::try_from(self.frames.len()).ok()?;
        let end = u32::try_from(self.frames.len() + frames.len()).ok()?;
        self.frames.try_reserve(frames.len()).ok()?;
        self.frames.extend_from_slice(frames);
        Some(start..end)
    }

    fn pack(&mut self, seq: u64, numbers: Numbers, texts: &Texts, frames: &[u64]) -> bool {
        if self.entries.try_reserve(1).is_err() {
            return false;
        }
        let (text_len, frames_len) = (self.text.len(), self.frames.len());
        let packed = (|| {
            Some(Packed {
                seq,
                numbers,
                name: self.text(texts.name)?,
                attrs_json: match texts.attrs_json {
                    Some(a) => Some(self.text(a)?),
                    None => None,
                },
                python_stack: self.text(texts.python_stack)?,
                c_frames: self.frames(frames)?,
            })
        })();
        match packed {
            Some(p) => {
                self.entries.push(Entry::Packed(p));
                true
            }
            None => {
                self.text.truncate(text_len);
                self.frames.truncate(frames_len);
                false
            }
        }
    }

    /// Moves every entry, as whole rows (made from `spare`'s first), to the end of `out`;
    /// leaves the batch empty with its capacity.
    fn unpack_into(&mut self, out: &mut Vec<Queued>, spare: &mut Vec<EventRow>) {
        out.reserve(self.entries.len());
        for entry in self.entries.drain(..) {
            out.push(match entry {
                Entry::Row(q) => *q,
                Entry::Packed(p) => unpack(&p, &self.text, &self.frames, spare),
            });
        }
        self.text.clear();
        self.frames.clear();
    }
}

/// Sets `out` to the text of `r` in `arena`, in the capacity `out` already has.
fn text_into(out: &mut String, arena: &[u8], r: &Range<u32>) {
    let bytes = arena.get(r.start as usize..r.end as usize).unwrap_or(&[]);
    out.clear();
    // Copied from `&str`s, each on a char boundary: always valid.
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

/// The whole row of `p`, in a row from `spare` when it has one (its strings' capacity reused).
fn unpack(p: &Packed, text: &[u8], frames: &[u64], spare: &mut Vec<EventRow>) -> Queued {
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
    text_into(&mut row.name, text, &p.name);
    row.ts_ns = n.ts_ns;
    row.pid = n.pid;
    row.tid = n.tid;
    row.device = n.device;
    row.ptr = n.ptr;
    row.attrs_json = match &p.attrs_json {
        Some(r) => {
            let mut attrs = row.attrs_json.take().unwrap_or_default();
            text_into(&mut attrs, text, r);
            Some(attrs)
        }
        None => None,
    };
    text_into(&mut row.python_stack, text, &p.python_stack);
    Queued {
        seq: p.seq,
        row,
        c_frames: frames
            .get(p.c_frames.start as usize..p.c_frames.end as usize)
            .unwrap_or(&[])
            .to_vec(),
    }
}

#[derive(Default)]
pub struct ThreadBuffer {
    rows: Mutex<Batch>,
    /// The writer's half of a double buffer: an empty batch with the capacity of an earlier
    /// one, swapped in for `rows` at each drain. The producer so keeps writing into memory
    /// already paged in, and the writer unpacks the batch after letting go of `rows`, never
    /// while the producer waits.
    spare: Mutex<Batch>,
}

static REGISTRY: Mutex<Vec<Arc<ThreadBuffer>>> = Mutex::new(Vec::new());
static SEQ: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static MINE: RefCell<Option<Arc<ThreadBuffer>>> = const { RefCell::new(None) };
}

/// Rows from threads whose thread-local buffer is already gone (emitted during thread exit).
static ORPHANS: Mutex<Vec<Queued>> = Mutex::new(Vec::new());

fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Runs `f` on this thread's batch; false when the thread has none any more (it is exiting)
/// or `f` could not queue the row.
fn with_batch(f: impl FnOnce(&mut Batch) -> bool) -> bool {
    MINE.try_with(|mine| {
        let mut mine = mine.borrow_mut();
        let buffer = mine.get_or_insert_with(|| {
            let buffer = Arc::new(ThreadBuffer::default());
            if let Ok(mut registry) = REGISTRY.lock() {
                registry.push(buffer.clone());
            }
            buffer
        });
        let queued = match buffer.rows.lock() {
            Ok(mut rows) => f(&mut rows),
            Err(_) => false,
        };
        queued
    })
    .unwrap_or(false)
}

fn orphan(q: Queued) {
    if let Ok(mut orphans) = ORPHANS.lock() {
        orphans.push(q);
    }
}

/// Appends a whole row to this thread's buffer.
pub fn push(row: EventRow, c_frames: Vec<u64>) {
    let mut queued = Some(Box::new(Queued {
        seq: next_seq(),
        row,
        c_frames,
    }));
    with_batch(|batch| {
        if batch.entries.try_reserve(1).is_err() {
            return false;
        }
        batch.entries.extend(queued.take().map(Entry::Row));
        true
    });
    if let Some(q) = queued {
        orphan(*q);
    }
}

/// Appends a row given by its numbers and borrowed texts, copying the texts into the batch.
pub fn push_packed(numbers: Numbers, texts: &Texts, c_frames: &[u64]) {
    let seq = next_seq();
    if !with_batch(|batch| batch.pack(seq, numbers, texts, c_frames)) {
        let mut one = Batch::default();
        if one.pack(seq, numbers, texts, c_frames) {
            let mut out = Vec::new();
            one.unpack_into(&mut out, &mut Vec::new());
            out.into_iter().for_each(orphan);
        }
    }
}

/// Moves every row queued so far, from every thread, to the end of `out`. Rows written
/// before, handed back in `spare`, are reused for them.
pub fn drain_into(out: &mut Vec<Queued>, spare: &mut Vec<EventRow>) {
    let buffers: Vec<Arc<ThreadBuffer>> = match REGISTRY.lock() {
        Ok(registry) => registry.clone(),
        Err(_) => return,
    };
    if let Ok(mut orphans) = ORPHANS.lock() {
        out.append(&mut orphans);
    }
    for buffer in &buffers {
        let Ok(mut batch) = buffer.spare.lock() else {
            continue;
        };
        if let Ok(mut rows) = buffer.rows.lock() {
            std::mem::swap(&mut *rows, &mut *batch);
        }
        // Leaves `batch` empty with its capacity: the next drain's swap hands it back.
        batch.unpack_into(out, spare);
    }
    drop(buffers);
    // Buffers only the registry still holds belong to exited threads and are now empty.
    if let Ok(mut registry) = REGISTRY.lock() {
        registry.retain(|b| {
            Arc::strong_count(b) > 1 || b.rows.lock().is_ok_and(|r| !r.entries.is_empty())
        });
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

    #[test]
    fn packed_rows_come_back_whole_in_order_and_reused_rows_carry_nothing_over() {
        let mut batch = Batch::default();
        let first = Texts {
            name: "aten::addmm",
            attrs_json: Some(r#"{"size":1024,"owner":"PTA@weight"}"#),
            python_stack: "t.py(3): f\nt.py(9): <module>",
        };
        assert!(batch.pack(1, numbers(Event::Malloc, 0x10), &first, &[0xa, 0xb]));
        batch.entries.push(Entry::Row(Box::new(Queued {
            seq: 2,
            row: EventRow::new(Event::System, EventType::Step, "1"),
            c_frames: Vec::new(),
        })));
        let mut out = Vec::new();
        let mut spare = Vec::new();
        batch.unpack_into(&mut out, &mut spare);
        assert!(batch.entries.is_empty() && batch.text.is_empty() && batch.frames.is_empty());
        let [a, b] = &out[..] else {
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
        spare.reverse();
        let second = Texts {
            name: "aten::mm",
            attrs_json: Some(r#"{"size":2048,"owner":"PTA@weight"}"#),
            python_stack: "",
        };
        let third = Texts {
            name: "N/A",
            attrs_json: None,
            python_stack: "",
        };
        assert!(batch.pack(3, numbers(Event::Free, 0x20), &second, &[]));
        assert!(batch.pack(4, numbers(Event::Free, 0x30), &third, &[]));
        batch.unpack_into(&mut out, &mut spare);
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
    }
}
