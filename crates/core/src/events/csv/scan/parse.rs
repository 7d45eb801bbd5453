//! A worker's part of the fast CSV reader: one chunk of whole records into rows, with the
//! same splitting, field parsing and checks as the row-by-row reader (its own functions), but
//! into rows whose memory is reused from chunk to chunk. A record that fails any check is not
//! reported here: parsing stops there and the row-by-row reader takes over from that record,
//! so an error reads exactly as it always has.

use super::structure;
use crate::events::csv::read::split_record;
use crate::events::fields::{adopt_attrs, parse_fields_into};
use crate::events::source::IdOrder;

/// The Attr column's index among the 12.
const ATTR_FIELD: usize = 9;
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
    /// The chunk's field and record ends ([`structure::find`]).
    entries: Vec<u32>,
    /// The chunk's quote bits ([`structure::find`]).
    quotes: Vec<u64>,
    fields: Fields,
    /// Attr strings of rows that had none this time, kept for the next row that has one.
    spare: Vec<String>,
}

/// A record split into its fields.
#[derive(Default)]
struct Fields {
    /// Each field's range: in the record, or (its bit set in `in_text`) in `text`.
    ranges: Vec<std::ops::Range<usize>>,
    in_text: u16,
    /// The quoted fields, unquoted; but the Attr field's, which is unquoted into `attr` (its
    /// range then empty, `attr_apart` set), so that its text can move into the row rather
    /// than be copied there.
    text: String,
    attr: String,
    attr_apart: bool,
    /// Whether the chunk is all ASCII (and so `text` too, made of its pieces): then every byte
    /// range of either is UTF-8, and fields are cut without looking for char boundaries.
    ascii: bool,
}

impl Fields {
    fn clear(&mut self) {
        self.ranges.clear();
        self.in_text = 0;
        self.text.clear();
        self.attr_apart = false;
    }

    /// Field `i` of the record `raw`.
    #[inline]
    fn value<'a>(&'a self, raw: &'a str, i: usize) -> &'a str {
        let source = if self.in_text >> i & 1 != 0 {
            self.text.as_str()
        } else {
            raw
        };
        let Some(range) = self.ranges.get(i) else {
            return "";
        };
        if self.ascii {
            match source.as_bytes().get(range.clone()) {
                // SAFETY: `source` is ASCII (`ascii` says so), and so is every part of it.
                Some(bytes) => unsafe { std::str::from_utf8_unchecked(bytes) },
                None => "",
            }
        } else {
            source.get(range.clone()).unwrap_or("")
        }
    }
}

/// Parses the records of `data` (whole records from a record start) into `out`.
pub(super) fn parse_chunk(data: &[u8], out: &mut Parsed, scratch: &mut Scratch) {
    out.len = 0;
    out.lines = 0;
    out.records = 0;
    out.stopped_at = None;
    if data.len() > structure::MAX_CHUNK {
        out.stopped_at = Some(0);
        return;
    }
    let mut order = IdOrder::default();
    let mut entries = std::mem::take(&mut scratch.entries);
    let mut quotes = std::mem::take(&mut scratch.quotes);
    let found = structure::find(data, &mut entries, &mut quotes);
    // Checked once for the chunk; each record is then a slice of it at ASCII line ends
    // (char boundaries). A chunk that is not UTF-8 is checked record by record, to find the
    // record the other reader must report.
    let text = if found.ascii {
        // SAFETY: every byte is below 0x80, and ASCII text is UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(data) })
    } else {
        std::str::from_utf8(data).ok()
    };
    scratch.fields.ascii = found.ascii;
    let mut next = 0usize;
    let mut start = 0usize;
    while start < data.len() {
        let (record, lines, line_end) = next_record(&entries, &mut next, start, data.len());
        let mut record = record;
        // A last record still inside quotes at the file's end is the other reader's to word.
        record.irregular |= line_end == data.len() && found.open_at_end;
        let mut trimmed = line_end;
        while trimmed > start && matches!(data[trimmed - 1], b'\n' | b'\r') {
            trimmed -= 1;
        }
        let raw = match text {
            Some(text) if found.ascii && start <= trimmed && trimmed <= text.len() => {
                // SAFETY: the range is within the chunk, and an ASCII chunk has a char
                // boundary at every byte.
                Some(unsafe { text.get_unchecked(start..trimmed) })
            }
            Some(text) => Some(&text[start..trimmed]),
            None => std::str::from_utf8(&data[start..trimmed]).ok(),
        };
        let parsed = raw
            .is_some_and(|raw| parse_record(raw, data, &record, &quotes, out, scratch, &mut order));
        if !parsed {
            out.stopped_at = Some(start);
            break;
        }
        out.lines += lines;
        out.records += 1;
        start = record.end;
    }
    scratch.entries = entries;
    scratch.quotes = quotes;
}

