//! The CSV form of the dump: its writer, the reference reader (one record at a time) and the
//! fast reader (chunks parsed on worker threads).

pub mod read;
pub mod scan;
pub mod write;

pub use write::{push_field, write_row, RowWriter, HEADER};
