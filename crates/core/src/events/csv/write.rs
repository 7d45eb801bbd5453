//! The CSV form of the dump: exactly the original msMemScope's header, RFC 4180 quoting, one row
//! per event.

use crate::events::row::{DeviceId, EventRow};

pub use crate::events::row::HEADER;

/// Appends one row (with its line end) to `out`. Hand-rolled (integers through `itoa`, the
/// pointer in hex by table) because the writer formats a million rows a second.
pub fn write_row(out: &mut String, row: &EventRow) {
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
    out.push_str(n.format(row.ts_ns));
    out.push(',');
    out.push_str(n.format(row.pid));
    out.push(',');
    out.push_str(n.format(row.tid));
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
    if field
        .bytes()
        .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
    {
        out.push('"');
        // Runs between quotes copied whole: the Attr column (a JSON object, quoted on every
        // row) is most of what a writer copies.
        let mut rest = field;
        while let Some(quote) = memchr::memchr(b'"', rest.as_bytes()) {
            out.push_str(&rest[..=quote]);
            out.push('"');
            rest = &rest[quote + 1..];
        }
        out.push_str(rest);
        out.push('"');
    } else {
        out.push_str(field);
    }
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

    #[test]
    fn header_is_exact() {
        assert_eq!(HEADER.split(',').count(), 12);
    }
}
