//! The runtime's side of the stream-race sanitizer: `sanitizer-op:` marks (from `mstxMarkA`,
//! Python's `msmemscope.mstx.mark` and NVTX marks alike) and the stream/event synchronization
//! calls the CUDA hooks intercept feed one process-wide race checker
//! (`msmemscope_core::sanitizer`).
//!
//! When it runs: from the first `sanitizer-op:` mark on (a program run under `msmemscope` needs
//! nothing but its marks), or from `msmemscope_sanitizer_enable` (Python's
//! `enable_sanitizer()`), which also counts the synchronizations made before the first mark.
//! Until then a synchronization call costs one relaxed load.
//!
//! At exit the report goes to `sanitizer/race_report_{ts}.txt` in the run directory and to the
//! console: appended to `analysis_report.txt`, which the launcher prints, in launched runs; on
//! stderr otherwise. A malformed mark gets one warning line (reason and column) on stderr and in
//! the log, for the first [`MAX_WARNINGS`]; all are counted in the report.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use msmemscope_core::run_dir::RunDir;
use msmemscope_core::sanitizer::message::{self, OpMark};
use msmemscope_core::sanitizer::race::{Launch, RaceChecker};
use msmemscope_core::sanitizer::report::RaceLog;
use msmemscope_core::sanitizer::SyncOp;
use msmemscope_core::symbolize::Symbolizer;

use crate::guard::Entered;

/// Set once the checker runs.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The checker's run: everything but [`ACTIVE`], the hot path's one load, which stays a static
/// of its own. A static because its callers (the CUDA hooks, the marks, the C ABI, the exit
/// handler) reach it from any thread without a session; its two locks are never held together
/// and never across a call out (the forward callback runs after its lock is released).
struct Sanitizer {
    /// Set in a forked child.
    forgotten: AtomicBool,
    state: Mutex<Option<State>>,
    /// Where well-formed marks are also sent (the Python side's bridge to PyTorch's CUDA
    /// sanitizer).
    forward: Mutex<Option<Forward>>,
}

static SANITIZER: Sanitizer = Sanitizer {
    forgotten: AtomicBool::new(false),
    state: Mutex::new(None),
    forward: Mutex::new(None),
};

/// Malformed marks warned about one by one; the rest are only counted.
pub const MAX_WARNINGS: u64 = 20;
/// C frames kept per mark.
const STACK_DEPTH: usize = 8;
/// Distinct mark stacks kept; marks from further call sites are reported without a stack.
const MAX_STACKS: usize = 1 << 16;

/// `void forward(const char *message, uint64_t stream)`: called on the marking thread, after
/// the native checker, for every well-formed mark.
pub type Forward = unsafe extern "C" fn(*const c_char, u64);

#[derive(Default)]
struct State {
    checker: RaceChecker,
    log: RaceLog,
    /// Context ids (1-based indexes) of the marks' C stacks.
    stacks: Vec<Box<[u64]>>,
    stack_ids: HashMap<Box<[u64]>, u64>,
}