/// The record that starts at `start`, from the entries from `next` on (which it moves past
/// the record's): the record, its lines, and where its line end is (`n`, the chunk's end,
/// for a last record without one).
fn next_record(entries: &[u32], next: &mut usize, start: usize, n: usize) -> (Record, u64, usize) {
    let mut record = Record {
        start,
        end: n,
        commas: [0; 11],
        fields: 1,
        irregular: false,
    };
    // The usual record: eleven commas, then its line end.
    if let Some(usual) = entries.get(*next..*next + 12) {
        let kinds = usual[..11]
            .iter()
            .fold(0, |kinds, e| kinds | e & structure::KIND);
        if kinds == structure::COMMA && usual[11] & structure::KIND == structure::NEWLINE {
            for (comma, entry) in record.commas.iter_mut().zip(usual) {
                *comma = (entry & !structure::KIND) as usize;
            }
            record.fields = 12;
            let line_end = (usual[11] & !structure::KIND) as usize;
            record.end = line_end + 1;
            *next += 12;
            return (record, 1, line_end);
        }
    }
    let mut lines = 1u64;
    let mut line_end = n;
    while let Some(&entry) = entries.get(*next) {
        *next += 1;
        let at = (entry & !structure::KIND) as usize;
        match entry & structure::KIND {
            structure::COMMA => {
                if let Some(slot) = record.commas.get_mut(record.fields - 1) {
                    *slot = at;
                }
                record.fields += 1;
            }
            structure::NEWLINE => {
                line_end = at;
                record.end = at + 1;
                break;
            }
            structure::INNER_NEWLINE => lines += 1,
            kind => {
                debug_assert_eq!(kind, structure::IRREGULAR);
                record.irregular = true;
            }
        }
    }
    (record, lines, line_end)
}

/// One record's place in its chunk.
struct Record {
    start: usize,
    /// After its line end (or the chunk's end).
    end: usize,
    /// The chunk offsets of its first 11 field-ending commas, and how many fields it has.
    commas: [usize; 11],
    fields: usize,
    /// Whether a quote in it is not regular: then it is split by the row-by-row reader's
    /// function.
    irregular: bool,
}

