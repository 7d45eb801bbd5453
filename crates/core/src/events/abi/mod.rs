//! The C ABI between the Python extension (or any other producer) and the runtime library that
//! owns the event pipeline. Defined once here so both sides compile against the same layout;
//! `ABI_VERSION` changes whenever it does. C and C++ producers include
//! `crates/runtime/include/msmemscope/runtime.h`, which cbindgen generates from these
//! definitions (crates/runtime/tests/c_abi.rs fails when the committed header differs).
//!
//! A producer fills an [`EventRecord`] and calls the runtime's `msmemscope_emit`. Strings are
//! UTF-8 pointer/length pairs valid for the duration of the call; the runtime copies what it
//! keeps. The blocks of an allocator go as a [`BlockRecord`] to `msmemscope_emit_block`: numbers
//! and interned texts, whose Attr column the runtime's writer renders (block.rs). An operator's
//! ATEN_START/ATEN_END row goes to `msmemscope_emit_op` as its event type and its interned name:
//! the row holds the name's address, and the writer reads the text. The runtime adds the timestamp, process and thread ids, the C stack when configured,
//! applies the event/device/step filters, and queues the row for its writer thread.

mod block;

pub use block::{BlockAttrs, BlockRecord, BLOCK_OWNER, BLOCK_TOTAL, BLOCK_USED};

/// Bumped on any change to the structs or functions below.
pub const ABI_VERSION: u32 = 4;

/// `device_kind` values.
pub const DEVICE_NONE: u32 = 0;
pub const DEVICE_CPU: u32 = 1;
pub const DEVICE_CUDA: u32 = 2;

/// Bits of `EventRecord::want_c_stack` (and of `BlockRecord::flags`).
pub const WANT_C_STACK: u32 = 1;
pub const ATTRS_CHECKED: u32 = 2;

/// A borrowed UTF-8 string (`ptr` may be null when `len` is 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StrRef {
    /// `const char *` to C: producers hand over their strings as they are.
    pub ptr: *const std::ffi::c_char,
    pub len: usize,
}

impl StrRef {
    pub const EMPTY: StrRef = StrRef {
        ptr: std::ptr::null(),
        len: 0,
    };

    pub fn new(s: &str) -> StrRef {
        StrRef {
            ptr: s.as_ptr().cast(),
            len: s.len(),
        }
    }

    /// The bytes, unchecked (their reader decides what invalid UTF-8 becomes).
    ///
    /// # Safety
    /// `ptr` must point at `len` bytes valid for `'a` (or be null with `len` 0).
    pub unsafe fn as_bytes<'a>(&self) -> &'a [u8] {
        if self.ptr.is_null() || self.len == 0 {
            return &[];
        }
        // SAFETY: the caller guarantees the bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// # Safety
    /// `ptr` must point at `len` bytes valid for `'a` (or be null with `len` 0).
    pub unsafe fn as_str<'a>(&self) -> &'a str {
        if self.ptr.is_null() || self.len == 0 {
            return "";
        }
        // SAFETY: the caller guarantees the bytes; invalid UTF-8 is replaced, never trusted.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) };
        std::str::from_utf8(bytes).unwrap_or("<invalid utf-8>")
    }
}

/// One event from a producer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventRecord {
    /// The Event column's code (`events::Event` as u32; `enum msmemscope_event` in C).
    pub event: u32,
    /// The Event Type column's code (`events::EventType` as u32; `enum msmemscope_event_type`).
    pub event_type: u32,
    pub name: StrRef,
    /// One of `DEVICE_*`, and the CUDA index for `DEVICE_CUDA`.
    pub device_kind: u32,
    pub device_index: u32,
    pub has_ptr: u32,
    pub ptr: u64,
    /// The Attr column's JSON object text (`{}` or empty for none).
    pub attrs_json: StrRef,
    /// Python frames, innermost first, one per line (`file(line): func`).
    pub python_stack: StrRef,
    /// Bit 0 (`WANT_C_STACK`): the runtime captures the C stack here (when `--call-stack c`
    /// is on). Bit 1 (`ATTRS_CHECKED`): the producer vouches that `attrs_json` is one JSON
    /// object whose counted keys are 64-bit integers, so the runtime skips its own check (a
    /// producer that sets no bit gets the check, as before the bit existed).
    pub want_c_stack: u32,
}
