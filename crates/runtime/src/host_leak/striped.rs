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
        let stripe = &self.stripes[stripe_index() % STRIPES];
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

/// This thread's stripe: handed out round-robin at a thread's first use, so that the first
/// threads of a program never share one.
#[inline]
pub fn stripe_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! { static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) }; }
    STRIPE
        .try_with(|stripe| {
            let mut index = stripe.get();
            if index == usize::MAX {
                index = NEXT.fetch_add(1, Ordering::Relaxed);
                stripe.set(index);
            }
            index
        })
        .unwrap_or(0)
}
