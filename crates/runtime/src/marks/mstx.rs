//! The MSTX-compatible C API (declared in `include/msmemscope/mstx.h`): `mstxMarkA`,
//! `mstxRangeStartA`, `mstxRangeEnd`. A NULL message is ignored (`mstxRangeStartA` then returns
//! 0, which `mstxRangeEnd` ignores); a message that is not UTF-8 is decoded lossily.
//!
//! Each function has the contract of its MSTX namesake: `message` is NULL or a NUL-terminated
//! string readable for the duration of the call; `stream` is opaque and only recorded.
#![allow(non_snake_case)]

use std::borrow::Cow;
use std::ffi::CStr;

use libc::{c_char, c_void};

use super::guarded;

/// The message of a C caller, or `None` for NULL.
///
/// # Safety
/// `message` is NULL or points to a NUL-terminated string that stays valid while the result
/// is used.
pub(crate) unsafe fn c_message<'a>(message: *const c_char) -> Option<Cow<'a, str>> {
    if message.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated and alive by the caller's contract.
    Some(unsafe { CStr::from_ptr(message) }.to_string_lossy())
}

fn stream_of(stream: *mut c_void) -> Option<u64> {
    (!stream.is_null()).then_some(stream as u64)
}

/// `void mstxMarkA(const char *message, void *stream)`
///
/// # Safety
/// As MSTX's `mstxMarkA`: `message` is NULL or a NUL-terminated string readable for the call.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mstxMarkA(message: *const c_char, stream: *mut c_void) {
    guarded((), || {
        // SAFETY: the caller passes NULL or a C string valid for this call.
        if let Some(message) = unsafe { c_message(message) } {
            super::mark(&message, stream_of(stream), None);
        }
    })
}

/// `uint64_t mstxRangeStartA(const char *message, void *stream)`: the range's id (never 0),
/// or 0 when nothing was recorded (NULL message).
///
/// # Safety
/// As MSTX's `mstxRangeStartA`: `message` is NULL or a NUL-terminated string readable for the
/// call.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mstxRangeStartA(message: *const c_char, stream: *mut c_void) -> u64 {
    guarded(0, || {
        // SAFETY: the caller passes NULL or a C string valid for this call.
        match unsafe { c_message(message) } {
            Some(message) => super::range_start(&message, stream_of(stream), None),
            None => 0,
        }
    })
}

/// `void mstxRangeEnd(uint64_t id)`; an id that is 0, unknown or already ended is ignored.
///
/// # Safety
/// None beyond MSTX's: any id is accepted (the function is `unsafe` only for the C ABI's sake).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mstxRangeEnd(id: u64) {
    if id == 0 {
        return;
    }
    guarded((), || {
        super::range_end(id);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marks::sink;
    use msmemscope_core::events::EventType;

    #[test]
    fn c_api_rows() {
        sink::take();
        let stream = 0xabc0usize as *mut c_void;
        // SAFETY: C string literals and NULL, as the C API allows.
        unsafe {
            mstxMarkA(c"epoch begin".as_ptr(), std::ptr::null_mut());
            mstxMarkA(std::ptr::null(), stream);
            assert_eq!(mstxRangeStartA(std::ptr::null(), stream), 0);
            let id = mstxRangeStartA(c"load \xff data".as_ptr(), stream);
            assert_ne!(id, 0);
            mstxRangeEnd(0);
            mstxRangeEnd(id);
            mstxRangeEnd(id);
        }
        let rows = sink::take();
        let seen: Vec<_> = rows
            .iter()
            .map(|r| (r.event_type, r.name.as_str(), r.attr_str("stream")))
            .collect();
        assert_eq!(
            seen,
            vec![
                (EventType::Mark, "epoch begin", None),
                (
                    EventType::RangeStart,
                    "load \u{fffd} data",
                    Some("0x000000000000abc0")
                ),
                (EventType::RangeEnd, "load \u{fffd} data", None),
            ]
        );
        assert_eq!(rows[1].attr_u64("range_id"), rows[2].attr_u64("range_id"));
    }
}
