//! Where CPython keeps what a frame walk reads, per minor version (x86_64, release builds with
//! the GIL). The offsets are `offsetof` of the interpreter's own structures, as its headers of
//! 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0 give them; CPython keeps these layouts within a
//! minor version. Debug and free-threaded builds lay them out differently and are refused by
//! `super::detect`.

use msmemscope_core::pyframes::linetable::LineTableFormat;

/// How a thread's frames are chained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    /// 3.9, 3.10: `PyThreadState.frame`, a `PyFrameObject` chained by `f_back`; `f_lasti`.
    FrameObjects {
        /// `f_lasti` counts instructions (3.10) rather than bytes (3.9).
        lasti_in_units: bool,
    },
    /// 3.11, 3.12: `PyThreadState.cframe->current_frame`, an `_PyInterpreterFrame` chained by
    /// `previous`; the instruction pointer points into the code object's code units.
    CFrame { current_frame: usize },
    /// 3.13: `PyThreadState.current_frame`.
    Direct,
}

#[derive(Debug)]
pub struct Layout {
    pub version: (u8, u8),
    pub chain: Chain,
    /// `PyThreadState`: the field the chain starts from (`frame`, `cframe`, `current_frame`).
    pub tstate_frame: usize,
    /// The frame's code object (`f_code`, or 3.13's `f_executable`, which may be another
    /// object: its type is checked).
    pub frame_code: usize,
    pub frame_previous: usize,
    /// `f_lasti` (3.9, 3.10, an `int`), else the instruction pointer.
    pub frame_instr: usize,
    /// `owner` (a byte), from 3.11.
    pub frame_owner: Option<usize>,
    /// The `owner` of the C-stack entry frames that hold no code (3.12+).
    pub owner_cstack: Option<u8>,
    pub code_filename: usize,
    /// `co_qualname` from 3.11 (`Class.method`), else `co_name`.
    pub code_name: usize,
    pub code_firstlineno: usize,
    pub code_linetable: usize,
    /// Where the code units start in the code object (3.11+).
    pub code_units: Option<usize>,
    /// `_co_firsttraceable` (an `int`, 3.11+): frames before it are still being set up.
    pub code_firsttraceable: Option<usize>,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    pub ascii_data: usize,
    /// `PyCompactUnicodeObject.utf8`: a non-ASCII string's UTF-8 form, when made.
    pub compact_utf8: usize,
    pub format: LineTableFormat,
}

/// `PyObject.ob_type`.
pub const OB_TYPE: usize = 8;
/// `PyVarObject.ob_size`, and where a bytes object's data start.
pub const OB_SIZE: usize = 16;
pub const BYTES_DATA: usize = 32;
/// `PyASCIIObject.length` and `.state` (a bit field: `compact` is bit 5, `ascii` bit 6).
pub const UNICODE_LENGTH: usize = 16;
pub const UNICODE_STATE: usize = 32;
pub const STATE_COMPACT: u32 = 1 << 5;
pub const STATE_ASCII: u32 = 1 << 6;
/// `FRAME_OWNED_BY_GENERATOR`: a generator's frame is never "incomplete".
pub const OWNER_GENERATOR: u8 = 1;

static LAYOUTS: [Layout; 5] = [
    Layout {
        version: (3, 9),
        chain: Chain::FrameObjects {
            lasti_in_units: false,
        },
        tstate_frame: 24,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: None,
        owner_cstack: None,
        code_filename: 104,
        code_name: 112,
        code_firstlineno: 40,
        code_linetable: 120,
        code_units: None,
        code_firsttraceable: None,
        ascii_data: 48,
        compact_utf8: 56,
        format: LineTableFormat::Lnotab39,
    },
    Layout {
        version: (3, 10),
        chain: Chain::FrameObjects {
            lasti_in_units: true,
        },
        tstate_frame: 24,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 96,
        frame_owner: None,
        owner_cstack: None,
        code_filename: 104,
        code_name: 112,
        code_firstlineno: 40,
        code_linetable: 120,
        code_units: None,
        code_firsttraceable: None,
        ascii_data: 48,
        compact_utf8: 56,
        format: LineTableFormat::Linetable310,
    },
    Layout {
        version: (3, 11),
        chain: Chain::CFrame { current_frame: 8 },
        tstate_frame: 56,
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_owner: Some(69),
        owner_cstack: None,
        code_filename: 112,
        code_name: 128,
        code_firstlineno: 72,
        code_linetable: 136,
        code_units: Some(184),
        code_firsttraceable: Some(168),
        ascii_data: 48,
        compact_utf8: 56,
        format: LineTableFormat::Locations311,
    },
    Layout {
        version: (3, 12),
        chain: Chain::CFrame { current_frame: 0 },
        tstate_frame: 56,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: Some(70),
        owner_cstack: Some(3),
        code_filename: 112,
        code_name: 128,
        code_firstlineno: 68,
        code_linetable: 136,
        code_units: Some(192),
        code_firsttraceable: Some(176),
        ascii_data: 40,
        compact_utf8: 48,
        format: LineTableFormat::Locations311,
    },
    Layout {
        version: (3, 13),
        chain: Chain::Direct,
        tstate_frame: 72,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: Some(70),
        owner_cstack: Some(3),
        code_filename: 112,
        code_name: 128,
        code_firstlineno: 68,
        code_linetable: 136,
        code_units: Some(200),
        code_firsttraceable: Some(184),
        ascii_data: 40,
        compact_utf8: 48,
        format: LineTableFormat::Locations311,
    },
];

/// The layout of CPython `major.minor`, if it is one we read.
pub fn for_version(major: u8, minor: u8) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.version == (major, minor))
}
