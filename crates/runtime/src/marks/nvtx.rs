//! NVTX injection: this library is an NVTX v3 tool. Each library annotated with NVTX (the `nvtx`
//! PyPI package, `torch.cuda.nvtx`, any C/C++ code using the NVTX headers) initializes lazily on
//! its first NVTX call: it finds `InitializeInjectionNvtx2` (as a global symbol, this library
//! being preloaded, or through `NVTX_INJECTION64_PATH`, which the launcher sets) and calls it
//! with its `getExportTable`. We ask for the callbacks table (export table 1), fetch the CORE (1)
//! and CORE2 (5, domains) module tables and write our function pointers into their slots; a slot
//! left alone becomes a no-op in the caller.
//!
//! A module table is an array of pointers to the caller's function-pointer variables, indexed
//! by callback id; slot 0 is reserved and `size` is the highest id + 1 (the array holds one more
//! entry, a NULL terminator). So installing callback `i` is `*table[i] = f`, for `0 < i < size`
//! and `table[i]` non-NULL.
//!
//! What becomes a row (see `marks/mod.rs` for the formats): marks -> `Mark`; start/end and
//! push/pop ranges -> `Range_start`/`Range_end`. Push/pop ranges are kept per thread and per
//! domain, as NVTX defines them; start/end ranges may end on any thread. Messages come from
//! `nvtxEventAttributes_t` (ASCII, UTF-32 `wchar_t`, or a string handle registered with
//! `nvtxDomainRegisterString{A,W}`), or from the `A`/`W` calls' argument. Domain and string
//! handles are interned, leaked C strings of ours, looked up in a table before they are read,
//! so a handle we did not hand out is never dereferenced.
#![allow(non_snake_case)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::mem::{offset_of, size_of};
use std::sync::Mutex;

use libc::{c_char, c_int, c_uint, c_void, wchar_t};

use super::mstx::c_message;
use super::{emit_range_end, emit_range_start, guarded, lock, next_range_id};

// ------------------------------------------------------------------------------------------
// The NVTX ABI

/// `NVTX_ETID_CALLBACKS`.
const EXPORT_TABLE_CALLBACKS: u32 = 1;
/// `NVTX_CB_MODULE_CORE`.
const MODULE_CORE: c_int = 1;
/// `NVTX_CB_MODULE_CORE2` (the domain API).
const MODULE_CORE2: c_int = 5;

mod core_cbid {
    pub const MARK_EX: usize = 1;
    pub const MARK_A: usize = 2;
    pub const MARK_W: usize = 3;
    pub const RANGE_START_EX: usize = 4;
    pub const RANGE_START_A: usize = 5;
    pub const RANGE_START_W: usize = 6;
    pub const RANGE_END: usize = 7;
    pub const RANGE_PUSH_EX: usize = 8;
    pub const RANGE_PUSH_A: usize = 9;
    pub const RANGE_PUSH_W: usize = 10;
    pub const RANGE_POP: usize = 11;
}

mod core2_cbid {
    pub const DOMAIN_MARK_EX: usize = 1;
    pub const DOMAIN_RANGE_START_EX: usize = 2;
    pub const DOMAIN_RANGE_END: usize = 3;
    pub const DOMAIN_RANGE_PUSH_EX: usize = 4;
    pub const DOMAIN_RANGE_POP: usize = 5;
    pub const DOMAIN_REGISTER_STRING_A: usize = 10;
    pub const DOMAIN_REGISTER_STRING_W: usize = 11;
    pub const DOMAIN_CREATE_A: usize = 12;
    pub const DOMAIN_CREATE_W: usize = 13;
}

/// `nvtxMessageType_t`.
const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

/// A slot: the caller's function-pointer variable.
type Slot = *mut *const c_void;
type GetModuleFunctionTable =
    unsafe extern "C" fn(module: c_int, out_table: *mut *mut Slot, out_size: *mut c_uint) -> c_int;
type GetExportTable = unsafe extern "C" fn(export_table_id: u32) -> *const c_void;

/// `nvtxEventAttributes_t` (version 2 and 3).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventAttributes {
    pub version: u16,
    pub size: u16,
    pub category: u32,
    pub color_type: i32,
    pub color: u32,
    pub payload_type: i32,
    pub reserved0: i32,
    pub payload: u64,
    pub message_type: i32,
    /// `const char*`, `const wchar_t*` or `nvtxStringHandle_t`, by `message_type`.
    pub message: *const c_void,
}

