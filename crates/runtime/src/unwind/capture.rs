//! Taking the caller's stack from inside a hook.

use std::cell::UnsafeCell;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{MustNotAllocateDuringUnwind, Unwinder};

use super::memo::{Memo, MemoKey, ReadLog, StackRange};
use super::modules;

/// Frames kept per stack: the stack key (SPEC §8, K = 20).
pub const MAX_FRAMES: usize = msmemscope_core::host_leak::STACK_KEY_FRAMES;

/// Return addresses, innermost (the allocator's caller) first.
#[derive(Clone, Copy)]
pub struct CapturedStack {
    pub frames: [u64; MAX_FRAMES],
    pub len: usize,
}

impl CapturedStack {
    pub const fn empty() -> CapturedStack {
        CapturedStack {
            frames: [0; MAX_FRAMES],
            len: 0,
        }
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.frames[..self.len]
    }
}

type RuleCache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// Everything a thread keeps for unwinding, in one thread-local slot.
struct ThreadUnwinder {
    rules: RuleCache,
    memo: Memo,
    /// [low, high) of this thread's stack; (0, 0) until first asked.
    bounds: (u64, u64),
}

impl ThreadUnwinder {
    fn new() -> Box<ThreadUnwinder> {
        Box::new(ThreadUnwinder {
            rules: RuleCache::new_in(),
            memo: Memo::new(),
            bounds: (0, 0),
        })
    }

    /// The part of this thread's stack a walk from `sp` may read, or `None` when `sp` lies
    /// outside the stack (an alternate signal stack or a user-level stack switch): then no
    /// stack is taken rather than reading unknown memory.
    fn stack_range(&mut self, sp: u64) -> Option<StackRange> {
        let (low, high) = self.bounds;
        if !(low <= sp && sp < high) {
            self.bounds = query_stack_bounds()?;
        }
        let (low, high) = self.bounds;
        (low <= sp && sp < high).then_some(StackRange { low: sp, high })
    }
}

/// `(pc, sp, bp)` at the point of use. A macro, not a function: the registers must belong to the
/// frame that walks, which a call (inlined or not) does not guarantee.
macro_rules! registers {
    () => {{
        let (pc, sp, bp): (u64, u64, u64);
        // SAFETY: reads rip, rsp and rbp into registers; touches no memory and no flags.
        unsafe {
            std::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                pc = out(reg) pc,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags),
            );
        }
        (pc, sp, bp)
    }};
}

thread_local! {
    // Per thread: lookups need `&mut`, and threads never share one.
    static THREAD: UnsafeCell<Option<Box<ThreadUnwinder>>> = const { UnsafeCell::new(None) };
}

/// Address range of this library's own code: frames inside it are the hook itself.
static OWN_CODE: std::sync::OnceLock<std::ops::Range<u64>> = std::sync::OnceLock::new();

pub fn set_own_code_range(range: std::ops::Range<u64>) {
    let _ = OWN_CODE.set(range);
}

/// Captures the current thread's stack, skipping the runtime's own frames, and calls `f` with
/// it and its memo tag (0 when the stack was walked afresh, else what `f` stored last time for
/// the same stack). Must be called with the reentrancy guard held: the first call on a thread
/// allocates (rule cache, memo, stack bounds).
#[inline(never)]
pub fn with_stack<R>(f: impl FnOnce(&CapturedStack, &mut u64) -> R) -> R {
    let mut f = Some(f);
    let mut call =
        |stack: &CapturedStack, tag: &mut u64| (f.take().expect("called once"))(stack, tag);
    let (pc, sp, bp) = registers!();
    let walked = THREAD.try_with(|cell| {
        let snapshot = modules::current()?;
        // SAFETY: the cell is only touched by this thread, and never re-entered (the guard
        // keeps hooks from running inside this function).
        let slot = unsafe { &mut *cell.get() };
        let thread = slot.get_or_insert_with(ThreadUnwinder::new);
        let range = thread.stack_range(sp)?;
        let key = MemoKey {
            snapshot: snapshot as *const _ as usize,
            sp,
            bp: range.class_of(bp),
        };
        if let Some(slot) = thread.memo.lookup(&key, range) {
            let entry = thread.memo.entry(slot)?;
            return Some(call(&entry.stack, &mut entry.tag));
        }
        let start = WalkStart { pc, sp, bp, range };
        let (mut stack, mut log) = (CapturedStack::empty(), ReadLog::new());
        let mut snapshot = snapshot;
        if walk(snapshot, &mut thread.rules, &start, &mut log, &mut stack) {
            // The stack met code of a library loaded since the last scan: walk again with the
            // new modules, and do not memoize the first attempt.
            if !modules::refresh_for_unknown_address() {
                let mut tag = 0;
                return Some(call(&stack, &mut tag));
            }
            snapshot = modules::current()?;
            (stack, log) = (CapturedStack::empty(), ReadLog::new());
            walk(snapshot, &mut thread.rules, &start, &mut log, &mut stack);
        }
        let key = MemoKey {
            snapshot: snapshot as *const _ as usize,
            ..key
        };
        match thread.memo.store(key, range, log, &stack) {
            Some(entry) => Some(call(&entry.stack, &mut entry.tag)),
            None => {
                let mut tag = 0;
                Some(call(&stack, &mut tag))
            }
        }
    });
    match walked {
        Ok(Some(result)) => result,
        // No modules yet, a foreign stack, or thread-local storage already torn down.
        _ => {
            let mut tag = 0;
            call(&CapturedStack::empty(), &mut tag)
        }
    }
}

