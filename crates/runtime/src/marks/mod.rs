//! Marks and ranges: the MSTX C API (`mstx.rs`) and the NVTX injection (`nvtx.rs`) both end
//! here and become `MSTX` rows of the event stream (docs/output-files.md#event-types).
//!
//! Rows written (Event `MSTX`):
//!
//! | Event Type    | Name                      | Attr                                        |
//! |---------------|---------------------------|---------------------------------------------|
//! | `Mark`        | the message               | `stream` (when given), `domain` (NVTX)      |
//! | `Range_start` | the message               | `range_id`, `stream` (when given), `domain` |
//! | `Range_end`   | the message of its start  | `range_id`, `domain`                        |
//!
//! `stream` is the stream pointer as `0x%016x`; `domain` is the NVTX domain's name, present only
//! for calls on a named domain. A message that is absent (NVTX attributes without one) gives an
//! empty Name, which the CSV writes as `N/A`.
//!
//! Range ids are process-unique, start at 1 and are never 0; MSTX ranges, NVTX start/end ranges
//! and NVTX push/pop ranges draw from the same counter, so `range_id` pairs a `Range_end` with
//! its `Range_start` whatever the source. An end whose id was never handed out, or was already
//! ended, is ignored: no row, no log line (the program's own bug, and logging per call could
//! flood the log). Every range start, whatever its source, is reported to the pipeline after its
//! row (`pipeline::on_range_start`), which treats the message `step start` as a step boundary.
//!
//! Every entry point is wrapped by [`guarded`]: the reentrancy guard is held while recording
//! (allocations made on the way are the runtime's, not the program's), and a panic is caught
//! before it can cross the C boundary.
//!
//! Layer 9, an adapter (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls pipeline, sanitizer and the bottom layers, and lifecycle; nothing below calls it.

pub mod mstx;
pub mod nvtx;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use msmemscope_core::events::row::format_ptr;
use msmemscope_core::events::{Event, EventRow, EventType};

use crate::guard::Entered;

/// The process's ranges: the ids handed out and the start/end ranges not ended yet. Push/pop
/// ranges draw their ids here but live in the per-thread stacks of `nvtx.rs`. One static,
/// since its callers are the program's C calls (MSTX, NVTX) and Python's, from any thread.
struct Ranges {
    /// The next range id; 0 is never handed out. Outside the map's lock: a push/pop range
    /// takes an id without it.
    next_id: AtomicU64,
    /// Start/end ranges not ended yet: id -> (message, domain).
    open: Mutex<Option<HashMap<u64, OpenRange>>>,
}

static RANGES: Ranges = Ranges {
    next_id: AtomicU64::new(1),
    open: Mutex::new(None),
};

struct OpenRange {
    message: String,
    domain: Option<&'static str>,
}

/// Locks `m`, also after a panic elsewhere poisoned it (the data stays consistent: every
/// critical section here is a single map operation).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` inside the runtime: with the reentrancy guard held and panics caught. Returns
/// `fallback` when the thread is already inside the runtime (or exiting) or `f` panicked.
pub(crate) fn guarded<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    // A forked child records nothing, and must not touch locks another thread of the parent
    // may have held at the fork.
    if crate::process::is_forked_child() {
        return fallback;
    }
    let Some(_entered) = Entered::try_enter() else {
        return fallback;
    };
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

pub(crate) fn next_range_id() -> u64 {
    RANGES.next_id.fetch_add(1, Ordering::Relaxed)
}

fn row(
    event_type: EventType,
    message: &str,
    range_id: Option<u64>,
    stream: Option<u64>,
    domain: Option<&str>,
) -> EventRow {
    let mut row = EventRow::new(Event::Mstx, event_type, message);
    if let Some(id) = range_id {
        row.attrs.insert("range_id".into(), id.into());
    }
    if let Some(stream) = stream {
        row.attrs.insert("stream".into(), format_ptr(stream).into());
    }
    if let Some(domain) = domain {
        row.attrs.insert("domain".into(), domain.into());
    }
    row
}

/// A `Mark` row.
pub fn mark(message: &str, stream: Option<u64>, domain: Option<&str>) {
    // --- sanitizer: `sanitizer-op:` marks also feed the stream-race checker (the row stays).
    #[cfg(not(test))]
    if msmemscope_core::sanitizer::message::is_sanitizer_mark(message) {
        crate::sanitizer::on_mark(message, stream);
        if crate::sanitizer::is_active() {
            // The checker's report is written at exit.
            crate::lifecycle::ensure_exit_handler();
        }
    }
    // --- end sanitizer
    sink::emit(row(EventType::Mark, message, None, stream, domain));
}

