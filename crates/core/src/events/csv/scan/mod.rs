//! The fast CSV reader: chunks of whole records ([`split`]) parsed on worker threads
//! ([`parse`]) and handed out in file order, one borrowed row at a time, from rows whose
//! memory is reused. What it hands out, and every error, is what [`CsvRows`] gives for the
//! same file: records end and split where that reader's rules say (a property test holds the
//! two splitters together), fields parse with its own functions, and at the first record it
//! cannot take (a malformed row, an ID out of order, a record longer than a dump row may be,
//! a read error) it hands the rest of the file to a `CsvRows` resumed at that record.
//!
//! Memory stays bounded: a fixed set of chunk buffers (two per worker) circulates between the
//! workers and the consumer, so a worker waits for the consumer rather than reading ahead; a
//! chunk is one block, or more to hold a record longer than that.

mod parse;
mod split;
mod structure;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::read::{CsvRows, Position};
pub use crate::events::source::Progress;
use crate::events::source::{open_regular, IdOrder, ReadError, RowSource};
use crate::events::EventRow;
use parse::{parse_chunk, Parsed, Scratch};
use split::{Chunk, Splitter};

/// Bytes per chunk: large enough that a chunk's fixed costs (a hand-off between threads)
/// vanish, small enough that a chunk and its delimiter offsets stay in a core's L2 cache
/// between the passes over them (at 2 MiB the same parse took half again as long).
pub const DEFAULT_BLOCK: usize = 128 << 10;

/// How the reader runs: chunk size and worker threads.
#[derive(Clone, Copy, Debug)]
pub struct ScanOptions {
    pub block: usize,
    pub workers: usize,
}

impl Default for ScanOptions {
    fn default() -> ScanOptions {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ScanOptions {
            block: DEFAULT_BLOCK,
            workers: cores.clamp(1, 4),
        }
    }
}

/// A chunk with its rows: what circulates.
struct Batch {
    chunk: Chunk,
    parsed: Parsed,
}

/// What the consumer and the workers share.
struct Shared {
    splitter: Mutex<Splitter>,
    stop: AtomicBool,
    /// Bytes of the file the consumer has handed out rows from (its header included).
    done_bytes: Arc<AtomicU64>,
}

pub struct FastCsv {
    path: PathBuf,
    shared: Arc<Shared>,
    total: u64,
    done: Receiver<Batch>,
    free: Option<Sender<Batch>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Batches come back in any order; they are handed out by `seq`.
    waiting: BTreeMap<u64, Batch>,
    next_seq: u64,
    current: Option<Batch>,
    index: usize,
    /// Where the current batch starts: its offset, and the lines and records before it.
    before: Position,
    last_id: Option<u64>,
    /// The row-by-row reader, once it has taken over, and its last row.
    rest: Option<CsvRows>,
    rest_row: Option<EventRow>,
    /// Whether the last `next_row` returned a row (which `current` then gives again).
    at_row: bool,
    ended: bool,
}

impl FastCsv {
    pub fn open(path: &Path) -> Result<FastCsv, ReadError> {
        FastCsv::open_with(path, ScanOptions::default())
    }

