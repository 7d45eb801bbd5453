//! The Python frames of the allocating thread, for host-leak stacks.
//!
//! A host block allocated while Python code runs is attributed to the Python lines that led to
//! it, not only to interpreter frames (`_PyEval_EvalFrameDefault`). The frames are read the way
//! an out-of-process sampler reads them, but in process: the thread's own `PyThreadState`
//! (`PyGILState_GetThisThreadState`, a thread-specific-data read), then its frame chain, with
//! the field offsets of the running CPython minor version (`layout`). A thread's frame chain
//! belongs to that thread, so it does not change while the thread is in C code, whether or not
//! it holds the GIL; reading it takes no lock and allocates nothing.
//!
//! On the hook path raw frames are taken: (code object, instruction offset). The stack table
//! makes them part of the site's key, so two Python callers of one C function are two sites;
//! the key's C part then ends where the interpreter's own frames begin
//! (`frames_above_interpreter`). A frame becomes text (file, line, function) while the
//! allocating thread runs it, so its code object is certainly alive; `RenderKey` names what the
//! text is read from, so texts are cached without ever being given for another code object.
//!
//! Layer 3 of the runtime (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls unwind (module ranges) and the bottom layers only.

pub mod layout;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::pyframes::linetable::line_at;

use crate::hashing::FastHash;
use layout::{Chain, Layout};

/// The most Python frames a stack key holds.
pub const MAX_PY_FRAMES: usize = 32;
/// The depth used when none is configured (`--call-stack=python:N` sets it).
pub const DEFAULT_PY_DEPTH: usize = 20;

/// One Python frame as the hook takes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// The code object's address.
    pub code: u64,
    /// The byte offset of the frame's current instruction in the code.
    pub offset: i32,
}

/// The Python frames of an allocation, innermost first.
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    pub frames: [PyFrame; MAX_PY_FRAMES],
    pub len: usize,
    /// Frames went on beyond the configured depth.
    pub cut: bool,
}

impl PyStack {
    pub const fn empty() -> PyStack {
        PyStack {
            frames: [PyFrame { code: 0, offset: 0 }; MAX_PY_FRAMES],
            len: 0,
            cut: false,
        }
    }

    pub fn as_slice(&self) -> &[PyFrame] {
        &self.frames[..self.len]
    }
}

/// The interpreter found in the process.
struct Api {
    layout: &'static Layout,
    this_thread_state: unsafe extern "C" fn() -> *mut c_void,
    is_initialized: unsafe extern "C" fn() -> c_int,
    /// `&PyCode_Type`: a frame's code object is checked to be one before it is read.
    code_type: usize,
    /// The code of the module holding the interpreter (the executable or libpython).
    interpreter: std::ops::Range<u64>,
}

/// Set once, when an interpreter we can read is found; never freed.
static API: AtomicPtr<Api> = AtomicPtr::new(std::ptr::null_mut());
/// How many frames to take (0: none). Set when a window opens.
static DEPTH: AtomicUsize = AtomicUsize::new(0);

/// The Python frames of an allocation made without Python.
pub static NO_FRAMES: PyStack = PyStack::empty();

/// Whether allocations take Python frames: an interpreter was found and frames are on.
#[inline]
pub fn active() -> bool {
    DEPTH.load(Ordering::Relaxed) != 0 && !API.load(Ordering::Relaxed).is_null()
}

/// Sets how many Python frames allocations take from now on (0 turns them off).
pub fn set_depth(depth: usize) {
    DEPTH.store(depth.min(MAX_PY_FRAMES), Ordering::Relaxed);
}

/// Whether CPython's object and memory allocators are wrapped (`hooks::pymem` sets it once they
/// are): only then can a host-leak window account Python objects.
static OBJECT_ALLOCATORS_WRAPPED: AtomicBool = AtomicBool::new(false);

pub fn object_allocators_wrapped() -> bool {
    OBJECT_ALLOCATORS_WRAPPED.load(Ordering::Acquire)
}

