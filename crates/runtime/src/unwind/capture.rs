//! Taking the caller's stack from inside a hook.

use std::cell::{Cell, UnsafeCell};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{MustNotAllocateDuringUnwind, Unwinder};

use super::memo::{Memo, MemoKey, ReadLog};
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
}

thread_local! {
    // Per thread: lookups need `&mut`, and threads never share one.
    static THREAD: UnsafeCell<Option<Box<ThreadUnwinder>>> = const { UnsafeCell::new(None) };
    // [low, high) of this thread's stack; (0, 0) until first asked.
    static STACK_BOUNDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Address range of this library's own code: frames inside it are the hook itself.
static OWN_CODE: std::sync::OnceLock<std::ops::Range<u64>> = std::sync::OnceLock::new();

pub fn set_own_code_range(range: std::ops::Range<u64>) {
    let _ = OWN_CODE.set(range);
}

/// Captures the current thread's stack, skipping the runtime's own frames. Must be called with
/// the reentrancy guard held: the first call on a thread allocates (rule cache, stack bounds).
pub fn capture_stack(out: &mut CapturedStack) {
    if walk(out) {
        // The stack met code of a library loaded since the last scan: take it again with the
        // new modules.
        if modules::refresh_for_unknown_address() {
            walk(out);
        }
    }
}

/// Walks the stack into `out`; returns whether it met an address outside every known module.
#[inline(never)]
fn walk(out: &mut CapturedStack) -> bool {
    out.len = 0;
    let Some(snapshot) = modules::current() else {
        return false;
    };
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
    let Some((low, high)) = stack_bounds(sp) else {
        return false;
    };
    let key = MemoKey {
        snapshot: snapshot as *const _ as usize,
        sp,
        bp: bp_key(bp, low, high),
    };
    THREAD
        .try_with(|cell| {
            // SAFETY: the cell is only touched by this thread, and never re-entered (the guard
            // keeps hooks from running inside this function).
            let slot = unsafe { &mut *cell.get() };
            let thread = slot.get_or_insert_with(|| {
                Box::new(ThreadUnwinder {
                    rules: RuleCache::new_in(),
                    memo: Memo::new(),
                })
            });
            if thread.memo.lookup(&key, out) {
                return false;
            }
            let mut reads = ReadLog::new();
            let mut read_stack = |addr: u64| {
                if addr >= low && addr.saturating_add(8) <= high && addr.is_multiple_of(8) {
                    // SAFETY: addr is 8-aligned and inside this thread's live stack mapping.
                    let value = unsafe { *(addr as *const u64) };
                    reads.push(addr, value);
                    Ok(value)
                } else {
                    reads.push_failed();
                    Err(())
                }
            };
            let met_unknown = unwind(
                snapshot,
                &mut thread.rules,
                pc,
                sp,
                bp,
                &mut read_stack,
                out,
            );
            if !met_unknown {
                thread.memo.store(key, &reads, out);
            }
            met_unknown
        })
        .unwrap_or(false)
}

/// The full walk with framehop. Returns whether it met an address outside every module.
fn unwind(
    snapshot: &modules::Snapshot,
    rules: &mut RuleCache,
    pc: u64,
    sp: u64,
    bp: u64,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    out: &mut CapturedStack,
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
                if skipping_own && own.contains(&address) {
                    continue;
                }
                if skipping_own && !snapshot.covers(address) {
                    // The allocator's direct caller is in an unscanned library.
                    met_unknown = true;
                }
                skipping_own = false;
                out.frames[out.len] = address;
                out.len += 1;
                if out.len == MAX_FRAMES {
                    return met_unknown;
                }
            }
            Ok(None) => return met_unknown,
            Err(_) => return met_unknown || (last != 0 && !snapshot.covers(last)),
        }
    }
}

/// The initial frame pointer matters to the unwinder only as an address it may read: values
/// outside the stack behave alike (every read of them fails), so they share one key.
fn bp_key(bp: u64, low: u64, high: u64) -> u64 {
    if bp == 0 || (low <= bp && bp < high) {
        bp
    } else {
        u64::MAX
    }
}

/// This thread's stack range, or `None` when `sp` lies outside it (an alternate signal stack or
/// a user-level stack switch): then no stack is taken rather than reading unknown memory.
fn stack_bounds(sp: u64) -> Option<(u64, u64)> {
    STACK_BOUNDS
        .try_with(|cell| {
            let (mut low, mut high) = cell.get();
            if !(low <= sp && sp < high) {
                (low, high) = query_stack_bounds()?;
                cell.set((low, high));
            }
            (low <= sp && sp < high).then_some((sp, high))
        })
        .ok()
        .flatten()
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