    pub fn open_with(path: &Path, options: ScanOptions) -> Result<FastCsv, ReadError> {
        // The header is checked by the row-by-row reader, which knows where the first row
        // starts.
        let header = CsvRows::open(path)?;
        let start = header.position();
        drop(header);
        let file = open_regular(path)?;
        let total = file.metadata().map_or(0, |m| m.len());
        {
            use std::io::Seek;
            let mut file = &file;
            file.seek(std::io::SeekFrom::Start(start.offset))
                .map_err(|e| ReadError::Io {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
        }
        let shared = Arc::new(Shared {
            splitter: Mutex::new(Splitter::new(file, start.offset, options.block)),
            stop: AtomicBool::new(false),
            done_bytes: Arc::new(AtomicU64::new(start.offset)),
        });
        let (free_tx, free_rx) = channel::<Batch>();
        let (done_tx, done_rx) = channel::<Batch>();
        let workers = options.workers.max(1);
        for _ in 0..workers * 2 {
            let _ = free_tx.send(Batch {
                chunk: Chunk {
                    seq: 0,
                    offset: start.offset,
                    data: Vec::new(),
                    hand_over: false,
                },
                parsed: Parsed::default(),
            });
        }
        let free_rx = Arc::new(Mutex::new(free_rx));
        let mut handles = Vec::with_capacity(workers);
        for n in 0..workers {
            let shared = Arc::clone(&shared);
            let free_rx = Arc::clone(&free_rx);
            let done_tx = done_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("msmemscope-scan-{n}"))
                .spawn(move || work(&shared, &free_rx, &done_tx));
            match spawned {
                Ok(handle) => handles.push(handle),
                // Fewer workers is slower, not wrong; none at all is an error.
                Err(e) if handles.is_empty() => {
                    return Err(ReadError::Io {
                        path: path.to_path_buf(),
                        message: format!("cannot start a reader thread: {e}"),
                    })
                }
                Err(_) => break,
            }
        }
        Ok(FastCsv {
            path: path.to_path_buf(),
            shared,
            total,
            done: done_rx,
            free: Some(free_tx),
            workers: handles,
            waiting: BTreeMap::new(),
            next_seq: 0,
            current: None,
            index: 0,
            before: start,
            last_id: None,
            rest: None,
            rest_row: None,
            at_row: false,
            ended: false,
        })
    }

    pub fn progress(&self) -> Progress {
        Progress::new(Arc::clone(&self.shared.done_bytes), self.total)
    }

    /// The next batch in file order, or `None` when the workers have sent their last.
    fn next_batch(&mut self) -> Option<Batch> {
        loop {
            if let Some(batch) = self.waiting.remove(&self.next_seq) {
                self.next_seq += 1;
                return Some(batch);
            }
            let Ok(batch) = self.done.recv() else {
                return None;
            };
            self.waiting.insert(batch.chunk.seq, batch);
        }
    }

    /// Hands the rest of the file, from `at`, to a row-by-row reader.
    fn hand_over(&mut self, at: Position) -> Result<(), ReadError> {
        self.stop_workers();
        let file = open_regular(&self.path)?;
        let mut order = IdOrder::default();
        if let Some(id) = self.last_id {
            let _ = order.check(id);
        }
        self.rest = Some(CsvRows::resume(&self.path, file, at, order)?);
        Ok(())
    }

    fn stop_workers(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.free = None;
        self.current = None;
        self.waiting.clear();
        // Workers waiting to send or for a buffer wake up to closed channels and end.
        while self.done.try_recv().is_ok() {}
        for handle in self.workers.drain(..) {
            while !handle.is_finished() {
                while self.done.try_recv().is_ok() {}
                std::thread::yield_now();
            }
            let _ = handle.join();
        }
    }
}

fn work(shared: &Shared, free: &Mutex<Receiver<Batch>>, done: &Sender<Batch>) {
    let mut scratch = Scratch::default();
    loop {
        let batch = match free.lock() {
            Ok(free) => free.recv(),
            Err(_) => return,
        };
        let Ok(mut batch) = batch else { return };
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let more = match shared.splitter.lock() {
            Ok(mut splitter) => splitter.next(&mut batch.chunk),
            Err(_) => return,
        };
        if !more {
            return;
        }
        let Batch { chunk, parsed } = &mut batch;
        let parsed_ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            parse_chunk(&chunk.data, parsed, &mut scratch)
        }));
        if parsed_ok.is_err() {
            // The row-by-row reader reads the chunk instead.
            scratch = Scratch::default();
            parsed.len = 0;
            parsed.lines = 0;
            parsed.records = 0;
            parsed.stopped_at = Some(0);
        }
        if done.send(batch).is_err() {
            return;
        }
    }
}

impl RowSource for FastCsv {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        self.at_row = false;
        let found = self.advance()?;
        self.at_row = found;
        Ok(if found { self.current() } else { None })
    }

    fn current(&self) -> Option<&EventRow> {
        if !self.at_row {
            return None;
        }
        if self.rest.is_some() {
            return self.rest_row.as_ref();
        }
        let batch = self.current.as_ref()?;
        batch.parsed.rows[..batch.parsed.len].get(self.index.checked_sub(1)?)
    }

    fn progress(&self) -> Option<Progress> {
        Some(FastCsv::progress(self))
    }
}

impl FastCsv {
    /// Moves to the next row; whether there is one.
    fn advance(&mut self) -> Result<bool, ReadError> {
        loop {
            if let Some(rest) = &mut self.rest {
                self.rest_row = None;
                return match rest.next() {
                    Some(Ok(row)) => {
                        self.rest_row = Some(row);
                        Ok(true)
                    }
                    Some(Err(e)) => Err(e),
                    None => Ok(false),
                };
            }
            if self.ended {
                return Ok(false);
            }
            if let Some(batch) = &self.current {
                if self.index < batch.parsed.len {
                    let id = batch.parsed.rows[self.index].id;
                    if self.index == 0 && self.last_id.is_some_and(|last| id <= last) {
                        // Out of order across chunks: the other reader words it.
                        self.hand_over(self.before)?;
                        continue;
                    }
                    self.last_id = Some(id);
                    self.index += 1;
                    return Ok(true);
                }
                let parsed = &batch.parsed;
                let rows_end = parsed.stopped_at.unwrap_or(batch.chunk.data.len());
                let after = Position {
                    offset: batch.chunk.offset + rows_end as u64,
                    line: self.before.line + parsed.lines,
                    records: self.before.records + parsed.records,
                };
                self.shared
                    .done_bytes
                    .store(after.offset, Ordering::Relaxed);
                if parsed.stopped_at.is_some() || batch.chunk.hand_over {
                    self.hand_over(after)?;
                    continue;
                }
                self.before = after;
                let batch = self.current.take().expect("checked above");
                if let Some(free) = &self.free {
                    let _ = free.send(batch);
                }
            }
            match self.next_batch() {
                Some(batch) => {
                    self.current = Some(batch);
                    self.index = 0;
                }
                None => {
                    // Every worker has ended: the file's end, unless a worker died with its
                    // chunk (rows missing in the middle must never read as a shorter file).
                    let finished = self
                        .shared
                        .splitter
                        .lock()
                        .is_ok_and(|splitter| splitter.ended());
                    if !finished || !self.waiting.is_empty() {
                        self.ended = true;
                        return Err(ReadError::Io {
                            path: self.path.clone(),
                            message: "a reader thread failed".into(),
                        });
                    }
                    self.shared.done_bytes.store(self.total, Ordering::Relaxed);
                    self.ended = true;
                }
            }
        }
    }
}

impl Drop for FastCsv {
    fn drop(&mut self) {
        self.stop_workers();
    }
}
