//! Call-stack capture inside allocation hooks: DWARF CFI rules cached per return address
//! (framehop), with frame pointers only as the fallback for code without unwind tables.
//!
//! Layer 2 of the runtime (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls only the bottom layer (clock); what else runs during a module
//! scan (the GOT survey, CPython detection) is registered from above as a `ScanPass`.

pub mod capture;
pub mod maps;
mod memo;
pub mod modules;

pub use capture::{capture_deep, with_stack, with_stack_above, CapturedStack, MAX_FRAMES};

/// Records this library's code range, so stack capture can skip the hook's own frames.
pub fn mark_own_code() {
    // A private function: its address is in this library whatever the process interposes.
    fn here() {}
    // Scans the loaded modules if that was not done yet: the unwinder needs them anyway.
    modules::refresh(false);
    let here = here as *const () as u64;
    if let Some(m) = modules::seen_modules()
        .into_iter()
        .find(|m| m.start <= here && here < m.end)
    {
        capture::set_own_code_range(m.start..m.end);
    }
}
