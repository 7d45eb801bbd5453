//! msmemscope's runtime library, preloaded into the target process. It holds all in-process
//! state: the allocation hooks, the host-leak window and its ledger, stack capture, and the
//! report written when the window closes.
//!
//! Rules for everything under `hooks/`: no allocation through the hooked allocator (the global
//! allocator below calls glibc's `__libc_*` functions), a per-thread reentrancy guard, ledger
//! removal before the real `free`/`realloc`, and no way to fail loudly.
//!
//! The modules in layers, each calling only the layers below it (crates/core/tests/properties/
//! layers.rs reads the `use crate::` lines; ARCHITECTURE.md draws them):
//! 0. clock, libc_heap, hashing, guard, spare_fd, process;
//! 1. log, private_alloc, raw_thread, forward;
//! 2. unwind; 3. python; 4. sanitizer; 5. pipeline, host_leak;
//! 6. session (the one owner of a run's state); 7. launch; 8. hooks;
//! 9. the adapters, which may call each other: ffi, control, lifecycle, marks.

mod clock;
pub mod control;
pub mod ffi;
pub mod forward;
mod guard;
pub mod hashing;
pub mod hooks;
pub mod host_leak;
// The launched run's beginning, from the launcher's environment.
mod launch;
mod libc_heap;
mod lifecycle;
mod log;
pub mod pipeline;
// The allocating thread's Python frames, for host-leak stacks.
pub mod python;
// Exports `mstxMarkA`, `mstxRangeStartA`, `mstxRangeEnd` (include/msmemscope/mstx.h) and
// `InitializeInjectionNvtx2` (the NVTX injection entry point).
pub mod marks;
mod private_alloc;
mod process;
// The runtime's own threads.
mod raw_thread;
// A descriptor kept for writing the report.
mod spare_fd;
// The one owner of the run state and of configure/start/stop/step/finish.
pub mod session;
// Stream-race sanitizer: sanitizer-op marks and intercepted synchronization calls.
pub mod sanitizer;
pub mod unwind;

#[global_allocator]
static GLOBAL: private_alloc::LibcDirect = private_alloc::LibcDirect;
