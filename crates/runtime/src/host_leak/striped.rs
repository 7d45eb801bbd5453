//! Counters bumped from every thread on the hot path, spread over cache lines so that threads
//! do not fight over one; summed when the window closes.

use std::sync::atomic::{AtomicU64, Ordering};

use msmemscope_core::host_leak::CountBytes;

const STRIPES: usize = 32;

#[repr(align(64))]
#[derive(Default)]
struct Stripe {
    count: AtomicU64,
    bytes: AtomicU64,
}

pub struct StripedCountBytes {
    stripes: [Stripe; STRIPES],
}

impl Default for StripedCountBytes {
    fn default() -> Self {
        StripedCountBytes {
            stripes: std::array::from_fn(|_| Stripe::default()),
        }
    }
}

impl StripedCountBytes {
    #[inline]
    pub fn add(&self, bytes: u64) {
        let stripe = &self.stripes[stripe_index()];
        stripe.count.fetch_add(1, Ordering::Relaxed);
        stripe.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn sum(&self) -> CountBytes {
        let mut total = CountBytes::default();
        for s in &self.stripes {
            total.count += s.count.load(Ordering::Relaxed);
            total.bytes += s.bytes.load(Ordering::Relaxed);
        }
        total
    }
}

/// A stripe per thread, chosen from the address of a thread-local (distinct per thread).
#[inline]
pub fn stripe_index() -> usize {
    thread_local! { static MARKER: u8 = const { 0 }; }
    let addr = MARKER.with(|m| m as *const u8 as usize);
    (super::hashing::mix(addr as u64) as usize) % STRIPES
}
