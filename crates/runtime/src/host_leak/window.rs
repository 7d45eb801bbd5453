//! The detection window's lifecycle. At most one window is open per process; hooks find its
//! ledger through one atomic pointer, so a closed window costs them a single load.
//!
//! A closed window gives its tables back once its report is written (`Ledger::release`; the
//! module comment of `ledger` has the protocol), so a program that opens and closes windows
//! over and over keeps only each ledger's small header. The header is never freed: a hook that
//! loaded the pointer just before it was swapped out may still be reading it.
//!
//! ```text
//!   (no window) --open--> Open --close--> (no window, report written)
//!        ^                  |
//!        +----fork child----+   (the child drops the window without touching its locks)
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::aggregate;
use super::ledger::Ledger;
use super::settings::WindowSettings;
use crate::log;
use msmemscope_core::run_dir::RunDir;

static ACTIVE: AtomicPtr<Ledger> = AtomicPtr::new(std::ptr::null_mut());
static LAST_STAGE: AtomicU32 = AtomicU32::new(0);
/// Held by `close` from the swap to the release, and by `snapshot` while it walks: a snapshot
/// reads the stack counters with no shard lock, so it must not overlap a release.
static WALKS: Mutex<()> = Mutex::new(());

/// How long releasing a closed window's tables waits for each lock. A hook holds one only for
/// a table operation; past this the tables that could not be swept stay (and are logged).
const RELEASE_DEADLINE: Duration = Duration::from_secs(10);

/// How long window-close aggregation may wait for ledger locks.
pub const AGGREGATION_DEADLINE: Duration = Duration::from_secs(120);

/// How long an interim snapshot may wait for one ledger lock: the program keeps running, so a
/// shard held that long is skipped and the snapshot says so.
pub const SNAPSHOT_DEADLINE: Duration = Duration::from_secs(2);

/// The open window's ledger.
#[inline(always)]
pub fn active() -> Option<&'static Ledger> {
    let ptr = ACTIVE.load(Ordering::Acquire);
    // SAFETY: a published ledger's header is leaked and never freed (a hook on another thread
    // may still hold it after the window closed), so the reference stays valid; only its
    // tables are given back, under the protocol in `ledger`.
    unsafe { ptr.as_ref() }
}

/// Opens a window with `settings`; returns its stage number, or `None` if one is open.
pub fn open(settings: WindowSettings) -> Option<u32> {
    let stage = LAST_STAGE.load(Ordering::Relaxed) + 1;
    let ledger = Box::into_raw(Box::new(Ledger::new(settings, stage)));
    if ACTIVE
        .compare_exchange(
            std::ptr::null_mut(),
            ledger,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: never published, so nothing else refers to it.
        drop(unsafe { Box::from_raw(ledger) });
        return None;
    }
    LAST_STAGE.store(stage, Ordering::Relaxed);
    // The hooks take the time at every allocation and free now: a keeper may hold it for them.
    crate::clock::want_ticks(true);
    log::info(&format!("host-leak window {stage} opened"));
    Some(stage)
}

/// Closes the open window and writes its report into `run_dir/host_leak/`. Returns the path
/// of the overview, or `None` when no window was open or writing failed (logged).
pub fn close(run_dir: &RunDir) -> Option<PathBuf> {
    let _walks = WALKS.lock().unwrap_or_else(|e| e.into_inner());
    let ptr = ACTIVE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    crate::clock::want_ticks(false);
    // SAFETY: see `active`: ledger headers are never freed.
    let ledger = unsafe { ptr.as_ref() }?;
    let deadline = Instant::now() + AGGREGATION_DEADLINE;
    // Hooks that loaded the ledger before the swap stop changing it, so the report is exact.
    if !ledger.freeze(deadline) {
        log::error(&format!(
            "host-leak window {}: a ledger lock was still held at close",
            ledger.stage
        ));
    }
    let (report, details) = aggregate::build_report(ledger, deadline, false);
    let written = aggregate::write_report(run_dir, &report, details.as_deref());
    // Freed before the tables go, so the close never holds both (the report owns copies).
    drop(details);
    drop(report);
    if !ledger.release(Instant::now() + RELEASE_DEADLINE) {
        log::error(&format!(
            "host-leak window {}: ledger locks still held after {} s; part of its tables stay \
             allocated",
            ledger.stage,
            RELEASE_DEADLINE.as_secs()
        ));
    }
    match written {
        Ok(path) => {
            log::info(&format!(
                "host-leak window {} closed: {}",
                ledger.stage,
                path.display()
            ));
            Some(path)
        }
        Err(e) => {
            log::error(&format!(
                "host-leak window {}: cannot write the report: {e}",
                ledger.stage
            ));
            None
        }
    }
}

/// The interim overview of the open window (`display host_leak summary`), or `None` when no
/// window is open. The window stays open and its accounting goes on: the walk takes one shard
/// lock at a time, adds no point to the beat series, and writes no file. Allocations that
/// arrive during the walk are counted and reported as the snapshot's freeze note.
pub fn snapshot() -> Option<String> {
    let _walks = WALKS.lock().unwrap_or_else(|e| e.into_inner());
    // Loaded under the lock: `close` swaps the pointer out under it too, so this ledger is not
    // released before the walk ends.
    let ledger = active()?;
    ledger.begin_snapshot();
    let (mut report, _) = aggregate::build_report(ledger, Instant::now() + SNAPSHOT_DEADLINE, true);
    report.snapshot_freeze = ledger.end_snapshot();
    Some(msmemscope_core::host_leak::overview::render_overview(
        &report,
    ))
}

/// In a forked child: forget the window without touching its locks (another thread of the
/// parent may have held one at the moment of the fork). The child is not tracked.
pub fn detach_after_fork() {
    ACTIVE.store(std::ptr::null_mut(), Ordering::Release);
}
