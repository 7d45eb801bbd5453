//! The SQLite form of the dump (`--format db`): table `memscope_dump` with the CSV's columns
//! (same names, same text for each value; Attr as its JSON text). The writer creates it and
//! inserts through here; tests build DB dumps the same way.

use crate::events::row::{format_ptr, EventRow};

pub const CREATE_TABLE: &str = "CREATE TABLE memscope_dump (\
    \"ID\" INTEGER PRIMARY KEY, \"Event\" TEXT, \"Event Type\" TEXT, \"Name\" TEXT, \
    \"Timestamp(ns)\" INTEGER, \"Process Id\" INTEGER, \"Thread Id\" INTEGER, \"Device Id\" TEXT, \
    \"Ptr\" TEXT, \"Attr\" TEXT, \"Call Stack(Python)\" TEXT, \"Call Stack(C)\" TEXT)";

const INSERT: &str =
    "INSERT INTO memscope_dump VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// Inserts one row (the statement is prepared once per connection and cached).
pub fn insert(conn: &rusqlite::Connection, row: &EventRow) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(INSERT)?;
    let ptr = row.ptr.map(format_ptr).unwrap_or_else(|| "N/A".into());
    let name = if row.name.is_empty() {
        "N/A"
    } else {
        row.name.as_str()
    };
    statement.execute(rusqlite::params![
        row.id as i64,
        row.event.as_str(),
        row.event_type.as_str(),
        name,
        row.ts_ns as i64,
        row.pid as i64,
        row.tid as i64,
        row.device.to_string(),
        ptr,
        row.attrs_text(),
        row.python_stack,
        row.c_stack,
    ])?;
    Ok(())
}
