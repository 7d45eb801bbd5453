//! The CUDA backend (docs/output-files.md#event-types): device allocations as HAL MALLOC/FREE rows,
//! kernel launches as KERNEL_LAUNCH rows, failed allocations as OOM triggers, and stream/event
//! synchronization for the race checker. No CUDA header is needed: the few types and constants are
//! declared here.
//!
//! How calls reach the hooks (a program may use any of these paths, several at once):
//! - direct linking: the runtime library exports the hooked names (`cuMemAlloc_v2`,
//!   `cudaMalloc`, ...); being preloaded, it comes first in the global lookup scope;
//! - `dlopen` + `dlsym` of libcuda/libcudart: `dlsym` itself is interposed ([`dlsym`]) and hands
//!   out a wrapper in place of a hooked function;
//! - `cuGetProcAddress` (how cudart, and so PyTorch, reaches the driver): the function is hooked
//!   like any other and wraps the entry points it returns ([`procaddr`]).
//!
//! A wrapper is one of a few instances of the hook, each bound to one real function pointer
//! ([`hook::Hook`]), because the driver hands out different functions under one name
//! (per-thread default stream variants). When the runtime API calls the driver on our behalf
//! the driver-level hooks stay quiet ([`RuntimeCall`]), so a `cudaMalloc` is one row, not two.
//!
//! Nothing is recorded unless the pipeline traces: otherwise every hook is the real call plus
//! one atomic load. A program that never loads a CUDA library never reaches these hooks, and a
//! `dlsym(RTLD_DEFAULT, ...)` probe for a hooked name answers as if we were absent.

mod dlsym;
mod hook;
mod launch;
mod memory;
mod procaddr;
mod record;
mod resolve;
mod sync;

use std::cell::Cell;

/// `CUresult` and `cudaError_t` (both C enums).
pub type CuResult = i32;
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY` and `cudaErrorMemoryAllocation` share the value.
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED` / `cudaErrorInitializationError`: what a hook answers when the
/// real function cannot be found (no driver in the process).
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;

/// Which API layer a hook belongs to: it decides where the real functions are looked up and how
/// the current device is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// libcuda (`cu*`).
    Driver,
    /// libcudart (`cuda*`).
    Runtime,
}

thread_local! {
    static RUNTIME_CALLS: Cell<u32> = const { Cell::new(0) };
}

/// Held while a runtime-API hook runs the real function: the driver calls cudart makes for it
/// are the same event and are not recorded again.
pub struct RuntimeCall(());

impl RuntimeCall {
    pub fn enter() -> RuntimeCall {
        let _ = RUNTIME_CALLS.try_with(|n| n.set(n.get() + 1));
        RuntimeCall(())
    }

    /// Whether this thread is inside a runtime-API call we hooked.
    pub fn active() -> bool {
        RUNTIME_CALLS.try_with(|n| n.get() > 0).unwrap_or(false)
    }
}

impl Drop for RuntimeCall {
    fn drop(&mut self) {
        let _ = RUNTIME_CALLS.try_with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// Whether a hook of `layer` records its call (the real call happens either way).
#[inline]
pub fn records(layer: Layer) -> bool {
    crate::pipeline::is_tracing() && !(layer == Layer::Driver && RuntimeCall::active())
}
