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

mod callbacks;
mod handles;
mod messages;
mod ranges;
#[cfg(test)]
mod tests;

use std::mem::{offset_of, size_of};

use libc::{c_int, c_uint, c_void};

use super::guarded;
use callbacks::{core2_callbacks, core_callbacks};
pub use messages::attr_message;

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