impl State {
    fn intern_stack(&mut self, frames: &[u64]) -> u64 {
        if frames.is_empty() {
            return 0;
        }
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        if self.stacks.len() >= MAX_STACKS {
            return 0;
        }
        self.stacks.push(frames.into());
        let id = self.stacks.len() as u64;
        self.stack_ids.insert(frames.into(), id);
        id
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    f(lock(&SANITIZER.state).get_or_insert_with(State::default))
}

/// A stream/event synchronization call the hooks saw. Callable from inside a hook, with or
/// without the hook's reentrancy guard held: cheap while the sanitizer is off, never panics.
pub fn on_sync(op: SyncOp) {
    if !ACTIVE.load(Ordering::Relaxed) || SANITIZER.forgotten.load(Ordering::Relaxed) {
        return;
    }
    // Held by the hook already, or taken here: either way nothing below is recorded.
    let _entered = Entered::try_enter();
    let _ = catch_unwind(|| with_state(|s| s.checker.sync(op)));
}

/// Memory `[addr, addr + size)` was freed (back to the caching allocator, or to the driver):
/// what is allocated there next starts without access history, so reuse that the allocator
/// orders by polling its events is not taken for a race. Same calling rules as [`on_sync`].
pub fn on_free(addr: u64, size: u64) {
    if !ACTIVE.load(Ordering::Relaxed) || SANITIZER.forgotten.load(Ordering::Relaxed) {
        return;
    }
    let _entered = Entered::try_enter();
    let _ = catch_unwind(|| with_state(|s| s.checker.forget(addr, size)));
}

/// A FREE row on its way into the pipeline (recorded or not): its block's access history ends.
pub fn on_free_row(row: &msmemscope_core::events::EventRow) {
    if !ACTIVE.load(Ordering::Relaxed) {
        return;
    }
    if let Some(ptr) = row.ptr {
        on_free(ptr, row.attr_u64("size").unwrap_or(0));
    }
}

/// A mark whose message starts with `sanitizer-op:`. Called by the marks module with the
/// reentrancy guard held; `stream` is the mark's stream (None: the default stream, 0).
pub fn on_mark(text: &str, stream: Option<u64>) {
    if SANITIZER.forgotten.load(Ordering::Relaxed) {
        return;
    }
    match message::parse(text) {
        Ok(op) => {
            activate();
            check(&op, stream.unwrap_or(0));
            forward(text, stream.unwrap_or(0));
        }
        Err(e) => warn_malformed(&e.to_string()),
    }
}

/// Turns the checker on. Its report is written by the exit handler, which the entry points
/// that activate it (the marks, `msmemscope_sanitizer_enable`) make sure is registered.
fn activate() {
    ACTIVE.store(true, Ordering::Relaxed);
}

/// Whether the checker is on (its report is due at exit).
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// In a forked child: check and report nothing (the report is the parent's).
pub fn forget_after_fork() {
    SANITIZER.forgotten.store(true, Ordering::Relaxed);
}

fn check(op: &OpMark, stream: u64) {
    let mut frames = Vec::with_capacity(STACK_DEPTH);
    crate::unwind::with_stack(None, |stack, _| {
        frames.extend(stack.as_slice().iter().take(STACK_DEPTH));
    });
    with_state(|s| {
        let context = s.intern_stack(&frames);
        s.log.marks += 1;
        for race in s.checker.launch(Launch {
            stream,
            op,
            context,
        }) {
            s.log.add(race);
        }
        s.log.saturated = s.checker.saturated();
    });
}

fn forward(text: &str, stream: u64) {
    let Some(f) = *lock(&SANITIZER.forward) else {
        return;
    };
    if let Ok(c) = CString::new(text) {
        // SAFETY: a registered callback of type `Forward`; the string lives for the call.
        unsafe { f(c.as_ptr(), stream) };
    }
}

fn warn_malformed(reason: &str) {
    let n = with_state(|s| {
        s.log.malformed += 1;
        s.log.malformed
    });
    if n > MAX_WARNINGS {
        return;
    }
    let mut line = format!(
        "msmemscope: warning: skipped a malformed sanitizer-op mark: {reason} (format: {})",
        message::FORMAT
    );
    if n == MAX_WARNINGS {
        line.push_str("; further malformed marks are only counted in the sanitizer report");
    }
    crate::log::error(&line);
    line.push('\n');
    write_stderr(&line);
}

/// One `write(2)` to fd 2: no std lock a program thread might hold, no buffering.
fn write_stderr(text: &str) {
    // SAFETY: a valid buffer of `len` bytes; a short or failed write is only a lost message.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

/// Turns the checker on and sets (or, with None, clears) the callback that also receives every
/// well-formed mark. Returns 0.
pub fn enable(forward: Option<Forward>) {
    let _entered = Entered::try_enter();
    *lock(&SANITIZER.forward) = forward;
    activate();
}

/// The report so far, as at exit (without stacks), into `buf` (`cap` bytes). Returns the
/// report's length (call again with a larger buffer when it exceeds `cap`); -1 for a NULL
/// buffer with a nonzero `cap`.
pub fn report_so_far() -> String {
    let _entered = Entered::try_enter();
    catch_unwind(|| with_state(|s| s.log.render(&mut |_| Vec::new()))).unwrap_or_default()
}

/// At exit (after the pipeline's last rows): writes the report when the checker ran.
/// `run_dir` gives the run directory (made on need); with `console_file`, that run
/// directory's `analysis_report.txt` receives the console text instead of stderr (the launcher
/// prints it once the program has ended).
pub fn write_report_at_exit(
    run_dir: fn() -> Result<Arc<RunDir>, String>,
    console_file: Option<Arc<RunDir>>,
) {
    if !ACTIVE.load(Ordering::Relaxed) || SANITIZER.forgotten.load(Ordering::Relaxed) {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(state) = lock(&SANITIZER.state).take() else {
            return;
        };
        let text = render_with_stacks(&state);
        publish(&text, run_dir, console_file);
    }));
}