fn parse_record(
    raw: &str,
    chunk: &[u8],
    record: &Record,
    quotes: &[u64],
    out: &mut Parsed,
    scratch: &mut Scratch,
    order: &mut IdOrder,
) -> bool {
    let Scratch { fields, spare, .. } = scratch;
    if !split(raw, chunk, record, quotes, fields) {
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
    let values: [&str; 12] = std::array::from_fn(|i| fields.value(raw, i));
    if parse_fields_into(row, values.into_iter(), spare).is_err()
        || (fields.attr_apart && adopt_attrs(row, &mut fields.attr, spare).is_err())
        || order.check(row.id).is_err()
    {
        return false;
    }
    out.len += 1;
    true
}

/// Splits the record `raw` (at `record.start` in `chunk`) into its 12 fields; false when it has
/// not 12 (or a quoted field is not closed), as `split_record` says.
fn split(raw: &str, chunk: &[u8], record: &Record, quotes: &[u64], fields: &mut Fields) -> bool {
    if !record.irregular && split_regular(raw, chunk, record, quotes, fields) {
        return true;
    }
    fields.clear();
    let Ok(12) = split_record(raw, true, &mut fields.text, &mut fields.ranges) else {
        return false;
    };
    fields.in_text = u16::MAX;
    true
}

/// Splits a record whose quotes are all regular at its field ends: a field in quotes is
/// unquoted (`""` undoubled), the others are ranges of `raw`. False when the record has not 12
/// fields (an error the row-by-row reader words) or a quoted field is not as the structure
/// promised, which leaves it to that reader too.
fn split_regular(
    raw: &str,
    chunk: &[u8],
    record: &Record,
    quotes: &[u64],
    fields: &mut Fields,
) -> bool {
    if record.fields != 12 {
        return false;
    }
    fields.clear();
    let b = raw.as_bytes();
    let mut from = 0;
    for i in 0..12 {
        let to = record.commas.get(i).map_or(b.len(), |&c| c - record.start);
        if b.get(from) == Some(&b'"') {
            let field = &raw[from..to];
            let Some(body) = field.strip_prefix('"').and_then(|f| f.strip_suffix('"')) else {
                return false;
            };
            let at = record.start + from + 1;
            let readable = chunk.get(at..).unwrap_or_default();
            if i == ATTR_FIELD {
                fields.attr.clear();
                if !unquote(body, readable, at, quotes, &mut fields.attr) {
                    return false;
                }
                fields.ranges.push(0..0);
                fields.attr_apart = true;
            } else {
                let begin = fields.text.len();
                if !unquote(body, readable, at, quotes, &mut fields.text) {
                    return false;
                }
                fields.ranges.push(begin..fields.text.len());
                fields.in_text |= 1 << i;
            }
        } else {
            fields.ranges.push(from..to);
        }
        from = to + 1;
    }
    true
}

/// Appends `body` (a quoted field's text between its quotes, at chunk offset `at`) to `text`
/// with each `""` made one `"`; false for a lone quote (and `text` as it was). The quotes are
/// found in the chunk's quote bits, not by searching the text again. `readable` is the chunk
/// from `at` on (`body` and what follows it), which copies may read past `body` in.
fn unquote(body: &str, readable: &[u8], at: usize, quotes: &[u64], text: &mut String) -> bool {
    let src = body.as_bytes();
    let end = at + src.len();
    let mut pieces = Pieces::new(src, readable, text);
    let mut from = 0;
    // Quotes come in doubled pairs, taken a pair at a time: a pair's first quote ends a piece,
    // its second must be the next byte. `second_at_start`: a pair's first quote was the last
    // byte of the word before.
    let mut second_at_start = false;
    let mut word = at / 64;
    while word * 64 < end {
        let mut bits = quotes.get(word).copied().unwrap_or(0);
        if word * 64 < at {
            bits &= !0u64 << (at % 64);
        }
        if end < word * 64 + 64 {
            bits &= !(!0u64 << (end % 64));
        }
        if std::mem::take(&mut second_at_start) {
            if bits & 1 == 0 {
                return false;
            }
            bits &= !1;
        }
        while bits != 0 {
            let bit = bits.trailing_zeros();
            let first = word * 64 + bit as usize - at;
            pieces.push(from, first + 1);
            from = first + 2;
            if bit == 63 {
                second_at_start = true;
                bits = 0;
            } else if bits >> (bit + 1) & 1 == 0 {
                return false;
            } else {
                bits &= !(3u64 << bit);
            }
        }
        word += 1;
    }
    if second_at_start || from > src.len() {
        return false;
    }
    pieces.push(from, src.len());
    pieces.finish();
    true
}

/// Pieces of one source string appended to a string: a dump's quoted Attr is some twenty short
/// pieces between doubled quotes, and copying each in 16-byte strides into room reserved once
/// costs a fraction of a `push_str` (a capacity check and a `memcpy` call) per piece.
struct Pieces<'a> {
    src: &'a [u8],
    /// `src` and the bytes after it that may be read (never copied) by a stride's overshoot.
    readable: &'a [u8],
    out: &'a mut String,
    /// The bytes written so far (from the string's start); the string's own length changes
    /// only in `finish`.
    len: usize,
}