const _: () = assert!(size_of::<EventAttributes>() == 48);
const _: () = assert!(offset_of!(EventAttributes, message_type) == 32);
const _: () = assert!(offset_of!(EventAttributes, message) == 40);

/// `nvtxDomainHandle_t` / `nvtxStringHandle_t`: opaque to the caller.
type Handle = *const c_void;

// ------------------------------------------------------------------------------------------
// Initialization

/// `int InitializeInjectionNvtx2(const void *(*getExportTable)(uint32_t))`: installs our
/// callbacks into the calling NVTX instance. 1 on success; 0 (NVTX stays off in that library)
/// when neither module table could be had.
///
/// # Safety
/// As NVTX's injection entry point: `get_export_table` is null or NVTX's own export-table
/// query, whose tables stay valid for the process's life.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn InitializeInjectionNvtx2(
    get_export_table: Option<GetExportTable>,
) -> c_int {
    guarded(0, || {
        let Some(get_export_table) = get_export_table else {
            return 0;
        };
        // SAFETY: NVTX's own export-table query, called as its protocol says.
        let table =
            unsafe { get_export_table(EXPORT_TABLE_CALLBACKS) } as *const ExportTableCallbacks;
        if table.is_null() {
            return 0;
        }
        // SAFETY: a non-null callbacks table starts with its size; the second field is read only
        // when the size says it is there.
        let get_module = unsafe {
            if (*table).struct_size < size_of::<ExportTableCallbacks>() {
                return 0;
            }
            (*table).get_module_function_table
        };
        let Some(get_module) = get_module else {
            return 0;
        };
        // SAFETY: `get_module` is NVTX's module-table query; the tables it returns are its own
        // function-pointer variables, which it asks the tool to fill.
        let core = unsafe { install(get_module, MODULE_CORE, &core_callbacks()) };
        // SAFETY: as above.
        let core2 = unsafe { install(get_module, MODULE_CORE2, &core2_callbacks()) };
        c_int::from(core || core2)
    })
}

