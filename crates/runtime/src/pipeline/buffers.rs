//! Per-thread event buffers. A producer appends to its own thread's buffer (a lock nobody else
//! takes except the writer, briefly, to swap the buffer out); the writer drains every buffer.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::events::EventRow;

/// A row and its global sequence number (ties between equal timestamps keep emit order).
pub struct Queued {
    pub seq: u64,
    pub row: EventRow,
    /// Raw C frames to symbolize in the writer, when the C stack was asked for.
    pub c_frames: Vec<u64>,
}

#[derive(Default)]
pub struct ThreadBuffer {
    rows: Mutex<Vec<Queued>>,
    /// The writer's half of a double buffer: an empty vector with the capacity of an earlier
    /// batch, swapped in for `rows` at each drain. The producer so keeps writing into memory
    /// already paged in, and the writer copies the batch out after letting go of `rows`, never
    /// while the producer waits.
    spare: Mutex<Vec<Queued>>,
}

static REGISTRY: Mutex<Vec<Arc<ThreadBuffer>>> = Mutex::new(Vec::new());
static SEQ: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static MINE: RefCell<Option<Arc<ThreadBuffer>>> = const { RefCell::new(None) };
}

/// Rows from threads whose thread-local buffer is already gone (emitted during thread exit).
static ORPHANS: Mutex<Vec<Queued>> = Mutex::new(Vec::new());

/// Appends a row to this thread's buffer.
pub fn push(row: EventRow, c_frames: Vec<u64>) {
    let mut queued = Some(Queued {
        seq: SEQ.fetch_add(1, Ordering::Relaxed),
        row,
        c_frames,
    });
    let _ = MINE.try_with(|mine| {
        let mut mine = mine.borrow_mut();
        let buffer = mine.get_or_insert_with(|| {
            let buffer = Arc::new(ThreadBuffer::default());
            if let Ok(mut registry) = REGISTRY.lock() {
                registry.push(buffer.clone());
            }
            buffer
        });
        let pushed = match buffer.rows.lock() {
            Ok(mut rows) => {
                rows.extend(queued.take());
                true
            }
            Err(_) => false,
        };
        pushed
    });
    if let Some(q) = queued {
        if let Ok(mut orphans) = ORPHANS.lock() {
            orphans.push(q);
        }
    }
}

/// Moves every row queued so far, from every thread, to the end of `out`.
pub fn drain_into(out: &mut Vec<Queued>) {
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
        out.append(&mut batch);
    }
    drop(buffers);
    // Buffers only the registry still holds belong to exited threads and are now empty.
    if let Ok(mut registry) = REGISTRY.lock() {
        registry.retain(|b| Arc::strong_count(b) > 1 || b.rows.lock().is_ok_and(|r| !r.is_empty()));
    }
}
