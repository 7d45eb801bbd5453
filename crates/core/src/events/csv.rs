//! The CSV form of the dump: exactly the seed's header, RFC 4180 quoting, one row per event.

use std::fmt::Write;

use super::row::{format_ptr, EventRow};

pub const HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";

/// Appends one row (with its line end) to `out`.
pub fn write_row(out: &mut String, row: &EventRow) {
    let _ = write!(
        out,
        "{},{},{},",
        row.id,
        row.event.as_str(),
        row.event_type.as_str()
    );
    push_field(
        out,
        if row.name.is_empty() {
            "N/A"
        } else {
            &row.name
        },
    );
    let _ = write!(
        out,
        ",{},{},{},{},",
        row.ts_ns, row.pid, row.tid, row.device
    );
    match row.ptr {
        Some(p) => out.push_str(&format_ptr(p)),
        None => out.push_str("N/A"),
    }
    out.push(',');
    if row.attrs.is_empty() {
        out.push_str("{}");
    } else {
        push_field(
            out,
            &serde_json::Value::Object(row.attrs.clone()).to_string(),
        );
    }
    out.push(',');
    push_field(out, &row.python_stack);
    out.push(',');
    push_field(out, &row.c_stack);
    out.push('\n');
}

/// RFC 4180: a field containing a comma, quote, CR or LF is quoted, quotes doubled.
pub fn push_field(out: &mut String, field: &str) {
    if field.contains([',', '"', '\n', '\r']) {
        out.push('"');
        for c in field.chars() {
            if c == '"' {
                out.push('"');
            }
            out.push(c);
        }
        out.push('"');
    } else {
        out.push_str(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{DeviceId, Event, EventType};

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
    fn header_is_exact() {
        assert_eq!(HEADER.split(',').count(), 12);
    }
}
