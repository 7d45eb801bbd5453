//! Host heap leak detection: the window, its sharded ledger, and the report at close.
//!
//! Layer 5 of the runtime (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls python, unwind and the bottom layers; the session opens and closes windows.

pub mod aggregate;
pub mod beats;
pub mod block_map;
pub mod block_table;
pub mod frame_trie;
mod key_index;
pub mod ledger;
pub mod overflow;
mod sampled_set;
pub mod settings;
mod spin_lock;
pub mod stack_table;
pub mod striped;
pub mod window;
mod zeroed_array;
