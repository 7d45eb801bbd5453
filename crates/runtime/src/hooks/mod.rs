//! The functions the runtime interposes. Each hook: call the real function (after taking the
//! block out of the ledger, for frees), then record, under the reentrancy guard.
//!
//! Layer 8 of the runtime (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls launch and the layers below the session (pipeline, host_leak, sanitizer, python,
//! unwind) and the bottom (guard, forward, process, libc_heap, hashing); never ffi, control,
//! lifecycle or marks.

// CUDA backend (issue 11).
pub mod cuda;
pub mod dl;
pub mod exec;
pub mod got;
pub mod loader;
pub mod malloc;
mod own_blocks;
pub mod pymem;
