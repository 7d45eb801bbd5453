//! Rows into a Parquet file with the low-level column API: a row group's values are kept column
//! by column (each text column one byte buffer and its value ends) and written when the group
//! holds [`ROW_GROUP_ROWS`] rows or [`ROW_GROUP_BYTES`] of text, zstd-compressed, each column
//! chunk after the other; the footer at [`ParquetWriter::finish`].

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use super::{COLUMNS, OWNER, TYPED_INTS};
use crate::events::row::{DeviceId, EventRow};

/// Rows per row group at most (the crate's own default).
pub const ROW_GROUP_ROWS: usize = 1 << 20;
/// Text bytes per row group at most: rows with long stacks make smaller groups, and the
/// writer's memory stays about this much.
pub const ROW_GROUP_BYTES: usize = 64 << 20;
/// Values handed to a column writer at a time.
const CHUNK: usize = 64 << 10;
/// zstd level 1: most of level 3's ratio on dump text at twice its speed.
const ZSTD_LEVEL: i32 = 1;

/// Why rows could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// An integer that Parquet's signed INT64 columns cannot hold (the row is refused; rows
    /// before it are kept).
    #[error(
        "row ID {id}: malformed row: {what} is {value}, above {}: the Parquet dump's integer columns are signed INT64",
        i64::MAX
    )]
    TooLarge { id: u64, what: String, value: u64 },
    /// The Parquet encoder, or the file under it, failed.
    #[error("{0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

/// The `owner` Attr as text: the string, or the JSON text of another value; `None` without
/// the key or when it is `null`.
pub fn owner_of(row: &EventRow) -> Option<String> {
    if let Some(owner) = row.attr_str("owner") {
        return Some(owner.to_owned());
    }
    let value = match &row.attrs_json {
        // Escaped or not a string: the rare case that needs a parse.
        Some(raw) if raw.contains("\"owner\"") => serde_json::from_str::<crate::events::Attrs>(raw)
            .ok()?
            .remove("owner")?,
        Some(_) => return None,
        None => row.attrs.get("owner")?.clone(),
    };
    match value {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// The typed columns of a row read from a dump, in one parse of its Attr text.
#[derive(serde::Deserialize)]
struct Typed<'a> {
    size: Option<u64>,
    allocation_id: Option<u64>,
    used: Option<u64>,
    total: Option<u64>,
    #[serde(borrow)]
    owner: Option<std::borrow::Cow<'a, str>>,
}

/// The values of the typed columns (size, allocation_id, used, total; owner): Attr's top-level
/// keys as JSON reads them, which for every Attr the readers accept are the values
/// [`EventRow::attr_u64`] and [`owner_of`] give (the way taken when that parse fails). The
/// reader checks a file's typed columns with this same function.
pub(super) fn typed_values(row: &EventRow) -> ([Option<u64>; 4], Option<String>) {
    if row.attrs.is_empty() {
        if row.attrs_known() {
            // Found when the Attr was rendered (the runtime's block rows): no parse per row.
            return (TYPED_INTS.map(|(_, key)| row.attr_u64(key)), owner_of(row));
        }
        if let Some(raw) = &row.attrs_json {
            // What the readers let through parses so; anything else (an owner that is not a
            // string, a number the readers do not count) takes the slow way below.
            if let Ok(t) = serde_json::from_str::<Typed>(raw) {
                let owner = t.owner.map(|o| o.into_owned());
                return ([t.size, t.allocation_id, t.used, t.total], owner);
            }
        } else {
            return ([None; 4], None);
        }
    }
    (TYPED_INTS.map(|(_, key)| row.attr_u64(key)), owner_of(row))
}

/// The Attr column's text, as the CSV writes it.
fn attr_text(row: &EventRow) -> std::borrow::Cow<'_, str> {
    match &row.attrs_json {
        Some(raw) if !raw.is_empty() => raw.as_str().into(),
        Some(_) => "{}".into(),
        None if row.attrs.is_empty() => "{}".into(),
        None => serde_json::to_string(&row.attrs).unwrap_or_default().into(),
    }
}

/// A text column of the open row group.
#[derive(Default)]
struct Text {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Text {
    fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len());
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Takes the buffer back once the column writer dropped its slices of it (no new pages
    /// to fault in for the next row group).
    fn reclaim(&mut self, bytes: Bytes) {
        if let Ok(unique) = bytes.try_into_mut() {
            let mut buffer = Vec::from(unique);
            buffer.clear();
            self.bytes = buffer;
        }
    }
}

/// An optional column: values of the rows that have one, and a definition level per row.
#[derive(Default)]
struct Optional<T> {
    values: T,
    defs: Vec<i16>,
}

/// The open row group, column by column.
#[derive(Default)]
struct Group {
    ints: [Vec<i64>; 4],
    events: Vec<&'static str>,
    types: Vec<&'static str>,
    texts: [Text; 6],
    typed: [Optional<Vec<i64>>; 4],
    owner: Optional<Text>,
    text_bytes: usize,
}

impl Group {
    fn rows(&self) -> usize {
        self.ints[0].len()
    }