fn core_callbacks() -> [(usize, *const c_void); 11] {
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

fn core2_callbacks() -> [(usize, *const c_void); 9] {
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

/// Writes `callbacks` into module `module`'s slots; `false` when the module has no table.
///
/// # Safety
/// `get_module` follows NVTX's `GetModuleFunctionTable` contract.
unsafe fn install(
    get_module: GetModuleFunctionTable,
    module: c_int,
    callbacks: &[(usize, *const c_void)],
) -> bool {
    let mut table: *mut Slot = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: valid out-pointers, per the contract.
    if unsafe { get_module(module, &mut table, &mut size) } == 0 || table.is_null() {
        return false;
    }
    for &(id, f) in callbacks {
        if id == 0 || id >= size as usize {
            continue; // an older NVTX without this callback
        }
        // SAFETY: `table` holds `size` entries (plus a terminator); entry `id` is NULL or the
        // address of the caller's function-pointer variable for callback `id`.
        unsafe {
            let slot = *table.add(id);
            if !slot.is_null() {
                *slot = f;
            }
        }
    }
    true
}

// ------------------------------------------------------------------------------------------
// Interned handles: registered strings and domains

/// Leaked C strings handed out as opaque handles, interned by text.
struct Interned {
    by_text: HashMap<String, usize>,
    by_handle: HashMap<usize, &'static str>,
}

/// Bound on each table: a program registering unbounded distinct strings gets NULL handles
/// (its messages then read as absent) instead of growing our memory without end.
const MAX_INTERNED: usize = 1 << 16;

static STRINGS: Mutex<Option<Interned>> = Mutex::new(None);
static DOMAINS: Mutex<Option<Interned>> = Mutex::new(None);

fn intern(table: &Mutex<Option<Interned>>, text: String) -> Handle {
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

fn lookup(table: &Mutex<Option<Interned>>, handle: Handle) -> Option<&'static str> {
    if handle.is_null() {
        return None;
    }
    lock(table)
        .as_ref()
        .and_then(|t| t.by_handle.get(&(handle as usize)).copied())
}

/// The name of a domain we created; `None` for the default (NULL) domain or an unknown handle.
fn domain_name(domain: Handle) -> Option<&'static str> {
    lookup(&DOMAINS, domain)
}

// ------------------------------------------------------------------------------------------
// Messages

/// Longest wide string read, in characters: a missing terminator stops here.
const MAX_WIDE_CHARS: usize = 1 << 20;

/// Decodes a NUL-terminated UTF-32 `wchar_t` string; invalid code points become U+FFFD.
///
/// # Safety
/// `s` is NULL or a NUL-terminated `wchar_t` string.
unsafe fn wide_message(s: *const wchar_t) -> Option<String> {
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

// ------------------------------------------------------------------------------------------
// Push/pop ranges: per thread, per domain

struct Pushed {
    domain: usize,
    id: u64,
    message: String,
}

thread_local! {
    static PUSHED: RefCell<Vec<Pushed>> = const { RefCell::new(Vec::new()) };
}

/// Pushes a range; returns its depth in its domain on this thread (0 for the outermost), or a
/// negative value when the thread is exiting.
fn push(domain: Handle, message: Option<String>) -> c_int {
    let id = next_range_id();
    let message = message.unwrap_or_default();
    let depth = PUSHED.try_with(|s| {
        let mut s = s.borrow_mut();
        let depth = s.iter().filter(|p| p.domain == domain as usize).count();
        s.push(Pushed {
            domain: domain as usize,
            id,
            message: message.clone(),
        });
        depth
    });
    let Ok(depth) = depth else { return -1 };
    emit_range_start(id, &message, None, domain_name(domain));
    c_int::try_from(depth).unwrap_or(c_int::MAX)
}

/// Pops this thread's innermost range of `domain`; returns its depth, or -1 when there is none.
fn pop(domain: Handle) -> c_int {
    let popped = PUSHED.try_with(|s| {
        let mut s = s.borrow_mut();
        let i = s.iter().rposition(|p| p.domain == domain as usize)?;
        let p = s.remove(i);
        let depth = s[..i]
            .iter()
            .filter(|q| q.domain == domain as usize)
            .count();
        Some((p, depth))
    });
    let Ok(Some((p, depth))) = popped else {
        return -1;
    };
    emit_range_end(p.id, &p.message, domain_name(domain));
    c_int::try_from(depth).unwrap_or(c_int::MAX)
}

// ------------------------------------------------------------------------------------------
// The callbacks. Each one's contract is its NVTX namesake's.

fn mark_with(domain: Handle, message: Option<String>) {
    super::mark(message.as_deref().unwrap_or(""), None, domain_name(domain))
}

fn start_with(domain: Handle, message: Option<String>) -> u64 {
    super::range_start(message.as_deref().unwrap_or(""), None, domain_name(domain))
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
        super::range_end(id);
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
        super::range_end(id);
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
unsafe extern "C" fn domain_register_string_a(_domain: Handle, text: *const c_char) -> Handle {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marks::sink;
    use msmemscope_core::events::EventType;

    fn attrs(message_type: i32, message: *const c_void) -> EventAttributes {
        EventAttributes {
            version: 3,
            size: size_of::<EventAttributes>() as u16,
            category: 0,
            color_type: 1,
            color: 0xff00ff00,
            payload_type: 0,
            reserved0: 0,
            payload: 0,
            message_type,
            message,
        }
    }

    fn wide(s: &str) -> Vec<wchar_t> {
        s.chars().map(|c| c as wchar_t).chain([0]).collect()
    }

    #[test]
    fn decodes_ascii_unicode_and_registered_messages() {
        let ascii = attrs(MESSAGE_ASCII, c"hello".as_ptr().cast());
        let w = wide("héllo ✓ 𝄞");
        let unicode = attrs(MESSAGE_UNICODE, w.as_ptr().cast());
        // SAFETY: NULL domain and a C string literal, as NVTX passes them.
        let handle = unsafe { domain_register_string_a(std::ptr::null(), c"region".as_ptr()) };
        assert!(!handle.is_null());
        // SAFETY: as above; the same text gives the same handle.
        let again = unsafe { domain_register_string_a(std::ptr::null(), c"region".as_ptr()) };
        assert_eq!(handle, again);
        let registered = attrs(MESSAGE_REGISTERED, handle);
        // SAFETY: the structs above are complete and their messages what their types say.
        unsafe {
            assert_eq!(attr_message(&ascii).as_deref(), Some("hello"));
            assert_eq!(attr_message(&unicode).as_deref(), Some("héllo ✓ 𝄞"));
            assert_eq!(attr_message(&registered).as_deref(), Some("region"));
        }
    }

    #[test]
    fn unreadable_messages_are_absent() {
        let bogus = 0x10usize as *const c_void;
        let invalid_wide: Vec<wchar_t> = vec![0x41, 0xD800, 0x110000, 0];
        let mut short = attrs(MESSAGE_ASCII, c"x".as_ptr().cast());
        short.size = 32;
        // SAFETY: every struct is complete; the bogus pointer is only looked up, never read.
        unsafe {
            assert_eq!(attr_message(std::ptr::null()), None);
            assert_eq!(attr_message(&attrs(0, bogus)), None);
            assert_eq!(attr_message(&attrs(MESSAGE_REGISTERED, bogus)), None);
            assert_eq!(attr_message(&attrs(MESSAGE_ASCII, std::ptr::null())), None);
            assert_eq!(attr_message(&short), None);
            assert_eq!(
                attr_message(&attrs(MESSAGE_UNICODE, invalid_wide.as_ptr().cast())).as_deref(),
                Some("A\u{fffd}\u{fffd}")
            );
        }
    }

    /// A fake NVTX instance: its function-pointer variables, tables of their addresses laid out
    /// as NVTX lays them out, and the export-table functions.
    mod fake {
        use super::*;
        use std::sync::atomic::{AtomicUsize, Ordering};

        pub const CORE_SIZE: usize = 16;
        pub const CORE2_SIZE: usize = 16;

        pub static CORE_VARS: [AtomicUsize; CORE_SIZE] = [const { AtomicUsize::new(0) }; CORE_SIZE];
        pub static CORE2_VARS: [AtomicUsize; CORE2_SIZE] =
            [const { AtomicUsize::new(0) }; CORE2_SIZE];

        struct Tables {
            core: [Slot; CORE_SIZE + 1],
            core2: [Slot; CORE2_SIZE + 1],
        }
        // SAFETY: the slots point at atomics in statics.
        unsafe impl Send for Tables {}

        static TABLES: Mutex<Option<Tables>> = Mutex::new(None);

        fn table(vars: &'static [AtomicUsize]) -> [Slot; 17] {
            let mut t = [std::ptr::null_mut(); 17];
            for (i, slot) in t.iter_mut().enumerate().take(16).skip(1) {
                *slot = vars[i].as_ptr().cast();
            }
            t
        }

        unsafe extern "C" fn get_module(
            module: c_int,
            out_table: *mut *mut Slot,
            out_size: *mut c_uint,
        ) -> c_int {
            let mut tables = TABLES.lock().unwrap();
            let t = tables.get_or_insert_with(|| Tables {
                core: table(&CORE_VARS),
                core2: table(&CORE2_VARS),
            });
            let (ptr, size) = match module {
                MODULE_CORE => (t.core.as_mut_ptr(), CORE_SIZE),
                MODULE_CORE2 => (t.core2.as_mut_ptr(), CORE2_SIZE),
                _ => return 0,
            };
            // SAFETY: the caller's out-pointers.
            unsafe {
                *out_table = ptr;
                *out_size = size as c_uint;
            }
            1
        }

        static CALLBACKS: ExportTableCallbacks = ExportTableCallbacks {
            struct_size: size_of::<ExportTableCallbacks>(),
            get_module_function_table: Some(get_module),
        };

        pub unsafe extern "C" fn get_export_table(id: u32) -> *const c_void {
            if id == EXPORT_TABLE_CALLBACKS {
                &CALLBACKS as *const ExportTableCallbacks as *const c_void
            } else {
                std::ptr::null()
            }
        }

        pub fn core(id: usize) -> usize {
            CORE_VARS[id].load(Ordering::SeqCst)
        }

        pub fn core2(id: usize) -> usize {
            CORE2_VARS[id].load(Ordering::SeqCst)
        }
    }

    #[test]
    fn injection_fills_the_slots_and_calls_through_them_make_rows() {
        // SAFETY: the fake export table follows NVTX's protocol, and its tables are statics.
        let installed = unsafe { InitializeInjectionNvtx2(Some(fake::get_export_table)) };
        assert_eq!(installed, 1);
        // SAFETY: NULL export table getter is refused.
        assert_eq!(unsafe { InitializeInjectionNvtx2(None) }, 0);
        for (id, f) in core_callbacks() {
            assert_eq!(fake::core(id), f as usize, "CORE slot {id}");
        }
        for (id, f) in core2_callbacks() {
            assert_eq!(fake::core2(id), f as usize, "CORE2 slot {id}");
        }
        for unused in [0, 12, 13, 14, 15] {
            assert_eq!(fake::core(unused), 0, "CORE slot {unused} left alone");
        }

        type Str = unsafe extern "C" fn(*const c_char);
        type StartStr = unsafe extern "C" fn(*const c_char) -> u64;
        type End = extern "C" fn(u64);
        type PushStr = unsafe extern "C" fn(*const c_char) -> c_int;
        type Pop = extern "C" fn() -> c_int;
        type Create = unsafe extern "C" fn(*const c_char) -> Handle;
        type Register = unsafe extern "C" fn(Handle, *const c_char) -> Handle;
        type DMark = unsafe extern "C" fn(Handle, *const EventAttributes);
        type DPush = unsafe extern "C" fn(Handle, *const EventAttributes) -> c_int;
        type DPop = extern "C" fn(Handle) -> c_int;
        sink::take();
        sink::take_range_starts();
        // SAFETY: every slot holds the callback of the matching NVTX type (checked above);
        // the arguments are what NVTX passes.
        unsafe {
            use core2_cbid::*;
            use core_cbid::*;
            let mark: Str = std::mem::transmute(fake::core(MARK_A));
            let start: StartStr = std::mem::transmute(fake::core(RANGE_START_A));
            let end: End = std::mem::transmute(fake::core(RANGE_END));
            let push: PushStr = std::mem::transmute(fake::core(RANGE_PUSH_A));
            let pop: Pop = std::mem::transmute(fake::core(RANGE_POP));
            let create: Create = std::mem::transmute(fake::core2(DOMAIN_CREATE_A));
            let register: Register = std::mem::transmute(fake::core2(DOMAIN_REGISTER_STRING_A));
            let dmark: DMark = std::mem::transmute(fake::core2(DOMAIN_MARK_EX));
            let dpush: DPush = std::mem::transmute(fake::core2(DOMAIN_RANGE_PUSH_EX));
            let dpop: DPop = std::mem::transmute(fake::core2(DOMAIN_RANGE_POP));

            mark(c"tmark".as_ptr());
            assert_eq!(push(c"outer".as_ptr()), 0);
            let dom = create(c"my domain".as_ptr());
            assert!(!dom.is_null());
            assert_eq!(create(c"my domain".as_ptr()), dom);
            let msg = register(dom, c"region".as_ptr());
            let a = attrs(MESSAGE_REGISTERED, msg);
            // A domain's push/pop stack is separate from the default domain's.
            assert_eq!(dpush(dom, &a), 0);
            assert_eq!(push(c"inner".as_ptr()), 1);
            dmark(dom, &a);
            assert_eq!(pop(), 1);
            assert_eq!(dpop(dom), 0);
            assert_eq!(dpop(dom), -1);
            let r = start(c"tstart".as_ptr());
            assert_eq!(pop(), 0);
            assert_eq!(pop(), -1);
            end(r);
            end(r);
        }
        let rows = sink::take();
        let seen: Vec<_> = rows
            .iter()
            .map(|r| (r.event_type, r.name.as_str(), r.attr_str("domain")))
            .collect();
        use EventType::*;
        assert_eq!(
            seen,
            vec![
                (Mark, "tmark", None),
                (RangeStart, "outer", None),
                (RangeStart, "region", Some("my domain")),
                (RangeStart, "inner", None),
                (Mark, "region", Some("my domain")),
                (RangeEnd, "inner", None),
                (RangeEnd, "region", Some("my domain")),
                (RangeStart, "tstart", None),
                (RangeEnd, "outer", None),
                (RangeEnd, "tstart", None),
            ]
        );
        let id = |i: usize| rows[i].attr_u64("range_id").unwrap();
        assert_eq!(id(1), id(8));
        assert_eq!(id(2), id(6));
        assert_eq!(id(3), id(5));
        assert_eq!(id(7), id(9));
        assert_eq!(
            sink::take_range_starts(),
            vec!["outer", "region", "inner", "tstart"]
        );
    }
}
