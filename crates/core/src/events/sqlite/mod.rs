//! The SQLite form of the dump: table `memscope_dump`, the CSV's columns.

pub mod read;
pub mod write;
