//! Sampling by bytes (`--sample-bytes=N`): what one sampled block stands for.
//!
//! The runtime keeps a countdown of bytes per thread, drawn from an exponential distribution
//! of mean N, and samples the allocation that takes it to zero. The sample points form a
//! Poisson process over the bytes allocated, so a block of `size` bytes is sampled with
//! probability `p = 1 - exp(-size / N)` whatever came before it. Counting each sampled block as
//! `1 / p` blocks of `size / p` bytes makes every total (allocated, freed, unfreed, a site's
//! live bytes at a beat) an unbiased estimate of the exact figure.

/// A site whose unfreed estimate rests on fewer sampled blocks than this is marked uncertain:
/// with `k` samples the relative error of the estimate is about `1 / sqrt(k)` (over 30 % here).
pub const UNCERTAIN_BELOW_SAMPLES: u64 = 10;

/// How much more than exact series a sampled site's tail may rise and still count as flat
/// (`lsi::assess_with_flat_tail`): two standard errors of an estimate resting on `samples`
/// blocks, `2 / sqrt(samples)`. A ring of 32 sampled blocks turning over reads as rising or
/// falling by about a fifth from beat to beat while its true size stays put.
pub fn tail_noise(samples: u64) -> f64 {
    2.0 / (samples.max(1) as f64).sqrt()
}

/// What one sampled block of `size` bytes counts for, as `(blocks, bytes)`, with sampling by
/// bytes of mean interval `mean` (0: exact, every block counts for itself).
///
/// Deterministic in `size`, so a block's free takes back exactly what its allocation added.
/// Blocks are whole numbers: the count is rounded, and never below 1.
#[inline]
pub fn weight(size: u64, mean: u64) -> (u64, u64) {
    if mean == 0 || size == 0 {
        return (1, size);
    }
    let p = probability(size, mean);
    let blocks = (1.0 / p).round().max(1.0) as u64;
    let bytes = (size as f64 / p).round() as u64;
    (blocks, bytes.max(size))
}

/// The chance that a block of `size` bytes is sampled, for a mean interval of `mean` bytes.
#[inline]
pub fn probability(size: u64, mean: u64) -> f64 {
    if mean == 0 {
        return 1.0;
    }
    // exp_m1 keeps precision for blocks much smaller than the interval (p ≈ size / mean).
    -(-(size as f64) / mean as f64).exp_m1()
}

/// The next countdown: bytes to allocate before the next sample, exponentially distributed
/// with mean `mean`, from a uniform `u` in (0, 1]. At least 1, so a zero-byte allocation is
/// never sampled.
#[inline]
pub fn next_interval(u: f64, mean: u64) -> u64 {
    let u = u.clamp(f64::MIN_POSITIVE, 1.0);
    let bytes = -u.ln() * mean as f64;
    // A draw past 2^62 bytes (u below e^-2^62/mean) would never be reached anyway.
    bytes.clamp(1.0, (1u64 << 62) as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_noise_shrinks_with_the_samples() {
        assert_eq!(tail_noise(0), 2.0);
        assert_eq!(tail_noise(100), 0.2);
        assert_eq!(tail_noise(10_000), 0.02);
    }

    #[test]
    fn exact_mode_counts_each_block_once() {
        assert_eq!(weight(4096, 0), (1, 4096));
        assert_eq!(weight(0, 524288), (1, 0));
    }

    #[test]
    fn small_blocks_stand_for_the_interval_and_large_ones_for_themselves() {
        let n = 524288;
        // p ≈ 64 / n: one sample of 64 bytes stands for about n bytes in n / 64 blocks
        // (1 / p = n / 64 + 1/2 + ..., so 8192.5, rounded up).
        let (blocks, bytes) = weight(64, n);
        assert_eq!(blocks, 8193);
        assert!((bytes as i64 - n as i64).abs() <= 32, "{bytes}");
        // A block of 1 MiB with a 512 KiB interval is sampled with p = 1 - e^-2 = 0.8647.
        let (blocks, bytes) = weight(1 << 20, n);
        assert_eq!(blocks, 1);
        assert_eq!(
            bytes,
            ((1u64 << 20) as f64 / (1.0 - (-2f64).exp())).round() as u64
        );
        // Far larger than the interval: always sampled, counted as it is.
        assert_eq!(weight(64 << 20, n), (1, 64 << 20));
    }

    /// Drawing countdowns and sampling as the runtime does, the weighted sum of sampled blocks
    /// estimates what was allocated.
    #[test]
    fn weighted_samples_estimate_the_total() {
        let mean = 65536;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 1.0) / (1u64 << 53) as f64
        };
        let mut countdown = next_interval(uniform(), mean) as i64;
        let (mut total, mut estimate) = (0u64, 0u64);
        for i in 0..400_000u64 {
            let size = [24, 200, 3000, 70_000, 1 << 20][(i % 5) as usize];
            total += size;
            countdown -= size as i64;
            if countdown <= 0 {
                estimate += weight(size, mean).1;
                countdown = next_interval(uniform(), mean) as i64;
            }
        }
        let error = (estimate as f64 - total as f64).abs() / total as f64;
        assert!(error < 0.02, "estimate {estimate} of {total}");
    }

    #[test]
    fn intervals_are_positive_and_average_the_mean() {
        assert_eq!(next_interval(1.0, 1000), 1);
        assert_eq!(
            next_interval(0.0, 1000),
            (-(f64::MIN_POSITIVE.ln()) * 1000.0) as u64
        );
        let n = 10_000;
        let mean: f64 = (1..=n)
            .map(|i| next_interval(i as f64 / n as f64, 512) as f64)
            .sum::<f64>()
            / n as f64;
        assert!((mean - 512.0).abs() < 10.0, "{mean}");
    }
}
