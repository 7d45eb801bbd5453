//! The CSV form of the dump: exactly the original msMemScope's header, RFC 4180 quoting, one row
//! per event.

use crate::events::row::{DeviceId, EventRow};

pub use crate::events::row::HEADER;

/// Appends one row (with its line end) to `out`. For many rows, a [`RowWriter`] is cheaper.
pub fn write_row(out: &mut String, row: &EventRow) {
    RowWriter::default().write(out, row);
}

/// Writes rows one after another, keeping the text consecutive rows share: the seconds of the
/// timestamp (rows come in the order of time) and the process and thread ids. Hand-rolled
/// (integers through `itoa`, the pointer in hex by table) because the writer formats millions
/// of rows a second.
#[derive(Default)]
pub struct RowWriter {
    /// The whole seconds of the last timestamp written, and their digits.
    second: Option<(u64, String)>,
    /// The last row's (pid, tid), and their text `pid,tid`.
    ids: Option<((u32, u64), String)>,
}

impl RowWriter {
    /// Appends one row, with its line end, to `out`.
    pub fn write(&mut self, out: &mut String, row: &EventRow) {
        let mut n = itoa::Buffer::new();
        out.push_str(n.format(row.id));
        out.push(',');
        out.push_str(row.event.as_str());
        out.push(',');
        out.push_str(row.event_type.as_str());
        out.push(',');
        push_field(
            out,
            if row.name.is_empty() {
                "N/A"
            } else {
                &row.name
            },
        );
        out.push(',');
        self.push_timestamp(out, row.ts_ns);
        out.push(',');
        self.push_ids(out, row.pid, row.tid);
        out.push(',');
        match row.device {
            DeviceId::None => out.push_str("N/A"),
            DeviceId::Cpu => out.push_str("cpu"),
            DeviceId::Cuda(i) => out.push_str(n.format(i)),
        }
        out.push(',');
        match row.ptr {
            Some(p) => push_ptr(out, p),
            None => out.push_str("N/A"),
        }
        out.push(',');
        match &row.attrs_json {
            Some(raw) if !raw.is_empty() => push_field(out, raw),
            Some(_) => out.push_str("{}"),
            None if row.attrs.is_empty() => out.push_str("{}"),
            None => push_field(out, &serde_json::to_string(&row.attrs).unwrap_or_default()),
        }
        out.push(',');
        push_field(out, &row.python_stack);
        out.push(',');
        push_field(out, &row.c_stack);
        out.push('\n');
    }

    /// The nanoseconds as a decimal: the seconds' digits as the last row had them, then nine
    /// digits of the fraction.
    fn push_timestamp(&mut self, out: &mut String, ts_ns: u64) {
        const NS: u64 = 1_000_000_000;
        if ts_ns < NS {
            out.push_str(itoa::Buffer::new().format(ts_ns));
            return;
        }
        let second = ts_ns / NS;
        match &self.second {
            Some((s, text)) if *s == second => out.push_str(text),
            _ => {
                let text = itoa::Buffer::new().format(second).to_owned();
                out.push_str(&text);
                self.second = Some((second, text));
            }
        }
        let mut fraction = ts_ns % NS;
        let mut digits = [b'0'; 9];
        for digit in digits.iter_mut().rev() {
            *digit = b'0' + (fraction % 10) as u8;
            fraction /= 10;
        }
        // SAFETY: only ASCII digits were written.
        out.push_str(unsafe { std::str::from_utf8_unchecked(&digits) });
    }

    fn push_ids(&mut self, out: &mut String, pid: u32, tid: u64) {
        match &self.ids {
            Some((ids, text)) if *ids == (pid, tid) => out.push_str(text),
            _ => {
                let mut n = itoa::Buffer::new();
                let text = format!("{},{}", n.format(pid), itoa::Buffer::new().format(tid));
                out.push_str(&text);
                self.ids = Some(((pid, tid), text));
            }
        }
    }
}

/// `0x%016x`.
fn push_ptr(out: &mut String, ptr: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [b'0'; 18];
    text[1] = b'x';
    for i in 0..16 {
        text[17 - i] = HEX[((ptr >> (4 * i)) & 0xf) as usize];
    }
    // SAFETY: only ASCII bytes were written.
    out.push_str(unsafe { std::str::from_utf8_unchecked(&text) });
}

/// RFC 4180: a field containing a comma, quote, CR or LF is quoted, quotes doubled.
pub fn push_field(out: &mut String, field: &str) {
    if needs_quotes(field.as_bytes()) {
        out.push('"');
        // Runs between quotes copied whole, the quotes found by one pass over the field: the
        // Attr column (a JSON object, quoted on every row) is most of what a writer copies.
        let mut from = 0;
        for quote in memchr::memchr_iter(b'"', field.as_bytes()) {
            out.push_str(&field[from..=quote]);
            out.push('"');
            from = quote + 1;
        }
        out.push_str(&field[from..]);
        out.push('"');
    } else {
        out.push_str(field);
    }
}