/// Said by the wrappers once they are in, never undone.
pub(crate) fn note_object_allocators_wrapped() {
    OBJECT_ALLOCATORS_WRAPPED.store(true, Ordering::Release);
}

/// The CPython version whose frames are read, once one was found.
pub fn version() -> Option<(u8, u8)> {
    let api = API.load(Ordering::Acquire);
    // SAFETY: API only ever holds null or a leaked, never freed Api.
    (!api.is_null()).then(|| unsafe { &*api }.layout.version)
}

fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the name up.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Whether a CPython interpreter is loaded (whatever its build): its API is in the global scope.
pub fn in_process() -> bool {
    !symbol(c"Py_GetVersion").is_null()
}

/// Looks for a CPython interpreter among the loaded objects (the executable, or a libpython
/// loaded with it or later). Called after each scan of the loaded modules; cheap once found.
/// Builds whose structures differ from the release layout (debug, free-threaded) are left
/// alone: their allocations keep C frames only.
pub fn detect() {
    if !API.load(Ordering::Acquire).is_null() {
        return;
    }
    let get_version = symbol(c"Py_GetVersion");
    let this_thread_state = symbol(c"PyGILState_GetThisThreadState");
    let is_initialized = symbol(c"Py_IsInitialized");
    let code_type = symbol(c"PyCode_Type");
    if [get_version, this_thread_state, is_initialized, code_type]
        .iter()
        .any(|p| p.is_null())
    {
        return;
    }
    // Reference-count debugging (any debug build) exports its counters.
    if !symbol(c"_Py_RefTotal").is_null() || !symbol(c"_Py_GetGlobalRefTotal").is_null() {
        return;
    }
    // SAFETY: Py_GetVersion has this signature in every CPython and returns a static string
    // (formatted into a static buffer, without allocating).
    let text = unsafe {
        let get: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(get_version);
        CStr::from_ptr(get()).to_bytes()
    };
    if text.windows(14).any(|w| w == b"free-threading") {
        return;
    }
    let Some((major, minor)) = parse_version(text) else {
        return;
    };
    let Some(layout) = layout::for_version(major, minor) else {
        return;
    };
    let Some(interpreter) =
        crate::unwind::modules::current().and_then(|s| s.range_of(this_thread_state as u64))
    else {
        return;
    };
    // SAFETY: the two functions have these signatures in every CPython 3.
    let api = unsafe {
        Api {
            layout,
            this_thread_state: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn() -> *mut c_void,
            >(this_thread_state),
            is_initialized: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(
                is_initialized,
            ),
            code_type: code_type as usize,
            interpreter,
        }
    };
    let leaked = Box::into_raw(Box::new(api));
    if API
        .compare_exchange(
            std::ptr::null_mut(),
            leaked,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: not published: this thread still owns it.
        drop(unsafe { Box::from_raw(leaked) });
    }
}

/// How many of `frames` (C return addresses, innermost first) come before the first one in
/// the interpreter's own code: with Python frames at hand, the interpreter's frames only say
/// how the eval loop reached the call (and change as it specializes instructions), so a stack
/// key keeps the C frames above them — the extension's and the libraries' — and the Python
/// frames instead.
pub fn frames_above_interpreter(frames: &[u64]) -> usize {
    let api = API.load(Ordering::Acquire);
    if api.is_null() {
        return frames.len();
    }
    // SAFETY: a published Api is never freed.
    let code = &unsafe { &*api }.interpreter;
    frames
        .iter()
        .position(|f| code.contains(f))
        .unwrap_or(frames.len())
}

/// The code of the module holding the interpreter, once one was found.
pub fn interpreter_code() -> Option<std::ops::Range<u64>> {
    let api = API.load(Ordering::Acquire);
    // SAFETY: API only ever holds null or a leaked, never freed Api.
    (!api.is_null()).then(|| unsafe { &*api }.interpreter.clone())
}

