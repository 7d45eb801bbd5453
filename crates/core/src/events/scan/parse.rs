//! A worker's part of the fast CSV reader: one chunk of whole records into rows, with the
//! same splitting, field parsing and checks as the row-by-row reader (its own functions), but
//! into rows whose memory is reused from chunk to chunk. A record that fails any check is not
//! reported here: parsing stops there and the row-by-row reader takes over from that record,
//! so an error reads exactly as it always has.

use crate::events::reader::{parse_fields_into, IdOrder};
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
    /// The chunk's `,` `"` `\n` offsets.
    delims: Vec<u32>,
    /// A quoted record's fields, unquoted.
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
    let mut delims = std::mem::take(&mut scratch.delims);
    super::delims::find(data, &mut delims);
    let mut next = 0usize;
    let mut start = 0usize;
    while start < data.len() {
        // The record's end: the first line end with its quotes closed (the row-by-row
        // reader's rule), or the chunk's end (the splitter cut after a whole record).
        let first = next;
        let mut end = data.len();
        let mut quotes = 0usize;
        let mut lines = 1u64;
        while let Some(&at) = delims.get(next) {
            next += 1;
            match data[at as usize] {
                b'"' => quotes += 1,
                b'\n' if quotes.is_multiple_of(2) => {
                    end = at as usize + 1;
                    break;
                }
                b'\n' => lines += 1,
                _ => {}
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
        let record = Record {
            start,
            delims: &delims[first..next],
            quoted: quotes > 0,
        };
        if !raw.is_some_and(|raw| parse_record(raw, &record, out, scratch, &mut order)) {
            out.stopped_at = Some(start);
            break;
        }
        out.lines += lines;
        out.records += 1;
        start = end;
    }
    scratch.delims = delims;
}

/// One record's place in its chunk.
struct Record<'a> {
    start: usize,
    /// The chunk offsets of the record's delimiters (possibly its line end too).
    delims: &'a [u32],
    quoted: bool,
}

fn parse_record(
    raw: &str,
    record: &Record,
    out: &mut Parsed,
    scratch: &mut Scratch,
    order: &mut IdOrder,
) -> bool {
    let Scratch {
        text,
        fields,
        spare,
        ..
    } = scratch;
    let Ok(12) = split(raw, record, text, fields) else {
        return false;
    };
    if out.rows.len() == out.len {
        out.rows.push(EventRow::new(
            crate::events::Event::Malloc,
            crate::events::EventType::Pta,
            "",
        ));
    }
    let row = &mut out.rows[out.len];
    // An unquoted record's fields are slices of it; a quoted one's, of its unquoted text.
    let source: &str = if record.quoted { text } else { raw };
    let values = fields.iter().map(|r| &source[r.clone()]);
    if parse_fields_into(row, values, spare).is_err() || order.check(row.id).is_err() {
        return false;
    }
    out.len += 1;
    true
}

