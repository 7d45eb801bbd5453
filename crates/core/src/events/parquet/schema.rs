//! The Parquet dump's schema, fixed (SQL is written against it): the CSV's 12 columns, then
//! the typed copies of Attr values; and how a file's columns are checked against it.

use std::sync::Arc;

use parquet::basic::{ConvertedType, LogicalType, Repetition, Type as PhysicalType};
use parquet::schema::types::{ColumnDescriptor, Type, TypePtr};

/// A column's Parquet type: both are flat (no repetition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `INT64`, signed (Spark reads unsigned 64-bit columns only with a cast).
    Int64,
    /// `BYTE_ARRAY` annotated `STRING` (converted type `UTF8`).
    Text,
}

/// One column of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    /// `REQUIRED` when true, else `OPTIONAL` (null where a row's Attr lacks the key).
    pub required: bool,
}

const fn col(name: &'static str, kind: Kind, required: bool) -> Column {
    Column {
        name,
        kind,
        required,
    }
}

/// The schema, in order: the CSV's 12 columns (required), then the typed Attr values
/// (optional). Fixed: SQL is written against these names and types.
pub const COLUMNS: [Column; 17] = [
    col("ID", Kind::Int64, true),
    col("Event", Kind::Text, true),
    col("Event Type", Kind::Text, true),
    col("Name", Kind::Text, true),
    col("Timestamp(ns)", Kind::Int64, true),
    col("Process Id", Kind::Int64, true),
    col("Thread Id", Kind::Int64, true),
    col("Device Id", Kind::Text, true),
    col("Ptr", Kind::Text, true),
    col("Attr", Kind::Text, true),
    col("Call Stack(Python)", Kind::Text, true),
    col("Call Stack(C)", Kind::Text, true),
    col("size", Kind::Int64, false),
    col("allocation_id", Kind::Int64, false),
    col("owner", Kind::Text, false),
    col("used", Kind::Int64, false),
    col("total", Kind::Int64, false),
];

/// The columns the CSV has: every reader needs these; the typed ones after them are copies.
pub(super) const DUMP_COLUMNS: usize = 12;

/// The integer Attr keys with a column of their own, by column index.
pub(super) const TYPED_INTS: [(usize, &str); 4] = [
    (12, "size"),
    (13, "allocation_id"),
    (15, "used"),
    (16, "total"),
];
/// The `owner` column's index.
pub(super) const OWNER: usize = 14;

/// The message type `memscope_dump` of [`COLUMNS`].
pub fn schema() -> TypePtr {
    let fields = COLUMNS
        .iter()
        .map(|c| {
            let repetition = if c.required {
                Repetition::REQUIRED
            } else {
                Repetition::OPTIONAL
            };
            let builder = match c.kind {
                Kind::Int64 => Type::primitive_type_builder(c.name, PhysicalType::INT64),
                Kind::Text => Type::primitive_type_builder(c.name, PhysicalType::BYTE_ARRAY)
                    .with_logical_type(Some(LogicalType::String))
                    .with_converted_type(ConvertedType::UTF8),
            };
            Arc::new(
                builder
                    .with_repetition(repetition)
                    .build()
                    .expect("a fixed, valid primitive type"),
            )
        })
        .collect();
    Arc::new(
        Type::group_type_builder("memscope_dump")
            .with_fields(fields)
            .build()
            .expect("a fixed, valid group type"),
    )
}

/// Why a file's column `index` is not the schema's, or `None` when it is. Another engine may
/// have rewritten the file (DuckDB writes every column OPTIONAL), so repetition is not checked:
/// a null in a CSV column is refused row by row.
pub(super) fn column_mismatch(index: usize, found: &ColumnDescriptor) -> Option<String> {
    let want = COLUMNS[index];
    if found.name() != want.name {
        return Some(format!(
            "column {} is {:?}, expected {:?}",
            index + 1,
            found.name(),
            want.name
        ));
    }
    let kind = match found.physical_type() {
        PhysicalType::INT64 => Some(Kind::Int64),
        PhysicalType::BYTE_ARRAY
            if matches!(found.logical_type_ref(), Some(LogicalType::String))
                || found.converted_type() == ConvertedType::UTF8 =>
        {
            Some(Kind::Text)
        }
        _ => None,
    };
    let nested = found.max_rep_level() != 0 || found.path().parts().len() != 1;
    if kind != Some(want.kind) || nested {
        let wanted = match want.kind {
            Kind::Int64 => "INT64",
            Kind::Text => "a STRING (UTF8) BYTE_ARRAY",
        };
        return Some(format!("column {:?} is not {wanted}", want.name));
    }
    None
}