/// `3.11.7 (main, …)` → (3, 11).
fn parse_version(text: &[u8]) -> Option<(u8, u8)> {
    let head = text.split(|&b| b == b' ').next()?;
    let mut parts = head.split(|&b| b == b'.');
    // The leading digits of a part ("0rc1" -> 0), without allocating: this runs from the
    // module scan, which hooks may trigger.
    let number = |part: Option<&[u8]>| -> Option<u8> {
        let part = part?;
        let digits = part.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&part[..digits]).ok()?.parse().ok()
    };
    Some((number(parts.next())?, number(parts.next())?))
}

/// Reads a `T` at `address` of the interpreter's memory.
///
/// # Safety
/// `address` must be readable for `size_of::<T>()` bytes.
#[inline]
unsafe fn read<T: Copy>(address: usize) -> T {
    // SAFETY: the caller's guarantee; unaligned reads are allowed for any bit pattern of T.
    unsafe { std::ptr::read_unaligned(address as *const T) }
}

/// Takes the calling thread's Python frames, innermost first, into `out` (empty on a thread
/// without Python, before the interpreter is initialized, or when frames are off).
#[inline]
pub fn capture(out: &mut PyStack) {
    out.len = 0;
    out.cut = false;
    let depth = DEPTH.load(Ordering::Relaxed);
    if depth == 0 {
        return;
    }
    let api = API.load(Ordering::Acquire);
    if api.is_null() {
        return;
    }
    // SAFETY: a published Api is never freed.
    let api = unsafe { &*api };
    // SAFETY: both are CPython's own functions: an initialized flag read, and a thread-specific
    // data read (no lock, no allocation). The thread state is read only once initialized.
    let tstate = unsafe {
        if (api.is_initialized)() == 0 {
            return;
        }
        (api.this_thread_state)() as usize
    };
    if tstate == 0 {
        return;
    }
    let l = api.layout;
    // SAFETY: tstate is this thread's live PyThreadState; the offsets are its version's.
    let mut frame: usize = unsafe {
        match l.chain {
            Chain::FrameObjects { .. } | Chain::Direct => read(tstate + l.tstate_frame),
            Chain::CFrame { current_frame } => {
                let cframe: usize = read(tstate + l.tstate_frame);
                if cframe == 0 {
                    0
                } else {
                    read(cframe + current_frame)
                }
            }
        }
    };
    // A bound on the walk, whatever the chain holds.
    let mut steps = 0;
    while frame != 0 && out.len < depth && steps < 4096 {
        steps += 1;
        // SAFETY: frame is a live frame of this thread's chain (see the module comment).
        if let Some(f) = unsafe { read_frame(api, frame) } {
            out.frames[out.len] = f;
            out.len += 1;
        }
        // SAFETY: as above.
        frame = unsafe { read(frame + l.frame_previous) };
    }
    out.cut = frame != 0 && out.len == depth;
}

/// One frame of the chain, or None for frames without Python code of their own (C-stack entry
/// frames, frames still being set up).
///
/// # Safety
/// `frame` must be a live frame of the running interpreter's version.
unsafe fn read_frame(api: &Api, frame: usize) -> Option<PyFrame> {
    let l = api.layout;
    // SAFETY: the caller's guarantee, for every field read below; the code object is only read
    // after its type was checked.
    unsafe {
        let owner = l.frame_owner.map(|o| read::<u8>(frame + o));
        if owner.is_some() && owner == l.owner_cstack {
            return None;
        }
        let code: usize = read(frame + l.frame_code);
        if code == 0 || read::<usize>(code + layout::OB_TYPE) != api.code_type {
            return None;
        }
        let offset = match (l.chain, l.code_units) {
            (Chain::FrameObjects { lasti_in_units }, _) => {
                let lasti: i32 = read(frame + l.frame_instr);
                if lasti_in_units {
                    lasti.saturating_mul(2)
                } else {
                    lasti
                }
            }
            (_, Some(units)) => {
                let instr: usize = read(frame + l.frame_instr);
                let bytes = instr as i64 - (code + units) as i64;
                if let Some(first) = l.code_firsttraceable {
                    let first = i64::from(read::<i32>(code + first)) * 2;
                    if owner != Some(layout::OWNER_GENERATOR) && bytes < first {
                        return None;
                    }
                }
                bytes.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
            }
            (_, None) => return None,
        };
        Some(PyFrame {
            code: code as u64,
            offset,
        })
    }
}

