//! Taking the caller's stack from inside a hook.

use std::cell::Cell;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{MustNotAllocateDuringUnwind, Unwinder};

use super::memo::{Memo, MemoKey, ReadLog, StackRange};
use super::modules;
use crate::guard::{self, Entered};

/// Frames kept per stack: the stack key (K = 20, docs/analyses.md#sites-and-stacks).
pub const MAX_FRAMES: usize = msmemscope_core::host_leak::STACK_KEY_FRAMES;

/// Return addresses, innermost (the allocator's caller) first.
#[derive(Clone, Copy)]
pub struct CapturedStack {
    pub frames: [u64; MAX_FRAMES],
    pub len: usize,
    /// The stack went on beyond `MAX_FRAMES`.
    pub cut: bool,
}

impl CapturedStack {
    pub const fn empty() -> CapturedStack {
        CapturedStack {
            frames: [0; MAX_FRAMES],
            len: 0,
            cut: false,
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
    /// [low, high) of this thread's stack, and whether reads there must be checked (a stack
    /// the program switched to: see `query_stack_bounds`); (0, 0, false) until first asked.
    bounds: (u64, u64, bool),
}

impl ThreadUnwinder {
    fn new() -> Box<ThreadUnwinder> {
        Box::new(ThreadUnwinder {
            rules: RuleCache::new_in(),
            memo: Memo::new(),
            bounds: (0, 0, false),
        })
    }

    /// The part of this thread's stack a walk from `sp` may read, or `None` when `sp` lies
    /// in no readable mapping.
    fn stack_range(&mut self, sp: u64) -> Option<StackRange> {
        let (low, high, _) = self.bounds;
        if !(low <= sp && sp < high) {
            self.bounds = query_stack_bounds(sp)?;
        }
        let (low, high, checked) = self.bounds;
        (low <= sp && sp < high).then_some(StackRange {
            low: sp,
            high,
            checked,
        })
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

/// This thread's unwinder (lookups need `&mut`, and threads never share one), freed when the
/// thread exits. A hook holding the guard also finds it through the guard's slots, one
/// thread-local lookup fewer per allocation; this owner clears that copy before freeing it.
struct Owner(Cell<*mut ThreadUnwinder>);

impl Drop for Owner {
    fn drop(&mut self) {
        let unwinder = self.0.replace(std::ptr::null_mut());
        if !unwinder.is_null() {
            guard::forget_unwinder();
            // SAFETY: made by `Box::into_raw` in `with_unwinder`, freed once, here; nothing
            // reaches it any more (this owner and the guard's copy are cleared).
            drop(unsafe { Box::from_raw(unwinder) });
        }
    }
}

thread_local! {
    static THREAD: Owner = const { Owner(Cell::new(std::ptr::null_mut())) };
}

/// `f` with this thread's unwinder, made on first use; `None` once the thread's storage is
/// torn down. Must be called with the reentrancy guard held (`entered`, when the caller has
/// it: the unwinder is then found without a thread-local lookup of its own).
#[inline]
fn with_unwinder<R>(
    entered: Option<&Entered>,
    f: impl FnOnce(&mut ThreadUnwinder) -> R,
) -> Option<R> {
    let known: *mut ThreadUnwinder =
        entered.map_or(std::ptr::null_mut(), |e| e.unwinder().get().cast());
    let unwinder: *mut ThreadUnwinder = if known.is_null() {
        let made = THREAD
            .try_with(|owner| {
                let mut unwinder = owner.0.get();
                if unwinder.is_null() {
                    unwinder = Box::into_raw(ThreadUnwinder::new());
                    owner.0.set(unwinder);
                }
                unwinder
            })
            .ok()?;
        if let Some(entered) = entered {
            entered.unwinder().set(made.cast());
        }
        made
    } else {
        known
    };
    // SAFETY: this thread's unwinder, alive until its owner is torn down (which clears the
    // guard's copy first); only this thread reaches it, never re-entered (the guard keeps
    // hooks out of the runtime while it is in use).
    Some(f(unsafe { &mut *unwinder }))
}

/// Address range of this library's own code: frames inside it are the hook itself.
static OWN_CODE: std::sync::OnceLock<std::ops::Range<u64>> = std::sync::OnceLock::new();

pub fn set_own_code_range(range: std::ops::Range<u64>) {
    let _ = OWN_CODE.set(range);
}

/// Reads this thread's stack bounds now (the runtime's constructor, on the main thread): a
/// program that later runs out of descriptors could not have /proc/self/maps read then, and
/// its allocations would lose their stacks. Must be called with the reentrancy guard held.
pub fn prime_this_thread() {
    let (_, sp, _) = registers!();
    let _ = with_unwinder(None, |thread| thread.stack_range(sp));
}

/// Captures the current thread's stack, skipping the runtime's own frames, and calls `f` with
/// it and its memo tag (0 when the stack was walked afresh, else what `f` stored last time for
/// the same stack). Must be called with the reentrancy guard held: the first call on a thread
/// allocates (rule cache, memo, stack bounds).
pub fn with_stack<R>(
    entered: Option<&Entered>,
    f: impl FnOnce(&CapturedStack, &mut u64) -> R,
) -> R {
    walk_stack(entered, None, f)
}

/// [`with_stack`], the walk ending at the first frame inside `stop` (the interpreter's code,
/// when the allocation's Python frames say the rest): the frames above it are all a stack key
/// keeps then, and walking the interpreter's frames below them is most of the work.
pub fn with_stack_above<R>(
    entered: &Entered,
    stop: std::ops::Range<u64>,
    f: impl FnOnce(&CapturedStack, &mut u64) -> R,
) -> R {
    walk_stack(Some(entered), Some(stop), f)
}

#[inline(never)]
fn walk_stack<R>(
    entered: Option<&Entered>,
    stop: Option<std::ops::Range<u64>>,
    f: impl FnOnce(&CapturedStack, &mut u64) -> R,
) -> R {
    let mut f = Some(f);
    let mut call =
        |stack: &CapturedStack, tag: &mut u64| (f.take().expect("called once"))(stack, tag);
    let (pc, sp, bp) = registers!();
    let walked = with_unwinder(entered, |thread| {
        let snapshot = modules::current()?;
        let range = thread.stack_range(sp)?;
        let key = MemoKey {
            snapshot: snapshot as *const _ as usize,
            sp,
            bp: range.class_of(bp),
            stop: stop.as_ref().map_or(0, |r| r.start),
        };
        if let Some(slot) = thread.memo.lookup(&key, range) {
            let entry = thread.memo.entry(slot)?;
            return Some(call(&entry.stack, &mut entry.tag));
        }
        let start = WalkStart { pc, sp, bp, range };
        let (mut stack, mut log) = (CapturedStack::empty(), ReadLog::new());
        let mut snapshot = snapshot;
        let stop = stop.as_ref();
        let unknown = walk(
            snapshot,
            &mut thread.rules,
            &start,
            &mut log,
            &mut stack,
            stop,
        );
        if unknown.direct_caller || (unknown.deeper() && !unknown.confirmed(snapshot)) {
            // The stack met code of a library loaded since the last scan, or code outside every
            // module (JIT code, a frame-pointer guess through code without unwind tables).
            match modules::refresh_for_unknown_address() {
                modules::Rescan::Changed => {
                    snapshot = modules::current()?;
                    (stack, log) = (CapturedStack::empty(), ReadLog::new());
                    walk(
                        snapshot,
                        &mut thread.rules,
                        &start,
                        &mut log,
                        &mut stack,
                        stop,
                    );
                }
                // Not memoized: the next allocation from here asks for a rescan again.
                _ if unknown.direct_caller => {
                    let mut tag = 0;
                    return Some(call(&stack, &mut tag));
                }
                // A library entered only through libc (its `strdup`, say) shows only as a deeper
                // frame; its rescan must come before the library frees what it got (hooks::got
                // redirects its allocator calls there), so a walk whose check was put off is
                // not memoized either. Addresses a rescan found to be no library's are
                // remembered, so JIT frames keep their walks memoized.
                modules::Rescan::Unchanged => unknown.confirm(snapshot),
                modules::Rescan::Skipped => {
                    let mut tag = 0;
                    return Some(call(&stack, &mut tag));
                }
            }
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
        Some(Some(result)) => result,
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
        if range.checked {
            return checked_read(addr);
        }
        // SAFETY: addr is 8-aligned and inside this thread's live stack mapping.
        Ok(unsafe { *(addr as *const u64) })
    } else {
        Err(())
    }
}

/// A word of this process's memory read by the kernel (`process_vm_readv`): an address that
/// was unmapped meanwhile is an error, never a fault in the program.
#[cold]
fn checked_read(addr: u64) -> Result<u64, ()> {
    let mut word = 0u64;
    let local = libc::iovec {
        iov_base: (&mut word as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: reads 8 bytes of our own process into `word`; the kernel checks the source.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == 8 {
        Ok(word)
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

/// Where a walk met addresses outside every known module.
#[derive(Clone, Copy, Default)]
struct Unknown {
    /// The allocator's direct caller.
    direct_caller: bool,
    /// The first frames further out, `deeper_len` of them.
    deeper: [u64; 4],
    deeper_len: usize,
}

impl Unknown {
    fn deeper(&self) -> bool {
        self.deeper_len > 0
    }

    fn add_deeper(&mut self, address: u64) {
        if self.deeper_len < self.deeper.len() && !self.deeper[..self.deeper_len].contains(&address)
        {
            self.deeper[self.deeper_len] = address;
            self.deeper_len += 1;
        }
    }

    /// Every deeper unknown frame is one a rescan already found outside every library.
    fn confirmed(&self, snapshot: &modules::Snapshot) -> bool {
        self.deeper[..self.deeper_len]
            .iter()
            .all(|&a| modules::is_confirmed_unknown(snapshot, a))
    }

    fn confirm(&self, snapshot: &modules::Snapshot) {
        for &a in &self.deeper[..self.deeper_len] {
            modules::confirm_unknown(snapshot, a);
        }
    }
}

/// One walk into `out`, recording the stack words read; it ends before the first frame in
/// `stop`.
fn walk(
    snapshot: &modules::Snapshot,
    rules: &mut RuleCache,
    start: &WalkStart,
    log: &mut ReadLog,
    out: &mut CapturedStack,
    stop: Option<&std::ops::Range<u64>>,
) -> Unknown {
    let range = start.range;
    let mut read_stack = |addr: u64| {
        let value = read_word(range, addr)?;
        log.push(addr, value);
        Ok(value)
    };
    out.len = 0;
    out.cut = false;
    unwind(snapshot, rules, start, &mut read_stack, |address| {
        if stop.is_some_and(|r| r.contains(&address)) {
            return false;
        }
        // One frame past the key's depth is only looked at, to know the stack was cut.
        if out.len == MAX_FRAMES {
            out.cut = true;
            return false;
        }
        out.frames[out.len] = address;
        out.len += 1;
        true
    })
}

/// Takes up to `max` frames of the current thread's stack (deeper than a stack key can hold),
/// for event rows with `--call-stack c:N`. Not memoized: events are far rarer than
/// allocations. Must be called with the reentrancy guard held.
#[inline(never)]
pub fn capture_deep(max: usize) -> Vec<u64> {
    let (pc, sp, bp) = registers!();
    let mut frames = Vec::with_capacity(max.min(1024));
    let _ = with_unwinder(None, |thread| {
        let Some(snapshot) = modules::current() else {
            return;
        };
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
                &WalkStart { pc, sp, bp, range },
                &mut read_stack,
                |a| {
                    frames.push(a);
                    frames.len() < max
                },
            );
            let unknown = met_unknown.direct_caller || met_unknown.deeper();
            if !unknown || modules::refresh_for_unknown_address() != modules::Rescan::Changed {
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
/// whether to go on. Returns where it met addresses outside every module.
fn unwind(
    snapshot: &modules::Snapshot,
    rules: &mut RuleCache,
    start: &WalkStart,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    mut push: impl FnMut(u64) -> bool,
) -> Unknown {
    let (pc, sp, bp, range) = (start.pc, start.sp, start.bp, start.range);
    let own = OWN_CODE.get().cloned().unwrap_or(0..0);
    let mut frames =
        snapshot
            .unwinder
            .iter_frames(pc, UnwindRegsX86_64::new(pc, sp, bp), rules, read_stack);
    let mut skipping_own = true;
    let mut unknown = Unknown::default();
    let mut last = 0;
    loop {
        match frames.next() {
            Ok(Some(frame)) => {
                let address = frame.address();
                last = address;
                if skipping_own && (own.contains(&address) || snapshot.is_tool_code(address)) {
                    continue;
                }
                if !snapshot.covers(address) {
                    if skipping_own {
                        unknown.direct_caller = true;
                    } else {
                        unknown.add_deeper(address);
                    }
                }
                if range.checked && !skipping_own && !snapshot.covers(address) {
                    // On a stack the program switched to, the walk ends at its root (what
                    // lies above it in the mapping is not a caller).
                    return unknown;
                }
                skipping_own = false;
                if !push(address) {
                    return unknown;
                }
            }
            Ok(None) => return unknown,
            Err(_) => {
                // The walk stopped at a frame whose code no module covers.
                if last != 0 && !snapshot.covers(last) && !unknown.direct_caller {
                    unknown.add_deeper(last);
                }
                return unknown;
            }
        }
    }
}

/// The part of the current thread's stack that a walk from `sp` may read: `[low, high)`.
///
/// Not from `pthread_getattr_np`: it holds the thread descriptor's lock while it allocates (its
/// `fopen` of /proc/self/maps for the main thread, its cpuset for the others), so the hook it
/// re-enters would wait on the lock its own thread holds. Instead, the mapping that contains
/// `sp`, read directly only where it is this thread's stack (the range is cached and read
/// later):
/// - the main thread's `[stack]`: it grows down, so a later sp below `low` asks again;
/// - a thread's stack as glibc lays it out: the thread descriptor (`pthread_self()`, the TCB)
///   sits above the stack in the same mapping, also for a stack the program supplied, and
///   nothing of the stack lies above it, so the range ends there: a supplied stack inside a
///   larger mapping is not read past its own end.
/// - any other readable mapping (a `makecontext`/`swapcontext` stack in the heap or a pool, an
///   alternate signal stack): the walk may read up to the mapping's end, every read checked by
///   the kernel, since another thread may shrink or unmap that memory meanwhile.
fn query_stack_bounds(sp: u64) -> Option<(u64, u64, bool)> {
    let mapping = super::maps::mapping_containing(sp)?;
    if !mapping.readable {
        return None;
    }
    if mapping.main_stack {
        return Some((mapping.start, mapping.end, false));
    }
    // SAFETY: pthread_self only reads the thread pointer; it takes no lock.
    let tcb = unsafe { libc::pthread_self() } as u64;
    if mapping.start <= tcb && tcb < mapping.end && sp < tcb {
        return Some((mapping.start, tcb, false));
    }
    Some((mapping.start, mapping.end, true))
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Frames a walk found, told when the thread's storage is torn down.
    struct WalkAtExit(Arc<Mutex<Option<usize>>>);

    impl Drop for WalkAtExit {
        fn drop(&mut self) {
            let entered = Entered::try_enter();
            let frames = with_stack(entered.as_ref(), |stack, _| stack.len);
            *self.0.lock().unwrap() = Some(frames);
        }
    }

    thread_local! {
        static AT_EXIT: RefCell<Option<WalkAtExit>> = const { RefCell::new(None) };
    }

    /// A hook that runs in a thread-local's destructor after the unwinder was freed (glibc runs
    /// them in the reverse order of their first use) must find neither the unwinder nor the
    /// guard's copy of its pointer: no stack, not one read through freed memory.
    #[test]
    fn a_walk_after_the_thread_freed_its_unwinder_finds_no_stack() {
        modules::refresh(true);
        let at_exit = Arc::new(Mutex::new(None));
        let told = at_exit.clone();
        std::thread::spawn(move || {
            // First used before the unwinder: destroyed after it.
            AT_EXIT.with(|slot| *slot.borrow_mut() = Some(WalkAtExit(told)));
            let entered = Entered::try_enter().expect("outside the runtime");
            let frames = with_stack(Some(&entered), |stack, _| stack.len);
            assert!(frames > 0, "a live thread's walk finds its frames");
            assert!(!entered.unwinder().get().is_null());
        })
        .join()
        .unwrap();
        assert_eq!(*at_exit.lock().unwrap(), Some(0));
    }
}