fn render_with_stacks(state: &State) -> String {
    let mut symbolizer: Option<Symbolizer> = None;
    let mut rendered: HashMap<u64, Vec<String>> = HashMap::new();
    state.log.render(&mut |context| {
        let Some(frames) = (context as usize)
            .checked_sub(1)
            .and_then(|i| state.stacks.get(i))
        else {
            return Vec::new();
        };
        let symbolizer = symbolizer.get_or_insert_with(|| {
            crate::unwind::modules::refresh(false);
            Symbolizer::new(crate::unwind::modules::seen_modules())
        });
        let mut lines: Vec<String> = frames
            .iter()
            .flat_map(|&address| {
                rendered
                    .entry(address)
                    .or_insert_with(|| {
                        symbolizer
                            .symbolize_return_address(address)
                            .iter()
                            .filter(|f| !is_interpreter(f.module.as_deref()))
                            .map(|f| f.render())
                            .collect()
                    })
                    .clone()
            })
            .collect();
        lines.truncate(STACK_DEPTH);
        lines
    })
}

/// Frames of the Python interpreter and of msmemscope's extension say nothing about which
/// Python line marked (CPython's evaluation loop); they are left out of the report.
fn is_interpreter(module: Option<&str>) -> bool {
    module.is_some_and(|m| {
        let name = m.rsplit('/').next().unwrap_or(m);
        name.starts_with("python") || name.starts_with("libpython") || name.starts_with("_native.")
    })
}

/// The report file, and the console.
fn publish(
    text: &str,
    run_dir: fn() -> Result<Arc<RunDir>, String>,
    console_file: Option<Arc<RunDir>>,
) {
    let written = run_dir().and_then(|dir| write_report_file(&dir, text));
    let note = match &written {
        Ok(path) => format!("msmemscope: sanitizer report: {}\n", path.display()),
        Err(e) => {
            crate::log::error(&format!("sanitizer report: {e}"));
            format!("msmemscope: the sanitizer report could not be written: {e}\n")
        }
    };
    let console = format!("{text}{note}");
    match console_file {
        Some(dir) => {
            let appended = dir
                .append_file(Path::new(msmemscope_core::launch_env::ANALYSIS_REPORT))
                .and_then(|mut f| f.write_all(console.as_bytes()).map_err(|e| e.to_string()));
            if let Err(e) = appended {
                crate::log::error(&format!("sanitizer report: {e}"));
                write_stderr(&console);
            }
        }
        None => write_stderr(&console),
    }
}

