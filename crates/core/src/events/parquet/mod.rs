//! The Parquet form of the dump (`--format parquet`, `msmemscope export --format parquet`):
//! `memscope_dump_{ts}.parquet`, one row per dump row, the CSV's 12 columns with the CSV's text
//! for each value (integers as signed INT64), then five typed copies of Attr values for SQL
//! engines (DuckDB's `read_parquet`, Spark's `spark.read.parquet`), null where the key is absent.
//! The schema is fixed ([`COLUMNS`]); queries are written against it.
//!
//! [`ParquetRows`] reads a file back into the same [`EventRow`]s the CSV and SQLite readers give,
//! with the same checks: a regular file, the dump's columns, IDs strictly ascending, Attr a JSON
//! object whose counted values are 64-bit integers, rows at most [`MAX_ROW_BYTES`]; and the typed
//! columns equal to the Attr values they copy. A dump another engine filtered or rewrote reads
//! too: columns OPTIONAL (a null in a CSV column refuses its row), the typed columns left out,
//! snappy instead of zstd. [`writer::ParquetWriter`] writes rows;
//! [`export::export`] turns a CSV or SQLite dump (or the CSV journal of a `--format parquet` run)
//! into the Parquet file beside it.

pub mod export;
mod schema;
pub mod writer;

use schema::{column_mismatch, DUMP_COLUMNS, OWNER, TYPED_INTS};
pub use schema::{schema, Column, Kind, COLUMNS};

use std::path::{Path, PathBuf};

use parquet::column::reader::{get_typed_column_reader, ColumnReaderImpl};
use parquet::data_type::{ByteArray, ByteArrayType, DataType, Int64Type};
use parquet::file::reader::{FileReader, SerializedFileReader};

use super::attrs::check_attrs;
use super::row::{DeviceId, Event, EventRow, EventType};
use super::source::{open_regular, IdOrder, ReadError, MAX_ROW_BYTES};

/// Rows read from every column at a time. Values are slices of the decoded pages, so a batch
/// holds those pages; a small batch keeps that bounded for files of long stacks.
const BATCH: usize = 1024;

/// One column's reader in the current row group.
enum ColumnCursor {
    Int(ColumnReaderImpl<Int64Type>),
    Text(ColumnReaderImpl<ByteArrayType>),
}

/// One column's values of a batch, `None` for a null.
enum Values {
    Int(Vec<Option<i64>>),
    Text(Vec<Option<ByteArray>>),
}

/// Streams rows from a Parquet dump, in file order.
pub struct ParquetRows {
    path: PathBuf,
    file: SerializedFileReader<std::fs::File>,
    /// Columns present: 12, or all 17.
    width: usize,
    /// Per column: whether it may hold nulls (definition levels to read).
    optional: Vec<bool>,
    /// The next row group to open.
    next_group: usize,
    /// Rows left in the open row group.
    group_left: u64,
    cursors: Vec<ColumnCursor>,
    batch: std::collections::VecDeque<EventRow>,
    /// Rows handed out so far.
    rows: u64,
    order: IdOrder,
    /// The error that ends the rows, handed out after the batch's rows before it.
    failed: Option<ReadError>,
    done: bool,
}

impl ParquetRows {
    pub fn open(path: &Path) -> Result<ParquetRows, ReadError> {
        let file = open_regular(path)?;
        let not_a_dump = |reason: String| ReadError::NotADump {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(claimed) = oversized_footer(&file) {
            return Err(not_a_dump(format!(
                "its footer claims {claimed} bytes of metadata (a dump's has a few KiB a row \
                 group; at most {MAX_METADATA} are read)"
            )));
        }
        let file_len = file.metadata().map_or(0, |m| m.len());
        let reader = guarded(|| SerializedFileReader::new(file))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| not_a_dump(format!("not a Parquet file ({})", one_line(&e))))?;
        if let Some(reason) = misplaced_chunk(reader.metadata(), file_len) {
            return Err(not_a_dump(reason));
        }
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let width = schema.num_columns();
        if width != DUMP_COLUMNS && width != COLUMNS.len() {
            let names: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
            return Err(not_a_dump(format!(
                "{width} columns, expected the {DUMP_COLUMNS} of the CSV dump or all {}: {}",
                COLUMNS.len(),
                names.join(", ")
            )));
        }
        if let Some(reason) = (0..width).find_map(|i| column_mismatch(i, &schema.column(i))) {
            return Err(not_a_dump(reason));
        }
        let optional = (0..width)
            .map(|i| schema.column(i).max_def_level() > 0)
            .collect();
        Ok(ParquetRows {
            path: path.to_path_buf(),
            file: reader,
            width,
            optional,
            next_group: 0,
            group_left: 0,
            cursors: Vec::new(),
            batch: Default::default(),
            rows: 0,
            order: IdOrder::default(),
            failed: None,
            done: false,
        })
    }