    fn clear(&mut self) {
        for v in &mut self.ints {
            v.clear();
        }
        self.events.clear();
        self.types.clear();
        for t in &mut self.texts {
            t.clear();
        }
        for o in &mut self.typed {
            o.values.clear();
            o.defs.clear();
        }
        self.owner.values.clear();
        self.owner.defs.clear();
        self.text_bytes = 0;
    }
}

/// Writes dump rows to `W` as a Parquet file of [`super::COLUMNS`].
pub struct ParquetWriter<W: Write + Send> {
    file: SerializedFileWriter<W>,
    group: Group,
    rows: u64,
}

fn properties() -> Result<WriterProperties, parquet::errors::ParquetError> {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?))
        .set_created_by(format!("msmemscope {}", env!("CARGO_PKG_VERSION")));
    // Min/max of stacks and Attr help no query, nor of Ptr (hex text spread over every row
    // group, at the cost of a comparison per row); the columns that are filtered on keep theirs.
    for name in ["Ptr", "Attr", "Call Stack(Python)", "Call Stack(C)"] {
        props =
            props.set_column_statistics_enabled(ColumnPath::from(name), EnabledStatistics::None);
    }
    // Unique per row: a dictionary would only be built to be dropped.
    for name in ["ID", "Timestamp(ns)", "Ptr", "Attr"] {
        props = props.set_column_dictionary_enabled(ColumnPath::from(name), false);
    }
    Ok(props.build())
}

impl<W: Write + Send> ParquetWriter<W> {
    pub fn new(out: W) -> Result<ParquetWriter<W>, WriteError> {
        let file = SerializedFileWriter::new(out, super::schema(), Arc::new(properties()?))?;
        Ok(ParquetWriter {
            file,
            group: Group::default(),
            rows: 0,
        })
    }

    /// Rows written so far (buffered ones included).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds one row; a row group is written when the open one is full. A refused row adds
    /// nothing. Returns the row's bytes of text before compression (about its CSV line's).
    pub fn push(&mut self, row: &EventRow) -> Result<u64, WriteError> {
        let signed = |what: &str, value: u64| {
            i64::try_from(value).map_err(|_| WriteError::TooLarge {
                id: row.id,
                what: what.to_owned(),
                value,
            })
        };
        let ints = [
            signed("ID", row.id)?,
            signed("Timestamp(ns)", row.ts_ns)?,
            i64::from(row.pid),
            signed("Thread Id", row.tid)?,
        ];
        let (values, owner) = typed_values(row);
        let mut typed = [None; 4];
        for ((slot, value), (_, key)) in typed.iter_mut().zip(values).zip(TYPED_INTS) {
            if let Some(value) = value {
                *slot = Some(i64::try_from(value).map_err(|_| WriteError::TooLarge {
                    id: row.id,
                    what: format!("Attr {key:?}"),
                    value,
                })?);
            }
        }

        let g = &mut self.group;
        for (column, value) in g.ints.iter_mut().zip(ints) {
            column.push(value);
        }
        g.events.push(row.event.as_str());
        g.types.push(row.event_type.as_str());
        let [name, device, ptr, attr, python, c] = &mut g.texts;
        name.push(if row.name.is_empty() {
            b"N/A"
        } else {
            row.name.as_bytes()
        });
        let mut n = itoa::Buffer::new();
        device.push(match row.device {
            DeviceId::None => b"N/A",
            DeviceId::Cpu => b"cpu",
            DeviceId::Cuda(i) => n.format(i).as_bytes(),
        });
        match row.ptr {
            Some(p) => ptr.push(&hex_ptr(p)),
            None => ptr.push(b"N/A"),
        }
        let attr_text = attr_text(row);
        attr.push(attr_text.as_bytes());
        python.push(row.python_stack.as_bytes());
        c.push(row.c_stack.as_bytes());
        for (column, value) in g.typed.iter_mut().zip(typed) {
            column.defs.push(i16::from(value.is_some()));
            column.values.extend(value);
        }
        g.owner.defs.push(i16::from(owner.is_some()));
        if let Some(owner) = &owner {
            g.owner.values.push(owner.as_bytes());
        }
        // The variable-length texts; the short fixed ones are about 40 bytes more.
        let text = row.name.len()
            + attr_text.len()
            + row.python_stack.len()
            + row.c_stack.len()
            + owner.map_or(0, |o| o.len())
            + 40;
        g.text_bytes += text;
        self.rows += 1;
        if g.rows() >= ROW_GROUP_ROWS || g.text_bytes >= ROW_GROUP_BYTES {
            self.write_group()?;
        }
        Ok(text as u64)
    }

