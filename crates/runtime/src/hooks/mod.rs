//! The functions the runtime interposes. Each hook: call the real function (after taking the
//! block out of the ledger, for frees), then record, under the reentrancy guard.

// CUDA backend (issue 11).
pub mod cuda;
pub mod dl;
pub mod exec;
pub mod got;
pub mod loader;
pub mod malloc;
mod own_blocks;
pub mod pymem;