    fn damaged(&self, what: impl std::fmt::Display) -> ReadError {
        let what = one_line(&what.to_string());
        let reason = if what.contains("Disabled feature at compile time") {
            format!("compressed with a codec that is not read here (zstd and snappy are): {what}")
        } else {
            format!("damaged Parquet data: {what}")
        };
        ReadError::NotADump {
            path: self.path.clone(),
            reason,
        }
    }

    fn bad(&self, line: u64, reason: impl Into<String>) -> ReadError {
        ReadError::BadRow {
            path: self.path.clone(),
            line,
            reason: reason.into(),
        }
    }

    /// Opens the next row group's column readers; false after the last.
    fn open_group(&mut self) -> Result<bool, ReadError> {
        let groups = self.file.metadata().num_row_groups();
        while self.next_group < groups {
            let index = self.next_group;
            self.next_group += 1;
            let rows = self.file.metadata().row_group(index).num_rows();
            let Ok(rows @ 1..) = u64::try_from(rows) else {
                continue;
            };
            let file = &self.file;
            let width = self.width;
            let cursors = guarded(|| -> Result<Vec<ColumnCursor>, String> {
                let group = file.get_row_group(index).map_err(|e| e.to_string())?;
                (0..width)
                    .map(|i| {
                        let reader = group.get_column_reader(i).map_err(|e| e.to_string())?;
                        Ok(match COLUMNS[i].kind {
                            Kind::Int64 => ColumnCursor::Int(get_typed_column_reader(reader)),
                            Kind::Text => ColumnCursor::Text(get_typed_column_reader(reader)),
                        })
                    })
                    .collect()
            })
            .and_then(|r| r);
            self.cursors = cursors.map_err(|e| self.damaged(format!("row group {index}: {e}")))?;
            self.group_left = rows;
            return Ok(true);
        }
        Ok(false)
    }

