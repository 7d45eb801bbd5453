//! The integration tests of `msmemscope-core`, one test binary (`cargo test -p msmemscope-core
//! --test properties`; a module's name filters its tests, e.g. `--test properties reader_fuzz`).
//! One module a subject, their shared helpers in `util`:
//! - `control_frame_fuzz`: the attach channel's frames, any bytes from either side.
//! - `layers`: the layers of `core/src/events` and `runtime/src`, read from the source.
//! - `original_dialect`: dumps in the original msMemScope's dialect read and analyse as ours
//!   (its saved failure cases in `original_dialect.proptest-regressions`, beside it).
//! - `parquet_fuzz`: the Parquet dump against the CSV reader, and damaged Parquet files.
//! - `reader_differential`: the fast CSV reader against the reference reader.
//! - `reader_fuzz`: the dump readers on any CSV bytes, Attr JSON and SQLite file.

mod util;

mod control_frame_fuzz;
mod layers;
mod original_dialect;
mod parquet_fuzz;
mod reader_differential;
mod reader_fuzz;
