//! Call-stack capture inside allocation hooks: DWARF CFI rules cached per return address
//! (framehop), with frame pointers only as the fallback for code without unwind tables.

pub mod capture;
pub mod maps;
mod memo;
pub mod modules;

pub use capture::{capture_deep, with_stack, with_stack_above, CapturedStack, MAX_FRAMES};