/// Splits `raw` into fields as the row-by-row reader's `split_record` does, from the
/// delimiters already found: an unquoted record's field ranges are into `raw`, a quoted
/// record's into `text`, where its fields are unquoted (`""` undoubled, what follows a closing
/// quote up to the comma kept). Returns how many fields there are; an error for a quoted field
/// not closed.
fn split(
    raw: &str,
    record: &Record,
    text: &mut String,
    fields: &mut Vec<std::ops::Range<usize>>,
) -> Result<usize, ()> {
    fields.clear();
    text.clear();
    let b = raw.as_bytes();
    let n = b.len();
    // The delimiters inside the trimmed record (its line end is not).
    let inside = record
        .delims
        .iter()
        .take_while(|&&d| (d as usize - record.start) < n)
        .count();
    let positions = &record.delims[..inside];
    if !record.quoted {
        // Only commas: without quotes the record has no line end inside.
        let mut from = 0;
        for &comma in positions {
            let comma = comma as usize - record.start;
            if fields.len() < 11 {
                fields.push(from..comma);
            }
            from = comma + 1;
        }
        fields.push(from..n);
        return Ok(positions.len() + 1);
    }
    let pos = |j: usize| positions[j] as usize - record.start;
    let m = positions.len();
    let next_of = |mut j: usize, byte: u8| {
        while j < m && b[pos(j)] != byte {
            j += 1;
        }
        j
    };
    let mut nfields = 0;
    let mut i = 0;
    let mut j = 0;
    loop {
        let field_start = text.len();
        while j < m && pos(j) < i {
            j += 1;
        }
        if i < n && b[i] == b'"' {
            i += 1;
            j += 1;
            loop {
                j = next_of(j, b'"');
                if j == m {
                    return Err(());
                }
                let q = pos(j);
                text.push_str(&raw[i..q]);
                if q + 1 < n && b[q + 1] == b'"' {
                    text.push('"');
                    i = q + 2;
                    j += 2;
                } else {
                    i = q + 1;
                    j += 1;
                    break;
                }
            }
        }
        j = next_of(j, b',');
        let comma = if j < m { pos(j) } else { n };
        text.push_str(&raw[i..comma]);
        i = comma;
        nfields += 1;
        if fields.len() < 12 {
            fields.push(field_start..text.len());
        }
        if i >= n {
            break;
        }
        i += 1;
        j += 1;
    }
    Ok(nfields)
}

#[cfg(test)]
mod tests {
    use super::{split, Record};
    use crate::events::reader::split_record;
    use proptest::prelude::*;

    /// The fields `split` gives, or `None` for an error.
    fn fast(raw: &str) -> Option<(usize, Vec<String>)> {
        let mut delims = Vec::new();
        super::super::delims::find(raw.as_bytes(), &mut delims);
        let record = Record {
            start: 0,
            delims: &delims,
            quoted: raw.contains('"'),
        };
        let (mut text, mut fields) = (String::new(), Vec::new());
        let n = split(raw, &record, &mut text, &mut fields).ok()?;
        let source = if record.quoted { &text } else { raw };
        Some((
            n,
            fields
                .iter()
                .map(|r| source[r.clone()].to_string())
                .collect(),
        ))
    }

    fn reference(raw: &str) -> Option<(usize, Vec<String>)> {
        let (mut text, mut fields) = (String::new(), Vec::new());
        let n = split_record(raw, raw.contains('"'), &mut text, &mut fields).ok()?;
        Some((
            n,
            fields.iter().map(|r| text[r.clone()].to_string()).collect(),
        ))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]
        #[test]
        fn splits_as_the_row_by_row_reader_does(generated in "[a\",\n\ré]{0,40}") {
            // A record holds a line end only after an odd number of quotes: at an even one
            // the record would have ended. Such line ends become plain letters.
            let mut quotes = 0;
            let raw: String = generated
                .chars()
                .map(|c| {
                    quotes += usize::from(c == '"');
                    if c == '\n' && quotes % 2 == 0 { 'a' } else { c }
                })
                .collect();
            let (fast, reference) = (fast(&raw), reference(&raw));
            // The row-by-row reader keeps ranges only for a 12-field unquoted record.
            match (&fast, &reference) {
                (Some((n, f)), Some((m, r))) if *n == 12 || raw.contains('"') => {
                    prop_assert_eq!(n, m);
                    prop_assert_eq!(f, r);
                }
                (Some((n, _)), Some((m, _))) => prop_assert_eq!(n, m),
                _ => prop_assert_eq!(fast.is_none(), reference.is_none(), "{:?}", raw),
            }
        }
    }

    #[test]
    fn dump_rows_split_into_their_fields() {
        let row = "2,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{\"\"size\"\":64}\",\"a.py(1): f\nb\",";
        let (n, fields) = fast(row).unwrap();
        assert_eq!(n, 12);
        assert_eq!(fields[9], "{\"size\":64}");
        assert_eq!(fields[10], "a.py(1): f\nb");
        assert_eq!(Some((n, fields)), reference(row));
    }
}
