//! The commands that read existing dumps (`--compare`, `report DIR`, `export DIR`). Some tests
//! launch a run first to have one.

mod compare;
mod hostile_run_files;
mod original_dumps;
mod parquet;
mod report;
mod unusable_dumps;
