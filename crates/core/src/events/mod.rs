//! The event stream every analysis except host-leaks reads: tensor allocations and frees,
//! operator launches, reads and writes, marks and steps (docs/output-files.md#event-dump). One row
//! type, written by the sinks and read back by the offline analyses.
//!
//! Layers, each importing only from those above it in this list
//! (`crates/core/tests/properties/layers.rs` checks it, test modules included):
//! - `attrs/`: Attr keys, the Attr check (with `flat_json.rs`, its one-pass accept of plain
//!   objects) and number parsing;
//! - `row.rs`: the row and its columns;
//! - `source.rs`: errors, the row source, regular-file opening, ID order; beside it `abi/`,
//!   the producers' C ABI (a block row's Attr rendered into a row);
//! - `parts.rs`: the names of a dump's files (the head, a bounded run's step parts and
//!   summary) and what a bounded dump covers; `run_end.rs`: how the run that wrote a dump
//!   ended when it ended early (a failed write, a kill) and what is missing;
//! - `fields.rs`: a row from its 12 columns as text;
//! - the formats, a folder each with its reader and writer: `csv/` (`read.rs`, `write.rs`,
//!   `scan/` the fast reader), `sqlite/` (`read.rs`, `write.rs`), `parquet/` (reader, schema,
//!   writer);
//! - `original/`: the original msMemScope's dumps, rewritten as ours;
//! - `reader.rs`, the dispatcher every consumer opens a dump through (`open`, `open_rows`),
//!   and `parquet/export.rs`, which turns any dump into a Parquet file.

pub mod abi;
pub mod attrs;
pub mod csv;
pub mod fields;
pub mod original;
pub mod parquet;
pub mod parts;
pub mod reader;
pub mod row;
pub mod run_end;
pub mod source;
pub mod sqlite;

pub use row::{Attrs, DeviceId, Event, EventRow, EventType};
