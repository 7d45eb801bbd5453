//! Counters bumped from every thread on the hot path, spread over cache lines so that threads
//! do not fight over one; summed when the window closes.

use std::sync::atomic::{AtomicU64, Ordering};

use msmemscope_core::host_leak::CountBytes;

use crate::guard::Stripe;

const STRIPES: usize = 32;

/// One stripe's counters, on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct Lane {
    count: AtomicU64,
    bytes: AtomicU64,
}

pub struct StripedCountBytes {
    stripes: [Lane; STRIPES],
}

impl Default for StripedCountBytes {
    fn default() -> Self {
        StripedCountBytes {
            stripes: std::array::from_fn(|_| Lane::default()),
        }
    }
}

impl StripedCountBytes {
    /// Counts a block in `stripe` (the calling thread's, [`crate::guard::Entered::stripe`]).
    #[inline]
    pub fn add(&self, bytes: u64, stripe: Stripe) {
        self.add_blocks(CountBytes { count: 1, bytes }, stripe);
    }

    /// Counts what one sampled block stands for (several blocks, with sampling by bytes).
    #[inline]
    pub fn add_blocks(&self, blocks: CountBytes, stripe: Stripe) {
        let alone = stripe.alone_in(STRIPES);
        let stripe = &self.stripes[stripe.of(STRIPES)];
        bump(&stripe.count, blocks.count, alone);
        bump(&stripe.bytes, blocks.bytes, alone);
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

/// Adds `by` (wrapping: a negated amount subtracts) to a counter of the calling thread's stripe.
/// When the thread is its stripe's only writer (`alone`), a relaxed load and store do: readers
/// only sum, and nothing else writes the stripe while its thread bumps it. Otherwise a locked add.
#[inline(always)]
pub fn bump(counter: &AtomicU64, by: u64, alone: bool) {
    if alone {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(by),
            Ordering::Relaxed,
        );
    } else {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads past the owned stripes share the last one and lose no count, while the first
    /// threads bump theirs without a locked add. The threads numbered here run at once: owners,
    /// the last owned stripe's neighbour, and later threads (numbered as a wrap-around would
    /// put them onto owned stripes).
    #[test]
    fn shared_and_owned_stripes_both_count_every_block() {
        let counts = StripedCountBytes::default();
        let numbers = [
            0,
            1,
            STRIPES - 2,
            STRIPES - 1,
            STRIPES,
            STRIPES + 1,
            2 * STRIPES,
        ];
        let start = std::sync::Barrier::new(numbers.len());
        std::thread::scope(|scope| {
            for number in numbers {
                let (counts, start) = (&counts, &start);
                scope.spawn(move || {
                    start.wait();
                    for _ in 0..2_000_000 {
                        counts.add(3, Stripe::numbered(number));
                    }
                });
            }
        });
        let total = counts.sum();
        assert_eq!(total.count, numbers.len() as u64 * 2_000_000);
        assert_eq!(total.bytes, numbers.len() as u64 * 6_000_000);
    }
}