    /// Decodes the next batch of the open row group into rows.
    fn fill(&mut self) -> Result<(), ReadError> {
        let want = (self.group_left as usize).min(BATCH);
        let mut columns = Vec::with_capacity(self.width);
        for (i, cursor) in self.cursors.iter_mut().enumerate() {
            let optional = self.optional[i];
            let read = guarded(|| match cursor {
                ColumnCursor::Int(c) => read_column(c, optional, want).map(Values::Int),
                ColumnCursor::Text(c) => read_column(c, optional, want).map(Values::Text),
            })
            .and_then(|r| r);
            let values = match read {
                Ok(values) => values,
                Err(e) => return Err(self.damaged(format!("column {:?}: {e}", COLUMNS[i].name))),
            };
            let got = match &values {
                Values::Int(v) => v.len(),
                Values::Text(v) => v.len(),
            };
            if got != want {
                return Err(self.damaged(format!(
                    "column {:?} ends {} rows before its row group",
                    COLUMNS[i].name,
                    self.group_left - got as u64
                )));
            }
            columns.push(values);
        }
        self.group_left -= want as u64;
        for r in 0..want {
            match self.assemble(&columns, r) {
                Ok(row) => self.batch.push_back(row),
                Err(e) => {
                    // The rows before it are handed out first.
                    self.failed = Some(e);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Row `r` of a batch: checked as the other readers check theirs.
    fn assemble(&mut self, columns: &[Values], r: usize) -> Result<EventRow, ReadError> {
        self.rows += 1;
        let position = self.rows;
        let int = |i: usize| match &columns[i] {
            Values::Int(v) => v[r],
            Values::Text(_) => None,
        };
        let text = |i: usize| -> Result<Option<&str>, String> {
            match &columns[i] {
                Values::Text(v) => v[r]
                    .as_ref()
                    .map(|b| {
                        std::str::from_utf8(b.data())
                            .map_err(|_| format!("{} is not UTF-8", COLUMNS[i].name))
                    })
                    .transpose(),
                Values::Int(_) => Ok(None),
            }
        };
        let id = match int(0) {
            Some(id) if id >= 0 => id as u64,
            Some(id) => return Err(self.bad(position, format!("ID {id} is negative"))),
            None => return Err(self.bad(position, "ID is null")),
        };
        let mut bytes = 0usize;
        let mut fields: [&str; DUMP_COLUMNS] = [""; DUMP_COLUMNS];
        for (i, field) in fields.iter_mut().enumerate() {
            if COLUMNS[i].kind == Kind::Text {
                *field = text(i)
                    .map_err(|reason| self.bad(id, reason))?
                    .ok_or_else(|| self.bad(id, format!("{} is null", COLUMNS[i].name)))?;
                bytes += field.len();
            }
        }
        if bytes > MAX_ROW_BYTES {
            return Err(ReadError::RowTooLong {
                path: self.path.clone(),
                line: None,
                row: position,
            });
        }
        let number = |i: usize| -> Result<u64, String> {
            match int(i) {
                Some(v) if v >= 0 => Ok(v as u64),
                Some(v) => Err(format!("{} {v} is negative", COLUMNS[i].name)),
                None => Err(format!("{} is null", COLUMNS[i].name)),
            }
        };
        let row = build_row(id, &fields, number).map_err(|reason| self.bad(id, reason))?;
        if self.width == COLUMNS.len() {
            check_typed(&row, int, text(OWNER).ok().flatten())
                .map_err(|reason| self.bad(id, reason))?;
        }
        self.order
            .check(id)
            .map_err(|reason| self.bad(id, reason))?;
        Ok(row)
    }
}

impl Iterator for ParquetRows {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            if let Some(row) = self.batch.pop_front() {
                return Some(Ok(row));
            }
            if let Some(e) = self.failed.take() {
                self.done = true;
                return Some(Err(e));
            }
            let step = if self.group_left == 0 {
                self.open_group().map(|more| {
                    if !more {
                        self.done = true;
                    }
                })
            } else {
                self.fill()
            };
            if let Err(e) = step {
                // A row after a bad one cannot be trusted (nor, in a damaged file, found).
                self.done = true;
                self.batch.clear();
                return Some(Err(e));
            }
            if self.done {
                return None;
            }
        }
    }
}

/// Up to `want` values of one column, `None` for nulls (a required column has none).
fn read_column<T: DataType>(
    cursor: &mut ColumnReaderImpl<T>,
    optional: bool,
    want: usize,
) -> Result<Vec<Option<T::T>>, String> {
    let mut values = Vec::with_capacity(want);
    let mut defs = Vec::with_capacity(if optional { want } else { 0 });
    let mut records = 0;
    while records < want {
        let (read, _, _) = cursor
            .read_records(
                want - records,
                optional.then_some(&mut defs),
                None,
                &mut values,
            )
            .map_err(|e| e.to_string())?;
        if read == 0 {
            break;
        }
        records += read;
    }
    if !optional {
        return Ok(values.into_iter().map(Some).collect());
    }
    // Values hold the non-null ones only; the definition levels place them.
    let mut values = values.into_iter();
    let placed: Vec<Option<T::T>> = defs
        .iter()
        .map(|&d| if d > 0 { values.next() } else { None })
        .collect();
    if placed.len() != records || values.next().is_some() {
        return Err("definition levels do not match the values".into());
    }
    Ok(placed)
}

/// An [`EventRow`] from the 12 CSV columns' values (texts as the CSV writes them).
fn build_row(
    id: u64,
    fields: &[&str; DUMP_COLUMNS],
    number: impl Fn(usize) -> Result<u64, String>,
) -> Result<EventRow, String> {
    let event = Event::parse(fields[1]).ok_or_else(|| format!("unknown Event {:?}", fields[1]))?;
    let event_type =
        EventType::parse(fields[2]).ok_or_else(|| format!("unknown Event Type {:?}", fields[2]))?;
    let name = if fields[3] == "N/A" { "" } else { fields[3] };
    let mut row = EventRow::new(event, event_type, name);
    row.id = id;
    row.ts_ns = number(4)?;
    row.pid =
        u32::try_from(number(5)?).map_err(|_| "Process Id does not fit 32 bits".to_string())?;
    row.tid = number(6)?;
    row.device =
        DeviceId::parse(fields[7]).ok_or_else(|| format!("bad Device Id {:?}", fields[7]))?;
    row.ptr = match fields[8] {
        "N/A" | "" => None,
        p => {
            let hex = p.strip_prefix("0x").unwrap_or(p);
            let value = (!hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u64::from_str_radix(hex, 16).ok())
                .flatten();
            Some(value.ok_or_else(|| format!("bad Ptr {p:?}"))?)
        }
    };
    let attrs = fields[9];
    if !attrs.is_empty() && attrs != "{}" {
        check_attrs(attrs)?;
        row.attrs_json = Some(attrs.to_string());
    }
    row.python_stack = fields[10].to_string();
    row.c_stack = fields[11].to_string();
    Ok(row)
}

/// The typed columns must say what Attr says (as the writer reads it, [`writer::typed_values`]):
/// SQL over them and analyses over Attr then agree.
fn check_typed(
    row: &EventRow,
    int: impl Fn(usize) -> Option<i64>,
    owner: Option<&str>,
) -> Result<(), String> {
    let (values, attr_owner) = writer::typed_values(row);
    for ((index, key), attr) in TYPED_INTS.into_iter().zip(values) {
        let column = int(index);
        if column.map(|v| v as u64) != attr || column.is_some_and(|v| v < 0) {
            return Err(format!(
                "column {key} is {} but Attr says {}",
                column.map_or("null".to_string(), |v| v.to_string()),
                attr.map_or("nothing".to_string(), |v| v.to_string())
            ));
        }
    }
    let attr = attr_owner;
    if attr.as_deref() != owner {
        return Err(format!(
            "column owner is {} but Attr says {}",
            owner.map_or("null".to_string(), |o| format!("{o:?}")),
            attr.map_or("nothing".to_string(), |o| format!("{o:?}"))
        ));
    }
    Ok(())
}

/// The most metadata a footer may claim: the Parquet crate allocates what it claims before
/// reading it, and a damaged length in a large file would be gigabytes.
const MAX_METADATA: u64 = 64 << 20;

/// The metadata length `file`'s footer claims, where it is over [`MAX_METADATA`].
fn oversized_footer(file: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata().ok()?.len();
    let mut footer = [0u8; 8];
    file.read_exact_at(&mut footer, len.checked_sub(8)?).ok()?;
    let claimed = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]) as u64;
    (&footer[4..] == b"PAR1" && claimed > MAX_METADATA).then_some(claimed)
}

