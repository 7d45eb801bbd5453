//! Memory block watch (docs/analyses.md#watch): the checksum the watch dumps record before and
//! after every op of the watched range. The Python side (`msmemscope.watcher`, `watch/state.py`)
//! decides what and when; the extension applies [`crc64`] to a block's memory in place.

pub mod crc64;