/// What makes a frame's text: the code object and offset, and a hash of the objects its text
/// is read from (first line, file and function names, line table). A code object freed and
/// another made at its address gets other names and tables, so a text cached under this key is
/// never given for the wrong code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RenderKey {
    pub code: u64,
    pub offset: i32,
    pub ident: u64,
}

/// The fields of a live code object a frame's text is read from.
struct CodeText {
    first_line: i32,
    file: usize,
    name: usize,
    table: usize,
}

impl CodeText {
    /// # Safety
    /// `code` must be a live code object of the running interpreter's version.
    #[inline]
    unsafe fn read(l: &Layout, code: usize) -> CodeText {
        // SAFETY: the caller's guarantee.
        unsafe {
            CodeText {
                first_line: read(code + l.code_firstlineno),
                file: read(code + l.code_filename),
                name: read(code + l.code_name),
                table: read(code + l.code_linetable),
            }
        }
    }

    fn ident(&self) -> u64 {
        let mut h = crate::hashing::mix(self.first_line as u32 as u64 ^ (self.file as u64) << 1);
        h = crate::hashing::mix(h ^ self.name as u64);
        crate::hashing::mix(h ^ self.table as u64)
    }
}

/// Frames already turned into text. Stacks of a Python program share most of their frames (the
/// import machinery's, a training loop's callers), so each is decoded once, not once per stack.
/// Equal texts are one `Arc` (`texts`): two instructions of one line are one frame as text, so
/// stacks that differ only there can be recognised as one site by pointer.
struct Rendered {
    by_key: HashMap<RenderKey, Arc<str>, FastHash>,
    texts: std::collections::HashSet<Arc<str>, FastHash>,
}

static RENDERED: Mutex<Option<Rendered>> = Mutex::new(None);
/// Past this many texts the cache starts again (code objects come and go: module bodies run once).
const RENDERED_CAP: usize = 1 << 18;

/// The key of a frame's text (see [`RenderKey`]).
///
/// Call only while the frame's code object is alive: from the thread that captured it, before
/// its Python code moves on (the stack table does it while interning the allocation's stack).
#[inline]
pub fn render_key(frame: &PyFrame) -> Option<RenderKey> {
    let api = API.load(Ordering::Acquire);
    if api.is_null() {
        return None;
    }
    // SAFETY: a published Api is never freed.
    let l = unsafe { &*api }.layout;
    // SAFETY: the code object is alive (the caller's contract) and was type-checked when
    // captured; the offsets are its version's.
    let text = unsafe { CodeText::read(l, frame.code as usize) };
    Some(RenderKey {
        code: frame.code,
        offset: frame.offset,
        ident: text.ident(),
    })
}

/// The keys of `py`'s frames into `out` (as many as it holds). Same contract as [`render_key`].
#[inline]
pub fn render_keys(py: &PyStack, out: &mut [RenderKey]) {
    for (key, frame) in out.iter_mut().zip(py.as_slice()) {
        // Without an interpreter's layout (never, once frames were captured) the frame keeps
        // its code address and shows as unreadable.
        *key = render_key(frame).unwrap_or(RenderKey {
            code: frame.code,
            offset: frame.offset,
            ..Default::default()
        });
    }
}

