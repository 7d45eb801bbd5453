use std::mem::size_of;
use std::sync::Mutex;

use libc::{c_char, c_int, c_uint, c_void, wchar_t};

use super::callbacks::{core2_callbacks, core_callbacks, domain_register_string_a};
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
    pub static CORE2_VARS: [AtomicUsize; CORE2_SIZE] = [const { AtomicUsize::new(0) }; CORE2_SIZE];

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