impl<'a> Pieces<'a> {
    /// The room for all of `src` (and a stride's overshoot) is reserved here.
    fn new(src: &'a [u8], readable: &'a [u8], out: &'a mut String) -> Pieces<'a> {
        out.reserve(src.len() + 32);
        let len = out.len();
        // Reads past `src` only where `readable` is the same memory from the same start.
        let readable =
            if std::ptr::eq(readable.as_ptr(), src.as_ptr()) && readable.len() >= src.len() {
                readable
            } else {
                src
            };
        Pieces {
            src,
            readable,
            out,
            len,
        }
    }

    /// Appends `src[from..to]`, which the caller keeps in order, within `src`, and cut only
    /// next to ASCII bytes (a quote) or at `src`'s ends, so the pieces joined are UTF-8.
    fn push(&mut self, from: usize, to: usize) {
        let Some(piece) = self.src.get(from..to) else {
            return;
        };
        let n = piece.len();
        let room = self.out.capacity() - self.len;
        debug_assert!(room >= n + 32);
        let dst = self.out.as_mut_ptr();
        // At most two strides; a loop of them is turned back into a `memcpy` call.
        if n <= 32 && from + 32 <= self.readable.len() && 32 <= room {
            // SAFETY: source bytes `from .. from + 32` lie within `readable` (checked above),
            // which starts where `src` does, and destination bytes `len .. len + 32` within the
            // reserved capacity (`32 <= room`); bytes written past the piece are capacity, not
            // string, and are overwritten by the next piece or left out by `finish`.
            unsafe {
                let at = self.readable.as_ptr().add(from);
                let to = dst.add(self.len);
                let first = std::ptr::read_unaligned(at.cast::<[u8; 16]>());
                std::ptr::write_unaligned(to.cast::<[u8; 16]>(), first);
                if n > 16 {
                    let second = std::ptr::read_unaligned(at.add(16).cast::<[u8; 16]>());
                    std::ptr::write_unaligned(to.add(16).cast::<[u8; 16]>(), second);
                }
            }
        } else if n <= room {
            // SAFETY: `n` bytes from the piece to the string's spare capacity (`n <= room`);
            // the two cannot overlap, `src` being borrowed shared and `out` uniquely.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), dst.add(self.len), n) };
        } else {
            return;
        }
        self.len += n;
    }

    fn finish(self) {
        debug_assert!(self.len <= self.out.capacity());
        // SAFETY: bytes up to `len` were written by `push` (within the capacity), and they are
        // the string's own bytes followed by pieces of `src`, a `str`, each cut next to an
        // ASCII byte or at its ends: UTF-8, as a `String` must be.
        unsafe { self.out.as_mut_vec().set_len(self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::{next_record, split, structure, Fields};
    use crate::events::csv::read::split_record;
    use proptest::prelude::*;

    /// The fields `split` gives a one-record chunk, or `None` for an error.
    fn fast(raw: &str) -> Option<Vec<String>> {
        let (mut entries, mut quotes) = (Vec::new(), Vec::new());
        let open = structure::find(raw.as_bytes(), &mut entries, &mut quotes).open_at_end;
        let mut next = 0;
        let (mut record, _, line_end) = next_record(&entries, &mut next, 0, raw.len());
        assert_eq!(line_end, raw.len(), "one record: {raw:?}");
        record.irregular |= open;
        let mut fields = Fields::default();
        if !split(raw, raw.as_bytes(), &record, &quotes, &mut fields) {
            return None;
        }
        let field = |i: usize| {
            if fields.attr_apart && i == super::ATTR_FIELD {
                fields.attr.clone()
            } else {
                fields.value(raw, i).to_string()
            }
        };
        Some((0..12).map(field).collect())
    }

    fn reference(raw: &str) -> Option<Vec<String>> {
        let (mut text, mut fields) = (String::new(), Vec::new());
        let Ok(12) = split_record(raw, raw.contains('"'), &mut text, &mut fields) else {
            return None;
        };
        Some(fields.iter().map(|r| text[r.clone()].to_string()).collect())
    }

    /// `generated` as one record: a line end outside quotes would end it, so those become
    /// plain letters.
    fn one_record(generated: &str) -> String {
        let mut quotes = 0;
        generated
            .chars()
            .map(|c| {
                quotes += usize::from(c == '"');
                if c == '\n' && quotes % 2 == 0 {
                    'a'
                } else {
                    c
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]
        #[test]
        fn splits_as_the_row_by_row_reader_does(generated in "[a\",\n\ré]{0,40}") {
            let raw = one_record(&generated);
            prop_assert_eq!(fast(&raw), reference(&raw), "{:?}", raw);
        }

        #[test]
        fn splits_twelve_field_records_as_it_does(
            fields in proptest::collection::vec("[a\",\n]{0,6}", 12),
            quoted in proptest::collection::vec(any::<bool>(), 12),
        ) {
            // Mostly well-formed: some fields quoted (their quotes doubled), others left as
            // generated, which can leave stray quotes and commas.
            let joined: Vec<String> = fields
                .iter()
                .zip(&quoted)
                .map(|(f, &q)| if q { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.clone() })
                .collect();
            let raw = one_record(&joined.join(","));
            prop_assert_eq!(fast(&raw), reference(&raw), "{:?}", raw);
        }
    }

    #[test]
    fn dump_rows_split_into_their_fields() {
        let row = "2,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{\"\"size\"\":64}\",\"a.py(1): f\nb\",";
        let fields = fast(row).unwrap();
        assert_eq!(fields[9], "{\"size\":64}");
        assert_eq!(fields[10], "a.py(1): f\nb");
        assert_eq!(Some(fields), reference(row));
        // Stray quotes are split as the row-by-row reader splits them.
        let stray = "2,MAL\"LOC,PTA,N/A,5,1,1,cpu,0x10,\"{}\"x,\"a\"\"\"b\",";
        assert_eq!(fast(stray), reference(stray));
        assert!(fast(stray).is_some());
    }
}
