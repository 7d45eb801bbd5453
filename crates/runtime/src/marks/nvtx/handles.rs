//! Domain and registered-string handles: leaked C strings of ours, interned by text, and
//! looked up in a table before they are read, so that a handle we did not hand out is never
//! dereferenced.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::Mutex;

use super::Handle;
use crate::marks::lock;

/// Leaked C strings handed out as opaque handles, interned by text.
pub(super) struct Interned {
    by_text: HashMap<String, usize>,
    by_handle: HashMap<usize, &'static str>,
}

/// Bound on each table: a program registering unbounded distinct strings gets NULL handles
/// (its messages then read as absent) instead of growing our memory without end.
const MAX_INTERNED: usize = 1 << 16;

pub(super) static STRINGS: Mutex<Option<Interned>> = Mutex::new(None);
pub(super) static DOMAINS: Mutex<Option<Interned>> = Mutex::new(None);

pub(super) fn intern(table: &Mutex<Option<Interned>>, text: String) -> Handle {
    let mut guard = lock(table);
    let t = guard.get_or_insert_with(|| Interned {
        by_text: HashMap::new(),
        by_handle: HashMap::new(),
    });
    if let Some(&handle) = t.by_text.get(&text) {
        return handle as Handle;
    }
    if t.by_handle.len() >= MAX_INTERNED {
        return std::ptr::null();
    }
    let Ok(c) = CString::new(text.clone()) else {
        return std::ptr::null();
    };
    let c: &'static CStr = Box::leak(c.into_boxed_c_str());
    let handle = c.as_ptr() as usize;
    // `text` is a String and has no NUL, so the C string is the same UTF-8.
    let view = c.to_str().unwrap_or("");
    t.by_text.insert(text, handle);
    t.by_handle.insert(handle, view);
    handle as Handle
}

pub(super) fn lookup(table: &Mutex<Option<Interned>>, handle: Handle) -> Option<&'static str> {
    if handle.is_null() {
        return None;
    }
    lock(table)
        .as_ref()
        .and_then(|t| t.by_handle.get(&(handle as usize)).copied())
}

/// The name of a domain we created; `None` for the default (NULL) domain or an unknown handle.
pub(super) fn domain_name(domain: Handle) -> Option<&'static str> {
    lookup(&DOMAINS, domain)
}
