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
    /// Counts a block in `stripe` (the calling thread's, [`crate::guard::Entered::stripe`]).
    #[inline]
    pub fn add(&self, bytes: u64, stripe: usize) {
        let stripe = &self.stripes[stripe % STRIPES];
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