    /// Writes the open row group, if it has rows.
    fn write_group(&mut self) -> Result<(), WriteError> {
        if self.group.rows() == 0 {
            return Ok(());
        }
        let g = &mut self.group;
        let mut group = self.file.next_row_group()?;
        for (index, spec) in COLUMNS.iter().enumerate() {
            let mut column = group.next_column()?.ok_or_else(|| {
                parquet::errors::ParquetError::General(format!(
                    "the schema ends before column {:?}",
                    spec.name
                ))
            })?;
            match index {
                // ID, Timestamp(ns), Process Id, Thread Id.
                0 | 4..=6 => {
                    let slot = if index == 0 { 0 } else { index - 3 };
                    let writer = column.typed::<Int64Type>();
                    for chunk in g.ints[slot].chunks(CHUNK) {
                        writer.write_batch(chunk, None, None)?;
                    }
                }
                // Event, Event Type: static names, never copied.
                1 | 2 => {
                    let values = if index == 1 { &g.events } else { &g.types };
                    let writer = column.typed::<ByteArrayType>();
                    for chunk in values.chunks(CHUNK) {
                        let arrays: Vec<ByteArray> = chunk
                            .iter()
                            .map(|s| ByteArray::from(Bytes::from_static(s.as_bytes())))
                            .collect();
                        writer.write_batch(&arrays, None, None)?;
                    }
                }
                // Name, then Device Id, Ptr, Attr and the stacks.
                3 | 7..=11 => {
                    let slot = if index == 3 { 0 } else { index - 6 };
                    let text = &mut g.texts[slot];
                    let bytes = write_text(column.typed::<ByteArrayType>(), text, None)?;
                    column.close()?;
                    text.reclaim(bytes);
                    continue;
                }
                OWNER => {
                    let owner = &mut g.owner;
                    let bytes = write_text(
                        column.typed::<ByteArrayType>(),
                        &mut owner.values,
                        Some(&owner.defs),
                    )?;
                    column.close()?;
                    owner.values.reclaim(bytes);
                    continue;
                }
                // size, allocation_id, used, total.
                _ => {
                    let slot = TYPED_INTS
                        .iter()
                        .position(|(i, _)| *i == index)
                        .unwrap_or(0);
                    let typed = &g.typed[slot];
                    let writer = column.typed::<Int64Type>();
                    let mut values = typed.values.as_slice();
                    for defs in typed.defs.chunks(CHUNK) {
                        let present = defs.iter().filter(|&&d| d > 0).count();
                        let (now, rest) = values.split_at(present);
                        writer.write_batch(now, Some(defs), None)?;
                        values = rest;
                    }
                }
            }
            column.close()?;
        }
        group.close()?;
        g.clear();
        Ok(())
    }

    /// Writes the last row group and the footer; returns the output and the rows written.
    pub fn finish(mut self) -> Result<(W, u64), WriteError> {
        self.write_group()?;
        let rows = self.rows;
        Ok((self.file.into_inner()?, rows))
    }
}

/// One text column's values: its buffer becomes one shared `Bytes` that each value slices
/// (returned, for [`Text::reclaim`]).
fn write_text(
    writer: &mut parquet::column::writer::ColumnWriterImpl<'_, ByteArrayType>,
    text: &mut Text,
    defs: Option<&[i16]>,
) -> Result<Bytes, WriteError> {
    let bytes = Bytes::from(std::mem::take(&mut text.bytes));
    let mut start = 0;
    let mut ends = text.ends.as_slice();
    let mut write = |ends: &[usize], defs: Option<&[i16]>| {
        let arrays: Vec<ByteArray> = ends
            .iter()
            .map(|&end| {
                let value = ByteArray::from(bytes.slice(start..end));
                start = end;
                value
            })
            .collect();
        writer.write_batch(&arrays, defs, None).map(|_| ())
    };
    match defs {
        None => {
            for chunk in ends.chunks(CHUNK) {
                write(chunk, None)?;
            }
        }
        Some(defs) => {
            for defs in defs.chunks(CHUNK) {
                let present = defs.iter().filter(|&&d| d > 0).count();
                let (now, rest) = ends.split_at(present);
                write(now, Some(defs))?;
                ends = rest;
            }
        }
    }
    text.ends.clear();
    Ok(bytes)
}

/// `0x%016x`.
fn hex_ptr(ptr: u64) -> [u8; 18] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [b'0'; 18];
    text[1] = b'x';
    for i in 0..16 {
        text[17 - i] = HEX[((ptr >> (4 * i)) & 0xf) as usize];
    }
    text
}
