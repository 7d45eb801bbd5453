//! The message of an NVTX call: from its event attributes (ASCII, UTF-32 `wchar_t`, or a
//! registered string handle) or from the `W` calls' wide-string argument.

use std::mem::size_of;

use libc::{c_char, wchar_t};

use super::handles::{lookup, STRINGS};
use super::{EventAttributes, MESSAGE_ASCII, MESSAGE_REGISTERED, MESSAGE_UNICODE};
use crate::marks::mstx::c_message;

/// Longest wide string read, in characters: a missing terminator stops here.
const MAX_WIDE_CHARS: usize = 1 << 20;

/// Decodes a NUL-terminated UTF-32 `wchar_t` string; invalid code points become U+FFFD.
///
/// # Safety
/// `s` is NULL or a NUL-terminated `wchar_t` string.
pub(super) unsafe fn wide_message(s: *const wchar_t) -> Option<String> {
    if s.is_null() {
        return None;
    }
    let mut out = String::new();
    for i in 0..MAX_WIDE_CHARS {
        // SAFETY: within the string: every element before the terminator is readable.
        let unit = unsafe { *s.add(i) };
        if unit == 0 {
            break;
        }
        out.push(char::from_u32(unit as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    Some(out)
}

/// The message of an event attributes struct; `None` when it has none we can read.
///
/// # Safety
/// `attr` is NULL or points to an `nvtxEventAttributes_t` of at least `attr->size` bytes whose
/// message is what its `messageType` says.
pub unsafe fn attr_message(attr: *const EventAttributes) -> Option<String> {
    if attr.is_null() {
        return None;
    }
    // SAFETY: every attributes struct starts with version and size.
    let size = unsafe { (*attr).size } as usize;
    if size < size_of::<EventAttributes>() {
        return None;
    }
    // SAFETY: the struct is at least as large as ours.
    let (message_type, message) = unsafe { ((*attr).message_type, (*attr).message) };
    match message_type {
        // SAFETY: an ASCII message is a C string.
        MESSAGE_ASCII => unsafe { c_message(message as *const c_char) }.map(|m| m.into_owned()),
        // SAFETY: a Unicode message is a wchar_t string.
        MESSAGE_UNICODE => unsafe { wide_message(message as *const wchar_t) },
        MESSAGE_REGISTERED => lookup(&STRINGS, message).map(str::to_owned),
        _ => None,
    }
}