/// The text of the frame `key` was made from (`file(line): function`, the event dump's form of
/// a Python frame), while its code object is alive (as for [`render_key`]).
pub fn render_text(key: &RenderKey) -> Option<Arc<str>> {
    let api = API.load(Ordering::Acquire);
    if api.is_null() {
        return None;
    }
    // SAFETY: a published Api is never freed.
    let l = unsafe { &*api }.layout;
    let mut cache = RENDERED.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(|| Rendered {
        by_key: HashMap::with_hasher(FastHash),
        texts: std::collections::HashSet::with_hasher(FastHash),
    });
    if let Some(text) = cache.by_key.get(key) {
        return Some(text.clone());
    }
    // SAFETY: the key's code object is alive (this function's contract), and so are the
    // objects it holds.
    let text: Arc<str> = unsafe {
        let code = CodeText::read(l, key.code as usize);
        let file = text_of(l, code.file);
        let name = text_of(l, code.name);
        let table = bytes_of(code.table)?;
        let line = line_at(l.format, table, code.first_line, key.offset)
            .map_or_else(|| "?".to_string(), |n| n.to_string());
        format!(
            "{}({line}): {}",
            file.as_deref().unwrap_or("<non-ascii file name>"),
            name.as_deref().unwrap_or("<non-ascii name>")
        )
        .into()
    };
    if cache.by_key.len() >= RENDERED_CAP {
        cache.by_key.clear();
        cache.texts.clear();
    }
    let text = match cache.texts.get(&text) {
        Some(same) => same.clone(),
        None => {
            cache.texts.insert(text.clone());
            text
        }
    };
    cache.by_key.insert(*key, text.clone());
    Some(text)
}

/// The text of a `str`: compact ASCII strings hold it inline; others only when their UTF-8
/// form was already made (making it would allocate through the interpreter).
///
/// # Safety
/// `s` must be null or a live `str` of the running interpreter.
unsafe fn text_of(l: &Layout, s: usize) -> Option<String> {
    if s == 0 {
        return None;
    }
    // SAFETY: the caller's guarantee; lengths are bounded before reading the characters.
    unsafe {
        let state: u32 = read(s + layout::UNICODE_STATE);
        let (data, len) = if state & layout::STATE_COMPACT != 0 && state & layout::STATE_ASCII != 0
        {
            (s + l.ascii_data, read::<isize>(s + layout::UNICODE_LENGTH))
        } else if state & layout::STATE_COMPACT != 0 {
            let utf8: usize = read(s + l.compact_utf8);
            // utf8_length is the field before utf8.
            (utf8, read::<isize>(s + l.compact_utf8 - 8))
        } else {
            return None;
        };
        if data == 0 || !(0..=4096).contains(&len) {
            return None;
        }
        let bytes = std::slice::from_raw_parts(data as *const u8, len as usize);
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// The contents of a `bytes` object (a code object's line table).
///
/// # Safety
/// `b` must be null or a live `bytes` object of the running interpreter.
unsafe fn bytes_of<'a>(b: usize) -> Option<&'a [u8]> {
    if b == 0 {
        return None;
    }
    // SAFETY: the caller's guarantee; the length is bounded before the slice is made.
    unsafe {
        let len: isize = read(b + layout::OB_SIZE);
        if !(0..=(1 << 20)).contains(&len) {
            return None;
        }
        Some(std::slice::from_raw_parts(
            (b + layout::BYTES_DATA) as *const u8,
            len as usize,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_the_interpreters_text() {
        assert_eq!(
            parse_version(b"3.11.7 (main, Jan 1 2024) [GCC]"),
            Some((3, 11))
        );
        assert_eq!(parse_version(b"3.13.0rc1 (main)"), Some((3, 13)));
        assert_eq!(parse_version(b"3.9.18"), Some((3, 9)));
        assert_eq!(parse_version(b"garbage"), None);
    }

    #[test]
    fn without_an_interpreter_no_frames_are_taken() {
        set_depth(DEFAULT_PY_DEPTH);
        detect(); // the test binary has no CPython
        let mut stack = PyStack::empty();
        stack.len = 3;
        capture(&mut stack);
        assert_eq!(stack.len, 0);
        assert_eq!(version(), None);
    }
}
