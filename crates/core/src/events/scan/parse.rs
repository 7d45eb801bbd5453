//! A worker's part of the fast CSV reader: one chunk of whole records into rows, with the
//! same splitting, field parsing and checks as the row-by-row reader (its own functions), but
//! into rows whose memory is reused from chunk to chunk. A record that fails any check is not
//! reported here: parsing stops there and the row-by-row reader takes over from that record,
//! so an error reads exactly as it always has.

use crate::events::reader::{parse_fields_into, split_record, IdOrder};
use crate::events::EventRow;

/// The rows of one chunk.
#[derive(Default)]
pub(super) struct Parsed {
    pub(super) rows: Vec<EventRow>,
    /// How many of `rows` hold this chunk's rows (the rest are spare, kept for their memory).
    pub(super) len: usize,
    /// The lines and records of the chunk, or, when parsing stopped before its end, before
    /// the first record not parsed.
    pub(super) lines: u64,
    pub(super) records: u64,
    /// The byte offset in the chunk of the first record not parsed, when parsing stopped
    /// before the chunk's end.
    pub(super) stopped_at: Option<usize>,
}

/// Scratch space a worker keeps across chunks.
#[derive(Default)]
pub(super) struct Scratch {
    text: String,
    fields: Vec<std::ops::Range<usize>>,
    /// Attr strings of rows that had none this time, kept for the next row that has one.
    spare: Vec<String>,
}

/// Parses the records of `data` (whole records from a record start) into `out`.
pub(super) fn parse_chunk(data: &[u8], out: &mut Parsed, scratch: &mut Scratch) {
    out.len = 0;
    out.lines = 0;
    out.records = 0;
    out.stopped_at = None;
    let mut order = IdOrder::default();
    // Checked once for the chunk; each record is then a slice of it at ASCII line ends
    // (char boundaries). A chunk that is not UTF-8 is checked record by record, to find the
    // record the other reader must report.
    let text = std::str::from_utf8(data).ok();
    let mut start = 0usize;
    while start < data.len() {
        // The record's end: the first line end with its quotes closed, or the chunk's end
        // (the splitter cut the chunk after a whole record).
        let mut end = start;
        let mut quotes = 0usize;
        let mut lines = 0u64;
        loop {
            let line_end = memchr::memchr(b'\n', &data[end..]).map_or(data.len(), |i| end + i + 1);
            quotes += memchr::memchr_iter(b'"', &data[end..line_end]).count();
            lines += 1;
            end = line_end;
            if quotes.is_multiple_of(2) || end == data.len() {
                break;
            }
        }
        let mut trimmed = end;
        while trimmed > start && matches!(data[trimmed - 1], b'\n' | b'\r') {
            trimmed -= 1;
        }
        let raw = match text {
            Some(text) => Some(&text[start..trimmed]),
            None => std::str::from_utf8(&data[start..trimmed]).ok(),
        };
        if !raw.is_some_and(|raw| parse_record(raw, quotes > 0, out, scratch, &mut order)) {
            out.stopped_at = Some(start);
            return;
        }
        out.lines += lines;
        out.records += 1;
        start = end;
    }
}

fn parse_record(
    raw: &str,
    quoted: bool,
    out: &mut Parsed,
    scratch: &mut Scratch,
    order: &mut IdOrder,
) -> bool {
    if split_record(raw, quoted, &mut scratch.text, &mut scratch.fields) != Ok(12) {
        return false;
    }
    if out.rows.len() == out.len {
        out.rows.push(EventRow::new(
            crate::events::Event::Malloc,
            crate::events::EventType::Pta,
            "",
        ));
    }
    let row = &mut out.rows[out.len];
    let text = &scratch.text;
    let fields = scratch.fields.iter().map(|r| &text[r.clone()]);
    if parse_fields_into(row, fields, &mut scratch.spare).is_err() || order.check(row.id).is_err() {
        return false;
    }
    out.len += 1;
    true
}