fn write_report_file(run_dir: &RunDir, text: &str) -> Result<PathBuf, String> {
    let ts = msmemscope_core::run_dir::local_timestamp();
    let names = [
        format!("race_report_{ts}.txt"),
        // A second process of the same run (or a second report within the second) gets its own.
        format!("race_report_{ts}_{}.txt", std::process::id()),
    ];
    let mut last = String::new();
    for name in names {
        let relative = Path::new("sanitizer").join(name);
        match run_dir.create_file_io(&relative) {
            Ok(mut file) => {
                let path = run_dir.path().join(&relative);
                file.write_all(text.as_bytes())
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = format!(
                    "cannot create {}: {e}",
                    run_dir.path().join(&relative).display()
                );
            }
            Err(e) => {
                return Err(format!(
                    "cannot create {}: {e}",
                    run_dir.path().join(&relative).display()
                ))
            }
        }
    }
    Err(last)
}

/// Synchronization kinds of [`msmemscope_sanitizer_sync`] (include/msmemscope/sanitizer.h).
pub const SYNC_EVENT_RECORD: u32 = 1;
pub const SYNC_STREAM_WAIT_EVENT: u32 = 2;
pub const SYNC_EVENT_SYNCHRONIZE: u32 = 3;
pub const SYNC_STREAM_SYNCHRONIZE: u32 = 4;
pub const SYNC_DEVICE_SYNCHRONIZE: u32 = 5;

/// The [`SyncOp`] of a C caller's `(kind, a, b)`, as the header documents them.
pub fn sync_op(kind: u32, a: u64, b: u64) -> Option<SyncOp> {
    Some(match kind {
        SYNC_EVENT_RECORD => SyncOp::EventRecord {
            event: a,
            stream: b,
        },
        SYNC_STREAM_WAIT_EVENT => SyncOp::StreamWaitEvent {
            stream: a,
            event: b,
        },
        SYNC_EVENT_SYNCHRONIZE => SyncOp::EventSynchronize { event: a },
        SYNC_STREAM_SYNCHRONIZE => SyncOp::StreamSynchronize { stream: a },
        SYNC_DEVICE_SYNCHRONIZE => SyncOp::DeviceSynchronize,
        _ => return None,
    })
}

/// A synchronization made through an API the runtime does not intercept (another stream
/// runtime, or a program without CUDA). Returns 0, or -1 for an unknown `kind`.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn msmemscope_sanitizer_sync(kind: u32, a: u64, b: u64) -> i32 {
    match sync_op(kind, a, b) {
        Some(op) => {
            on_sync(op);
            0
        }
        None => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_sync_kinds_map_to_sync_ops() {
        assert_eq!(
            sync_op(SYNC_EVENT_RECORD, 7, 3),
            Some(SyncOp::EventRecord {
                event: 7,
                stream: 3
            })
        );
        assert_eq!(
            sync_op(SYNC_STREAM_WAIT_EVENT, 3, 7),
            Some(SyncOp::StreamWaitEvent {
                stream: 3,
                event: 7
            })
        );
        assert_eq!(
            sync_op(SYNC_EVENT_SYNCHRONIZE, 7, 0),
            Some(SyncOp::EventSynchronize { event: 7 })
        );
        assert_eq!(
            sync_op(SYNC_STREAM_SYNCHRONIZE, 3, 0),
            Some(SyncOp::StreamSynchronize { stream: 3 })
        );
        assert_eq!(
            sync_op(SYNC_DEVICE_SYNCHRONIZE, 0, 0),
            Some(SyncOp::DeviceSynchronize)
        );
        assert_eq!(sync_op(0, 1, 2), None);
        assert_eq!(msmemscope_sanitizer_sync(6, 1, 2), -1);
    }

    #[test]
    fn interpreter_frames_are_recognised_by_module_name() {
        assert!(is_interpreter(Some("/usr/lib/libpython3.11.so.1.0")));
        assert!(is_interpreter(Some("python3.11")));
        assert!(is_interpreter(Some("_native.abi3.so")));
        assert!(!is_interpreter(Some("libmy_ext.so")));
        assert!(!is_interpreter(None));
    }
}