/// Starts a range that [`range_end`] ends (from any thread); returns its id (never 0).
pub fn range_start(message: &str, stream: Option<u64>, domain: Option<&'static str>) -> u64 {
    let id = next_range_id();
    lock(&RANGES.open).get_or_insert_with(HashMap::new).insert(
        id,
        OpenRange {
            message: message.to_owned(),
            domain,
        },
    );
    emit_range_start(id, message, stream, domain);
    id
}

/// Ends a range started by [`range_start`]; `false` (and no row) when `id` is not open.
pub fn range_end(id: u64) -> bool {
    let open = lock(&RANGES.open).as_mut().and_then(|m| m.remove(&id));
    match open {
        Some(open) => {
            emit_range_end(id, &open.message, open.domain);
            true
        }
        None => false,
    }
}

/// The `Range_start` row of range `id`, then the step-boundary check.
pub(crate) fn emit_range_start(id: u64, message: &str, stream: Option<u64>, domain: Option<&str>) {
    sink::emit(row(
        EventType::RangeStart,
        message,
        Some(id),
        stream,
        domain,
    ));
    sink::on_range_start(message);
}

/// The `Range_end` row of range `id`; `message` is its start's.
pub(crate) fn emit_range_end(id: u64, message: &str, domain: Option<&str>) {
    sink::emit(row(EventType::RangeEnd, message, Some(id), None, domain));
}

/// Where rows go: the event pipeline; in unit tests, a per-thread list the tests read.
#[cfg(not(test))]
mod sink {
    use msmemscope_core::events::EventRow;

    pub fn emit(row: EventRow) {
        // Marks are called from the program's code: its C stack is worth capturing when the
        // run asks for C stacks.
        crate::pipeline::emit(row, true);
    }

    pub fn on_range_start(message: &str) {
        crate::pipeline::on_range_start(message);
    }
}

#[cfg(test)]
pub(crate) mod sink {
    use std::cell::RefCell;

    use msmemscope_core::events::EventRow;

    /// What this thread emitted since the last look: its rows, and the messages passed to
    /// `on_range_start`.
    #[derive(Default)]
    struct Emitted {
        rows: Vec<EventRow>,
        range_starts: Vec<String>,
    }

    thread_local! {
        static EMITTED: RefCell<Emitted> = RefCell::default();
    }

    pub fn emit(row: EventRow) {
        EMITTED.with(|e| e.borrow_mut().rows.push(row));
    }

    pub fn on_range_start(message: &str) {
        EMITTED.with(|e| e.borrow_mut().range_starts.push(message.to_owned()));
    }

    /// The rows this thread emitted since the last call.
    pub fn take() -> Vec<EventRow> {
        EMITTED.with(|e| std::mem::take(&mut e.borrow_mut().rows))
    }

    /// The messages passed to `on_range_start` on this thread since the last call.
    pub fn take_range_starts() -> Vec<String> {
        EMITTED.with(|e| std::mem::take(&mut e.borrow_mut().range_starts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_pair_by_id_and_unknown_ends_are_ignored() {
        sink::take();
        let a = range_start("outer", Some(0x1000), None);
        let b = range_start("inner", None, Some("dom"));
        assert!(a != 0 && b != 0 && a != b);
        assert!(range_end(b));
        assert!(!range_end(b), "a second end of the same range is ignored");
        assert!(!range_end(0));
        assert!(range_end(a));
        let rows = sink::take();
        let seen: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.event_type,
                    r.name.as_str(),
                    r.attr_u64("range_id"),
                    r.attr_str("stream"),
                    r.attr_str("domain"),
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (
                    EventType::RangeStart,
                    "outer",
                    Some(a),
                    Some("0x0000000000001000"),
                    None
                ),
                (EventType::RangeStart, "inner", Some(b), None, Some("dom")),
                (EventType::RangeEnd, "inner", Some(b), None, Some("dom")),
                (EventType::RangeEnd, "outer", Some(a), None, None),
            ]
        );
        assert!(rows.iter().all(|r| r.event == Event::Mstx));
        assert_eq!(sink::take_range_starts(), vec!["outer", "inner"]);
    }

    #[test]
    fn mark_row() {
        sink::take();
        mark("epoch begin", None, None);
        let rows = sink::take();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].event_type, EventType::Mark);
        assert_eq!(rows[0].name, "epoch begin");
        assert!(rows[0].attrs.is_empty());
        assert!(sink::take_range_starts().is_empty());
    }

    #[test]
    fn guarded_catches_panics_and_nesting() {
        assert_eq!(guarded(7, || panic!("inside")), 7);
        assert_eq!(guarded(1, || guarded(2, || 3)), 2);
        assert_eq!(guarded(1, || 5), 5);
    }
}