/// The first column chunk the metadata places outside the file (a negative offset or size, or
/// past its end): the Parquet crate asserts on the first and would read what is not there.
fn misplaced_chunk(meta: &parquet::file::metadata::ParquetMetaData, len: u64) -> Option<String> {
    for (g, group) in meta.row_groups().iter().enumerate() {
        for (c, chunk) in group.columns().iter().enumerate() {
            let start = chunk
                .dictionary_page_offset()
                .unwrap_or(chunk.data_page_offset());
            let size = chunk.compressed_size();
            let end = u64::try_from(start)
                .ok()
                .zip(u64::try_from(size).ok())
                .and_then(|(start, size)| start.checked_add(size));
            if end.is_none_or(|end| end > len) {
                return Some(format!(
                    "damaged Parquet metadata: row group {g}, column {c}: a chunk of {size} \
                     bytes at byte {start}, outside the file's {len}"
                ));
            }
        }
    }
    None
}

/// The Parquet crate's message on one line, as every reader error is.
fn one_line(message: &str) -> String {
    message.replace(['\n', '\r'], " ")
}

thread_local! {
    /// This thread is inside [`guarded`]: a panic there becomes the reader's one-line error, and
    /// the panic hook's own lines would be a second, unasked-for message.
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a call into the Parquet crate, turning a panic on damaged input into an error (the
/// crate checks most of what it reads, but some damaged pages still reach a slice index in it,
/// and a reader must never take the process down nor print more than its one line).
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        // Every other panic is reported by whatever hook the process had.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let outer = GUARDED.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(outer));
    result.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the Parquet reader failed".into());
        one_line(&message)
    })
}

#[cfg(test)]
mod tests;
