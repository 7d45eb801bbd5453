//! The seven block-size buckets of the report.

/// Upper bounds (exclusive) of the first six buckets; the seventh holds everything larger.
const BOUNDS: [u64; 6] = [256, 1 << 10, 4 << 10, 32 << 10, 256 << 10, 1 << 20];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeBucket {
    pub label: &'static str,
}

pub const SIZE_BUCKETS: [SizeBucket; 7] = [
    SizeBucket { label: "0-256B" },
    SizeBucket { label: "256B-1kB" },
    SizeBucket { label: "1kB-4kB" },
    SizeBucket { label: "4kB-32kB" },
    SizeBucket {
        label: "32kB-256kB",
    },
    SizeBucket { label: "256kB-1MB" },
    SizeBucket { label: ">1MB" },
];

/// Index of the bucket a block of `size` bytes falls in.
#[inline]
pub fn bucket_index(size: u64) -> usize {
    BOUNDS
        .iter()
        .position(|&bound| size < bound)
        .unwrap_or(BOUNDS.len())
}

/// Block count and bytes per bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SizeHistogram {
    pub count: [u64; 7],
    pub bytes: [u64; 7],
}

impl SizeHistogram {
    pub fn add(&mut self, size: u64) {
        let i = bucket_index(size);
        self.count[i] += 1;
        self.bytes[i] += size;
    }

    pub fn total_count(&self) -> u64 {
        self.count.iter().sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_edges() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(255), 0);
        assert_eq!(bucket_index(256), 1);
        assert_eq!(bucket_index(1023), 1);
        assert_eq!(bucket_index(1024), 2);
        assert_eq!(bucket_index(4096), 3);
        assert_eq!(bucket_index(32 * 1024), 4);
        assert_eq!(bucket_index(256 * 1024), 5);
        assert_eq!(bucket_index(1 << 20), 6);
        assert_eq!(bucket_index(u64::MAX), 6);
    }

    #[test]
    fn histogram_sums() {
        let mut h = SizeHistogram::default();
        for s in [1, 300, 300, 5000, 2 << 20] {
            h.add(s);
        }
        assert_eq!(h.count, [1, 2, 0, 1, 0, 0, 1]);
        assert_eq!(h.total_bytes(), 1 + 600 + 5000 + (2 << 20));
    }
}
