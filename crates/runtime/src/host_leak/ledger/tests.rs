//! The ledger's closing protocol against hooks still running, and the header's size.

use std::sync::atomic::Ordering;
use std::time::Instant;

use msmemscope_core::config::HostLeakMode;

use super::{Ledger, Taken};
use crate::clock::realtime_ns;
use crate::guard::Entered;
use crate::host_leak::settings::WindowSettings;

fn settings() -> WindowSettings {
    WindowSettings {
        mode: HostLeakMode::Summary,
        block_size_threshold: 0,
        sample_rate: 1,
        sample_rate_requested: 1,
        sample_bytes: 0,
        block_cap: 1 << 16,
        overflow_cap: 1 << 10,
        stack_cap: 1 << 12,
        top_n: 10,
        beat_ms: 10,
        c_depth: crate::unwind::MAX_FRAMES,
        python_depth: 0,
        python_objects: true,
        beat_fixed: true,
    }
}

/// The guard, as a hook holds it (the tests run outside any hook).
fn entered() -> Entered {
    Entered::try_enter().expect("not inside the runtime")
}

fn far() -> Instant {
    Instant::now() + std::time::Duration::from_secs(30)
}

/// Real blocks: a free of a block the ledger does not know reads its usable size.
fn blocks(n: usize) -> Vec<usize> {
    // SAFETY: plain glibc allocations (the hooks are not exported in unit tests).
    (0..n)
        .map(|_| unsafe { libc::malloc(64) } as usize)
        .collect()
}

fn free_all(ptrs: &[usize]) {
    for &p in ptrs {
        // SAFETY: each came from `blocks` and is freed once.
        unsafe { libc::free(p as *mut libc::c_void) };
    }
}

fn live_blocks(ledger: &Ledger) -> u64 {
    ledger.live_now(far()).0.count
}

#[test]
fn a_frozen_ledger_ignores_late_hooks_and_a_released_one_is_empty() {
    let ledger = Ledger::new(settings(), 1);
    let ptrs = blocks(8);
    for &p in &ptrs[..4] {
        ledger.on_alloc(p, 64, &entered());
    }
    assert_eq!(live_blocks(&ledger), 4);
    let taken = ledger.take(ptrs[0], &entered());
    assert!(matches!(taken, Taken::Block(_)));
    assert!(ledger.freeze(far()));
    // Hooks that loaded the ledger before it closed change nothing: no block, no free.
    for &p in &ptrs[4..] {
        ledger.on_alloc(p, 64, &entered());
    }
    assert!(matches!(ledger.take(ptrs[1], &entered()), Taken::Ignored));
    ledger.take_beat(1.0, false);
    // A realloc whose real call failed after the window closed puts nothing back.
    ledger.restore(ptrs[0], taken, ledger.stacks.generation(), &entered());
    assert_eq!(live_blocks(&ledger), 3);
    let (stacks, unknown, _) = ledger.stacks.collect(far(), |_| true);
    let allocated: u64 =
        stacks.iter().map(|s| s.counts.allocated.count).sum::<u64>() + unknown.allocated.count;
    let freed: u64 = stacks.iter().map(|s| s.counts.freed.count).sum::<u64>() + unknown.freed.count;
    assert_eq!((allocated, freed), (4, 1));
    assert_eq!(
        ledger.stacks.allocated_total().count + unknown.allocated.count,
        4
    );
    // The closing sample is still taken between freeze and release.
    ledger.take_beat(1.0, true);
    assert_eq!(ledger.beats.summary().beats_taken, 1);

    assert!(ledger.release(far()));
    assert_eq!(live_blocks(&ledger), 0);
    ledger.on_alloc(ptrs[4], 64, &entered());
    ledger.take_beat(2.0, false);
    assert!(matches!(ledger.take(ptrs[2], &entered()), Taken::Ignored));
    assert_eq!(live_blocks(&ledger), 0);
    let (stacks, unknown, unread) = ledger.stacks.collect(far(), |_| true);
    assert!(stacks.is_empty());
    assert_eq!(unknown.allocated.count, 0);
    assert_eq!(unread, 0);
    assert_eq!(ledger.beats.summary().series, 0);
    // Twice is harmless.
    assert!(ledger.release(far()));
    free_all(&ptrs);
}