/// Whether `bytes` holds a comma, quote, CR or LF, looked for eight bytes at a time: most
/// fields (op names, numbers) hold none, and are read to their end.
fn needs_quotes(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    /// Exact as a yes/no: some byte of `word` is `byte` (the borrow can misplace which byte,
    /// never make a match where there is none).
    fn has(word: u64, byte: u8) -> bool {
        let x = word ^ (ONES * u64::from(byte));
        x.wrapping_sub(ONES) & !x & HIGHS != 0
    }
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(chunk);
        let word = u64::from_le_bytes(eight);
        if has(word, b',') | has(word, b'"') | has(word, b'\n') | has(word, b'\r') {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{DeviceId, Event, EventType};

    /// Quotes are doubled wherever they are (first, last, in runs), and the rest is copied as
    /// it is, multi-byte characters too.
    #[test]
    fn quoted_fields_double_every_quote() {
        for (field, written) in [
            (r#""a""#, r#""""a""""#),
            (r#"{"k":"v""}"#, r#""{""k"":""v""""}""#),
            ("é,ü\"x", "\"é,ü\"\"x\""),
            ("line\nnext", "\"line\nnext\""),
            ("plain", "plain"),
        ] {
            let mut out = String::from("|");
            push_field(&mut out, field);
            assert_eq!(out, format!("|{written}"), "{field}");
        }
    }

    /// Every special byte is found at every place of a word and of the tail, and no other
    /// byte is taken for one (the high bytes included: the borrow trick's weak spot).
    #[test]
    fn quoting_is_decided_at_every_offset() {
        for len in 0..20 {
            for at in 0..len {
                for special in [b',', b'"', b'\n', b'\r'] {
                    let mut field = vec![b'a'; len];
                    field[at] = special;
                    assert!(needs_quotes(&field), "{len} {at} {special}");
                }
            }
            for other in (0..=255u8).filter(|b| !matches!(b, b',' | b'"' | b'\n' | b'\r')) {
                let field = vec![other; len];
                assert!(!needs_quotes(&field), "{len} {other}");
                // A byte just above or below a special one, next to it.
                let mut mixed = vec![other; len];
                if len > 1 {
                    mixed[len / 2] = other.wrapping_add(1).max(0x2d);
                    assert!(!needs_quotes(&mixed), "{len} {other} {mixed:?}");
                }
            }
        }
    }

    #[test]
    fn malloc_row_format() {
        let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
        row.id = 7;
        row.ts_ns = 123;
        row.pid = 10;
        row.tid = 11;
        row.device = DeviceId::Cpu;
        row.ptr = Some(0xabc);
        row.attrs.insert("size".into(), 64.into());
        row.attrs.insert("owner".into(), "PTA".into());
        row.python_stack = "a.py(1): f\nb.py(2): g".into();
        let mut out = String::new();
        write_row(&mut out, &row);
        assert_eq!(
            out,
            "7,MALLOC,PTA,N/A,123,10,11,cpu,0x0000000000000abc,\"{\"\"size\"\":64,\"\"owner\"\":\"\"PTA\"\"}\",\"a.py(1): f\nb.py(2): g\",\n"
        );
    }

    #[test]
    fn pointers_and_devices() {
        let mut row = EventRow::new(Event::Free, EventType::Hal, "");
        row.ptr = Some(0xdead_beef);
        row.device = DeviceId::Cuda(3);
        let mut out = String::new();
        write_row(&mut out, &row);
        assert_eq!(out, "0,FREE,HAL,N/A,0,0,0,3,0x00000000deadbeef,{},,\n");
    }

    /// One writer over rows that share seconds and ids, and rows that do not, writes what a
    /// fresh writer writes for each (a fraction with leading zeros, a timestamp under a second).
    #[test]
    fn a_row_writer_writes_what_a_fresh_one_writes() {
        let mut writer = RowWriter::default();
        let stamps = [
            1_796_684_908_131_217_170,
            1_796_684_908_000_000_001,
            1_796_684_908_999_999_999,
            1_796_684_909_000_000_000,
            999_999_999,
            0,
            1_000_000_000,
            u64::MAX,
        ];
        for (i, ts) in stamps.into_iter().enumerate() {
            let mut row = EventRow::new(Event::Free, EventType::Pta, "");
            row.ts_ns = ts;
            row.pid = 10 + (i as u32 % 2);
            row.tid = 11;
            let mut kept = String::new();
            writer.write(&mut kept, &row);
            let mut fresh = String::new();
            write_row(&mut fresh, &row);
            assert_eq!(kept, fresh);
            let expected = format!("0,FREE,PTA,N/A,{ts},{},11,N/A,N/A,{{}},,\n", row.pid);
            assert_eq!(kept, expected);
        }
    }

    #[test]
    fn header_is_exact() {
        assert_eq!(HEADER.split(',').count(), 12);
    }
}