/// The stack word at `addr`, if it lies inside `range` (what the unwinder may read).
#[inline]
fn read_word(range: StackRange, addr: u64) -> Result<u64, ()> {
    if addr >= range.low && addr.saturating_add(8) <= range.high && addr.is_multiple_of(8) {
        // SAFETY: addr is 8-aligned and inside this thread's live stack mapping.
        Ok(unsafe { *(addr as *const u64) })
    } else {
        Err(())
    }
}

/// Where a walk starts: the hook's registers and the stack it may read.
struct WalkStart {
    pc: u64,
    sp: u64,
    bp: u64,
    range: StackRange,
}

/// One walk into `out`, recording the stack words read. Returns whether it met an address
/// outside every known module.
fn walk(
    snapshot: &modules::Snapshot,
    rules: &mut RuleCache,
    start: &WalkStart,
    log: &mut ReadLog,
    out: &mut CapturedStack,
) -> bool {
    let range = start.range;
    let mut read_stack = |addr: u64| {
        let value = read_word(range, addr)?;
        log.push(addr, value);
        Ok(value)
    };
    out.len = 0;
    unwind(
        snapshot,
        rules,
        start.pc,
        start.sp,
        start.bp,
        &mut read_stack,
        |address| {
            out.frames[out.len] = address;
            out.len += 1;
            out.len < MAX_FRAMES
        },
    )
}

/// Takes up to `max` frames of the current thread's stack (deeper than a stack key can hold),
/// for event rows with `--call-stack c:N`. Not memoized: events are far rarer than
/// allocations. Must be called with the reentrancy guard held.
#[inline(never)]
pub fn capture_deep(max: usize) -> Vec<u64> {
    let (pc, sp, bp) = registers!();
    let mut frames = Vec::with_capacity(max.min(1024));
    let _ = THREAD.try_with(|cell| {
        let Some(snapshot) = modules::current() else {
            return;
        };
        // SAFETY: as in `with_stack`: this thread's cell, never re-entered.
        let slot = unsafe { &mut *cell.get() };
        let thread = slot.get_or_insert_with(ThreadUnwinder::new);
        let Some(range) = thread.stack_range(sp) else {
            return;
        };
        let mut read_stack = |addr: u64| read_word(range, addr);
        let mut snapshot = snapshot;
        for _attempt in 0..2 {
            frames.clear();
            let met_unknown = unwind(
                snapshot,
                &mut thread.rules,
                pc,
                sp,
                bp,
                &mut read_stack,
                |a| {
                    frames.push(a);
                    frames.len() < max
                },
            );
            if !met_unknown || !modules::refresh_for_unknown_address() {
                break;
            }
            match modules::current() {
                Some(fresh) => snapshot = fresh,
                None => break,
            }
        }
    });
    frames
}

/// The full walk with framehop, handing each frame below the tool's own to `push`, which says
/// whether to go on. Returns whether it met an address outside every module.
fn unwind(
    snapshot: &modules::Snapshot,
    rules: &mut RuleCache,
    pc: u64,
    sp: u64,
    bp: u64,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    mut push: impl FnMut(u64) -> bool,
) -> bool {
    let own = OWN_CODE.get().cloned().unwrap_or(0..0);
    let mut frames =
        snapshot
            .unwinder
            .iter_frames(pc, UnwindRegsX86_64::new(pc, sp, bp), rules, read_stack);
    let mut skipping_own = true;
    let mut met_unknown = false;
    let mut last = 0;
    loop {
        match frames.next() {
            Ok(Some(frame)) => {
                let address = frame.address();
                last = address;
                if skipping_own && (own.contains(&address) || snapshot.is_tool_code(address)) {
                    continue;
                }
                if skipping_own && !snapshot.covers(address) {
                    // The allocator's direct caller is in an unscanned library.
                    met_unknown = true;
                }
                skipping_own = false;
                if !push(address) {
                    return met_unknown;
                }
            }
            Ok(None) => return met_unknown,
            Err(_) => return met_unknown || (last != 0 && !snapshot.covers(last)),
        }
    }
}

fn query_stack_bounds() -> Option<(u64, u64)> {
    // SAFETY: attr is initialised by pthread_getattr_np before use and destroyed after.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok.then(|| (addr as u64, addr as u64 + size as u64))
    }
}