#[test]
fn release_races_hooks_on_other_threads() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    for _ in 0..20 {
        // Leaked, as a window's ledger is: the threads may still read its header.
        let ledger: &'static Ledger = Box::leak(Box::new(Ledger::new(settings(), 1)));
        let go = Arc::new(AtomicBool::new(true));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let go = go.clone();
                std::thread::spawn(move || {
                    let ptrs = blocks(64);
                    while go.load(Ordering::Relaxed) {
                        for &p in &ptrs {
                            ledger.on_alloc(p, 64, &entered());
                        }
                        for &p in &ptrs {
                            let taken = ledger.take(p, &entered());
                            ledger.settle_free(p, taken, &entered());
                        }
                        let beat = ledger.beats.beat_at(realtime_ns());
                        ledger.take_beat(beat, false);
                    }
                    free_all(&ptrs);
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(ledger.freeze(far()));
        let frozen = live_blocks(ledger);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(
            live_blocks(ledger),
            frozen,
            "a late hook changed a frozen ledger"
        );
        assert!(ledger.release(far()));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(live_blocks(ledger), 0, "a late hook grew a released table");
        go.store(false, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
    }
}

/// What stays of a closed window: the header, whose size the tests of repeated windows
/// allow for.
#[test]
fn the_header_is_small() {
    let size = std::mem::size_of::<Ledger>();
    assert!(size < 40 * 1024, "Ledger header is {size} bytes");
}

/// Sampling by bytes: only sampled blocks enter, each counted for what it estimates, and the
/// free of any other address is told by the filter and leaves the ledger untouched.
#[test]
fn sampling_by_bytes_keeps_samples_weighted_and_skips_other_frees() {
    let mean = 16384;
    let ledger = Ledger::new(
        WindowSettings {
            sample_bytes: mean,
            ..settings()
        },
        1,
    );
    // Addresses only: with sampling by bytes no free reads a block's usable size.
    let ptrs: Vec<usize> = (0..20_000).map(|i| 0x1000_0000 + i * 2048).collect();
    let admitted: Vec<usize> = ptrs
        .iter()
        .copied()
        .filter(|&p| ledger.on_alloc(p, 1024, &entered()))
        .collect();
    // p = 1 - e^(-1024/16384) = 0.0606: about 1212 of 20,000.
    assert!((900..1550).contains(&admitted.len()), "{}", admitted.len());
    assert_eq!(live_blocks(&ledger), admitted.len() as u64);
    // Without frames to unwind here, the blocks may go to the unknown bucket.
    let (_, unknown, _) = ledger.stacks.collect(far(), |_| true);
    let mut total = ledger.stacks.allocated_total();
    total.merge(unknown.allocated);
    let truth = 20_000.0 * 1024.0;
    assert!(
        (total.bytes as f64 - truth).abs() < 0.15 * truth,
        "estimated {} bytes of {truth}",
        total.bytes
    );
    let (per_block, per_bytes) = msmemscope_core::host_leak::sampling::weight(1024, mean);
    assert_eq!(
        total,
        msmemscope_core::host_leak::CountBytes {
            count: per_block * admitted.len() as u64,
            bytes: per_bytes * admitted.len() as u64,
        }
    );
    // Every free: a sampled block leaves the ledger, any other is Unsampled.
    let mut unsampled = 0;
    for &p in &ptrs {
        match ledger.take(p, &entered()) {
            Taken::Block(b) => assert!(admitted.contains(&p) && b.size == 1024),
            Taken::Unsampled => unsampled += 1,
            _ => panic!("neither sampled nor unsampled"),
        }
    }
    assert_eq!(unsampled, ptrs.len() - admitted.len());
    assert_eq!(live_blocks(&ledger), 0);
    let (stacks, unknown, _) = ledger.stacks.collect(far(), |_| true);
    let freed: u64 = stacks.iter().map(|s| s.counts.freed.bytes).sum::<u64>() + unknown.freed.bytes;
    assert_eq!(freed, total.bytes);
}
