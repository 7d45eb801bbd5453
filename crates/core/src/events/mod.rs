//! The event stream every analysis except host-leaks reads: tensor allocations and frees,
//! operator launches, reads and writes, marks and steps (SPEC §6). One row type, written by
//! the sinks and read back by the offline analyses.

pub mod abi;
pub mod csv;
pub mod db;
mod flat_json;
pub mod original;
pub mod parquet;
pub mod reader;
pub mod row;
pub mod scan;

pub use row::{Attrs, DeviceId, Event, EventRow, EventType};
