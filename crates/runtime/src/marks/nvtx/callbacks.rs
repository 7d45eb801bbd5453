//! The callbacks written into NVTX's slots, by callback id. Each one's contract is its NVTX
//! namesake's; each turns its call into a mark or range row.

use libc::{c_char, c_int, c_void, wchar_t};

use super::handles::{domain_name, intern, DOMAINS, STRINGS};
use super::messages::{attr_message, wide_message};
use super::ranges::{pop, push};
use super::{core2_cbid, core_cbid, EventAttributes, Handle};
use crate::marks::mstx::c_message;
use crate::marks::{self, guarded};

pub(super) fn core_callbacks() -> [(usize, *const c_void); 11] {
    use core_cbid::*;
    [
        (MARK_EX, mark_ex as unsafe extern "C" fn(_) as *const c_void),
        (MARK_A, mark_a as unsafe extern "C" fn(_) as *const c_void),
        (MARK_W, mark_w as unsafe extern "C" fn(_) as *const c_void),
        (
            RANGE_START_EX,
            range_start_ex as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            RANGE_START_A,
            range_start_a as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            RANGE_START_W,
            range_start_w as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (RANGE_END, range_end as extern "C" fn(_) as *const c_void),
        (
            RANGE_PUSH_EX,
            range_push_ex as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            RANGE_PUSH_A,
            range_push_a as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            RANGE_PUSH_W,
            range_push_w as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            RANGE_POP,
            range_pop as extern "C" fn() -> _ as *const c_void,
        ),
    ]
}

pub(super) fn core2_callbacks() -> [(usize, *const c_void); 9] {
    use core2_cbid::*;
    [
        (
            DOMAIN_MARK_EX,
            domain_mark_ex as unsafe extern "C" fn(_, _) as *const c_void,
        ),
        (
            DOMAIN_RANGE_START_EX,
            domain_range_start_ex as unsafe extern "C" fn(_, _) -> _ as *const c_void,
        ),
        (
            DOMAIN_RANGE_END,
            domain_range_end as extern "C" fn(_, _) as *const c_void,
        ),
        (
            DOMAIN_RANGE_PUSH_EX,
            domain_range_push_ex as unsafe extern "C" fn(_, _) -> _ as *const c_void,
        ),
        (
            DOMAIN_RANGE_POP,
            domain_range_pop as extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            DOMAIN_REGISTER_STRING_A,
            domain_register_string_a as unsafe extern "C" fn(_, _) -> _ as *const c_void,
        ),
        (
            DOMAIN_REGISTER_STRING_W,
            domain_register_string_w as unsafe extern "C" fn(_, _) -> _ as *const c_void,
        ),
        (
            DOMAIN_CREATE_A,
            domain_create_a as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
        (
            DOMAIN_CREATE_W,
            domain_create_w as unsafe extern "C" fn(_) -> _ as *const c_void,
        ),
    ]
}

fn mark_with(domain: Handle, message: Option<String>) {
    marks::mark(message.as_deref().unwrap_or(""), None, domain_name(domain))
}

fn start_with(domain: Handle, message: Option<String>) -> u64 {
    marks::range_start(message.as_deref().unwrap_or(""), None, domain_name(domain))
}

/// `nvtxMarkEx`
unsafe extern "C" fn mark_ex(attr: *const EventAttributes) {
    guarded((), || {
        // SAFETY: NVTX passes a valid attributes struct (or NULL).
        let message = unsafe { attr_message(attr) };
        mark_with(std::ptr::null(), message)
    })
}

/// `nvtxMarkA`
unsafe extern "C" fn mark_a(message: *const c_char) {
    guarded((), || {
        // SAFETY: NVTX passes a C string (or NULL).
        let message = unsafe { c_message(message) }.map(|m| m.into_owned());
        mark_with(std::ptr::null(), message)
    })
}

/// `nvtxMarkW`
unsafe extern "C" fn mark_w(message: *const wchar_t) {
    guarded((), || {
        // SAFETY: NVTX passes a wide string (or NULL).
        let message = unsafe { wide_message(message) };
        mark_with(std::ptr::null(), message)
    })
}

/// `nvtxRangeStartEx`
unsafe extern "C" fn range_start_ex(attr: *const EventAttributes) -> u64 {
    guarded(0, || {
        // SAFETY: NVTX passes a valid attributes struct (or NULL).
        let message = unsafe { attr_message(attr) };
        start_with(std::ptr::null(), message)
    })
}

/// `nvtxRangeStartA`
unsafe extern "C" fn range_start_a(message: *const c_char) -> u64 {
    guarded(0, || {
        // SAFETY: NVTX passes a C string (or NULL).
        let message = unsafe { c_message(message) }.map(|m| m.into_owned());
        start_with(std::ptr::null(), message)
    })
}

/// `nvtxRangeStartW`
unsafe extern "C" fn range_start_w(message: *const wchar_t) -> u64 {
    guarded(0, || {
        // SAFETY: NVTX passes a wide string (or NULL).
        let message = unsafe { wide_message(message) };
        start_with(std::ptr::null(), message)
    })
}

/// `nvtxRangeEnd`
extern "C" fn range_end(id: u64) {
    guarded((), || {
        marks::range_end(id);
    })
}

/// `nvtxRangePushEx`
unsafe extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    guarded(-1, || {
        // SAFETY: NVTX passes a valid attributes struct (or NULL).
        let message = unsafe { attr_message(attr) };
        push(std::ptr::null(), message)
    })
}

/// `nvtxRangePushA`
unsafe extern "C" fn range_push_a(message: *const c_char) -> c_int {
    guarded(-1, || {
        // SAFETY: NVTX passes a C string (or NULL).
        let message = unsafe { c_message(message) }.map(|m| m.into_owned());
        push(std::ptr::null(), message)
    })
}

/// `nvtxRangePushW`
unsafe extern "C" fn range_push_w(message: *const wchar_t) -> c_int {
    guarded(-1, || {
        // SAFETY: NVTX passes a wide string (or NULL).
        let message = unsafe { wide_message(message) };
        push(std::ptr::null(), message)
    })
}

/// `nvtxRangePop`
extern "C" fn range_pop() -> c_int {
    guarded(-1, || pop(std::ptr::null()))
}

/// `nvtxDomainMarkEx`
unsafe extern "C" fn domain_mark_ex(domain: Handle, attr: *const EventAttributes) {
    guarded((), || {
        // SAFETY: NVTX passes a valid attributes struct (or NULL).
        let message = unsafe { attr_message(attr) };
        mark_with(domain, message)
    })
}

/// `nvtxDomainRangeStartEx`
unsafe extern "C" fn domain_range_start_ex(domain: Handle, attr: *const EventAttributes) -> u64 {
    guarded(0, || {
        // SAFETY: NVTX passes a valid attributes struct (or NULL).
        let message = unsafe { attr_message(attr) };
        start_with(domain, message)
    })
}

/// `nvtxDomainRangeEnd`
extern "C" fn domain_range_end(_domain: Handle, id: u64) {
    guarded((), || {
        marks::range_end(id);
    })
}

/// `nvtxDomainRangePushEx`
unsafe extern "C" fn domain_range_push_ex(domain: Handle, attr: *const EventAttributes) -> c_int {
    guarded(-1, || {
        // SAFETY: NVTX passes a valid attributes struct (or NULL).
        let message = unsafe { attr_message(attr) };
        push(domain, message)
    })
}

/// `nvtxDomainRangePop`
extern "C" fn domain_range_pop(domain: Handle) -> c_int {
    guarded(-1, || pop(domain))
}

/// `nvtxDomainRegisterStringA`: an interned handle (the same text gives the same handle).
pub(super) unsafe extern "C" fn domain_register_string_a(
    _domain: Handle,
    text: *const c_char,
) -> Handle {
    guarded(std::ptr::null(), || {
        // SAFETY: NVTX passes a C string (or NULL).
        match unsafe { c_message(text) } {
            Some(text) => intern(&STRINGS, text.into_owned()),
            None => std::ptr::null(),
        }
    })
}

/// `nvtxDomainRegisterStringW`
unsafe extern "C" fn domain_register_string_w(_domain: Handle, text: *const wchar_t) -> Handle {
    guarded(std::ptr::null(), || {
        // SAFETY: NVTX passes a wide string (or NULL).
        match unsafe { wide_message(text) } {
            Some(text) => intern(&STRINGS, text),
            None => std::ptr::null(),
        }
    })
}

/// `nvtxDomainCreateA`: a non-NULL handle naming the domain (interned by name).
unsafe extern "C" fn domain_create_a(name: *const c_char) -> Handle {
    guarded(std::ptr::null(), || {
        // SAFETY: NVTX passes a C string (or NULL).
        let name = unsafe { c_message(name) }.map(|n| n.into_owned());
        intern(&DOMAINS, name.unwrap_or_default())
    })
}

/// `nvtxDomainCreateW`
unsafe extern "C" fn domain_create_w(name: *const wchar_t) -> Handle {
    guarded(std::ptr::null(), || {
        // SAFETY: NVTX passes a wide string (or NULL).
        let name = unsafe { wide_message(name) };
        intern(&DOMAINS, name.unwrap_or_default())
    })
}
