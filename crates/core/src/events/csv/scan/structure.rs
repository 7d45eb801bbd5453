//! Where a chunk's fields and records end, found 64 bytes at a time with bit masks: a comma or
//! line end outside quotes ends a field or a record. Which bytes are inside quotes is the
//! running parity of the quotes before them (a prefix XOR of the quote mask), the same rule
//! the row-by-row reader ends records by.
//!
//! Splitting fields by parity agrees with the row-by-row reader only where quoting is
//! regular: every quote opens a field, closes one right before its comma or line end, or is
//! one of a doubled pair inside a quoted field. Any other quote (`a"b`, `"a"b`) is reported as
//! [`IRREGULAR`], a chunk that ends inside quotes is told by [`Found::open_at_end`], and such
//! records are split by that reader's own function instead. A dump's Attr objects are quoted with about twenty doubled quotes each: finding
//! only the dozen field ends of a row, rather than every quote, is most of this module's gain.

/// The kind of an entry, in its top two bits; the low 30 bits are the offset in the chunk.
pub(super) const COMMA: u32 = 0;
pub(super) const NEWLINE: u32 = 1 << 30;
/// A line end inside quotes: part of a field, but it counts as a line.
pub(super) const INNER_NEWLINE: u32 = 2 << 30;
/// A quote that is not regular (see the module's comment).
pub(super) const IRREGULAR: u32 = 3 << 30;
pub(super) const KIND: u32 = 3 << 30;
/// The largest chunk offsets can describe.
pub(super) const MAX_CHUNK: usize = (1 << 30) - 1;

/// The quote, comma and line-end bits of 64 bytes.
#[derive(Clone, Copy, Default)]
struct Raw {
    quote: u64,
    comma: u64,
    newline: u64,
    /// Bytes of 0x80 and above (not ASCII).
    high: u64,
}

/// A block's bits once the quote parity is known.
#[derive(Clone, Copy, Default)]
struct Block {
    newline: u64,
    inside: u64,
    /// Commas and line ends outside quotes.
    ends: u64,
    /// Quotes that open a quoted stretch, and those that close one.
    opening: u64,
    closing: u64,
}

impl Block {
    /// `inside_before` is all ones when the block starts inside quotes.
    fn new(raw: Raw, inside_before: u64) -> Block {
        let inside = prefix_xor(raw.quote) ^ inside_before;
        Block {
            newline: raw.newline,
            inside,
            ends: (raw.comma | raw.newline) & !inside,
            // A quote's own bit is the parity after it: set for one that opens.
            opening: raw.quote & inside,
            closing: raw.quote & !inside,
        }
    }
}

/// Bit i of the result: the XOR of bits 0..=i of `x`.
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// What [`find`] tells besides its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// Whether the chunk ends inside quotes.
    pub(super) open_at_end: bool,
    /// Whether every byte is ASCII (so the chunk is UTF-8).
    pub(super) ascii: bool,
}

/// Appends to `out` the chunk's field and record ends, inner line ends and irregular quotes,
/// in order, and sets `quotes` to the chunk's quote bits (bit i of word k: byte 64k + i). `data` must be at most
/// [`MAX_CHUNK`] bytes and start at a record start.
pub(super) fn find(data: &[u8], out: &mut Vec<u32>, quotes: &mut Vec<u64>) -> Found {
    assert!(data.len() <= MAX_CHUNK, "a chunk too large for its offsets");
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU was just found to have AVX2, which is all `find_avx2` needs.
            return unsafe { find_avx2(data, out, quotes) };
        }
        run::<Sse2>(data, out, quotes)
    }
    #[cfg(not(target_arch = "x86_64"))]
    run::<Plain>(data, out, quotes)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_avx2(data: &[u8], out: &mut Vec<u32>, quotes: &mut Vec<u64>) -> Found {
    run::<Avx2>(data, out, quotes)
}

/// A way to take the masks of 64 bytes.
trait Masks {
    fn raw(bytes: &[u8; 64]) -> Raw;
}

#[cfg(any(test, not(target_arch = "x86_64")))]
struct Plain;
#[cfg(any(test, not(target_arch = "x86_64")))]
impl Masks for Plain {
    #[inline(always)]
    fn raw(bytes: &[u8; 64]) -> Raw {
        raw_plain(bytes)
    }
}

#[cfg(target_arch = "x86_64")]
struct Sse2;
#[cfg(target_arch = "x86_64")]
impl Masks for Sse2 {
    #[inline(always)]
    fn raw(bytes: &[u8; 64]) -> Raw {
        raw_sse2(bytes)
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx2;
#[cfg(target_arch = "x86_64")]
impl Masks for Avx2 {
    #[inline(always)]
    fn raw(bytes: &[u8; 64]) -> Raw {
        // SAFETY: `Avx2` is only used by `find_avx2`, which runs on CPUs with AVX2.
        unsafe { raw_avx2(bytes) }
    }
}

/// The masks of 64 bytes, one bit a byte.
#[inline(always)]
#[cfg(any(test, not(target_arch = "x86_64")))]
fn raw_plain(bytes: &[u8; 64]) -> Raw {
    let mut raw = Raw::default();
    for (i, &b) in bytes.iter().enumerate() {
        let bit = 1u64 << i;
        match b {
            b'"' => raw.quote |= bit,
            b',' => raw.comma |= bit,
            b'\n' => raw.newline |= bit,
            0x80.. => raw.high |= bit,
            _ => {}
        }
    }
    raw
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn raw_sse2(bytes: &[u8; 64]) -> Raw {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    let mut raw = Raw::default();
    // SAFETY: SSE2 is part of the x86_64 baseline; each load reads 16 of the array's 64
    // bytes (offsets 0, 16, 32, 48), and `_mm_loadu_si128` takes unaligned addresses.
    unsafe {
        let (quote, comma, newline) = (
            _mm_set1_epi8(b'"' as i8),
            _mm_set1_epi8(b',' as i8),
            _mm_set1_epi8(b'\n' as i8),
        );
        for part in 0..4 {
            let v = _mm_loadu_si128(bytes.as_ptr().add(16 * part).cast::<__m128i>());
            let shift = 16 * part;
            let bits = |m| u64::from(_mm_movemask_epi8(m) as u16) << shift;
            raw.quote |= bits(_mm_cmpeq_epi8(v, quote));
            raw.comma |= bits(_mm_cmpeq_epi8(v, comma));
            raw.newline |= bits(_mm_cmpeq_epi8(v, newline));
            raw.high |= bits(v);
        }
    }
    raw
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn raw_avx2(bytes: &[u8; 64]) -> Raw {
    use std::arch::x86_64::{
        __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_set1_epi8,
    };
    let mut raw = Raw::default();
    // SAFETY: the caller runs on a CPU with AVX2; each load reads 32 of the array's 64 bytes
    // (offsets 0 and 32), and `_mm256_loadu_si256` takes unaligned addresses.
    unsafe {
        let (quote, comma, newline) = (
            _mm256_set1_epi8(b'"' as i8),
            _mm256_set1_epi8(b',' as i8),
            _mm256_set1_epi8(b'\n' as i8),
        );
        for part in 0..2 {
            let v = _mm256_loadu_si256(bytes.as_ptr().add(32 * part).cast::<__m256i>());
            let shift = 32 * part;
            let bits = |m| u64::from(_mm256_movemask_epi8(m) as u32) << shift;
            raw.quote |= bits(_mm256_cmpeq_epi8(v, quote));
            raw.comma |= bits(_mm256_cmpeq_epi8(v, comma));
            raw.newline |= bits(_mm256_cmpeq_epi8(v, newline));
            raw.high |= bits(v);
        }
    }
    raw
}

/// The masks of block `k` of `data`.
#[inline(always)]
fn raw_of<M: Masks>(data: &[u8], k: usize) -> Raw {
    match data.get(64 * k..64 * k + 64) {
        Some(whole) => M::raw(whole.try_into().expect("64 bytes")),
        None => {
            // The last, partial block: padded with bytes that are no delimiter.
            let mut padded = [0u8; 64];
            padded[..data.len() - 64 * k].copy_from_slice(&data[64 * k..]);
            M::raw(&padded)
        }
    }
}

#[inline(always)]
fn run<M: Masks>(data: &[u8], out: &mut Vec<u32>, quotes: &mut Vec<u64>) -> Found {
    out.clear();
    quotes.clear();
    let n = data.len();
    let blocks = n.div_ceil(64);
    let carry = |block: &Block| 0u64.wrapping_sub(block.inside >> 63);
    let mut high = 0u64;
    quotes.resize(blocks, 0);
    let mut block_of = |k: usize, inside_before: u64| {
        let raw = raw_of::<M>(data, k);
        high |= raw.high;
        if let Some(slot) = quotes.get_mut(k) {
            *slot = raw.quote;
        }
        Block::new(raw, inside_before)
    };
    let mut current = if blocks > 0 {
        block_of(0, 0)
    } else {
        Block::default()
    };
    // The bits of the byte before the current block: the chunk's start is a record start.
    let mut end_before = 1u64;
    let mut closing_before = 0u64;
    out.reserve(n / 8);
    for k in 0..blocks {
        let next = (k + 1 < blocks).then(|| block_of(k + 1, carry(&current)));
        // The byte after the block: the next block's first, or the chunk's end, which ends a
        // field as a comma would.
        let (opening_after, end_after) = next.map_or((0, 1), |b| (b.opening & 1, b.ends & 1));
        let tail = n - 64 * k;
        let b = current;
        let ends_or_stop = if tail < 64 {
            b.ends | 1 << tail
        } else {
            b.ends
        };
        // A closing quote right before an opening one is a doubled quote inside a field.
        let doubled_open = b.opening & (b.closing << 1 | closing_before);
        let doubled_close = b.closing & (b.opening >> 1 | opening_after << 63);
        let field_starts = b.ends << 1 | end_before;
        let before_end = ends_or_stop >> 1 | end_after << 63;
        let irregular = (b.opening & !doubled_open & !field_starts)
            | (b.closing & !doubled_close & !before_end);
        let inner = b.newline & b.inside;
        let mut all = b.ends | inner | irregular;
        let base = (64 * k) as u32;
        // A block has at most 64 entries: written into room for 64, without a capacity check
        // for each.
        out.reserve(64);
        let spare = &mut out.spare_capacity_mut()[..64];
        let mut written = 0;
        if inner | irregular == 0 {
            // The usual block: commas and record ends only, NEWLINE (1) told by the bit alone.
            let newline = b.newline;
            for slot in spare.iter_mut() {
                if all == 0 {
                    break;
                }
                let at = all.trailing_zeros();
                slot.write(((newline >> at & 1) as u32) << 30 | (base + at));
                written += 1;
                all &= all - 1;
            }
        }
        while all != 0 {
            let at = all.trailing_zeros();
            // NEWLINE is 1, INNER_NEWLINE 2 (a line end inside quotes), IRREGULAR 3 (a quote:
            // never a line end), COMMA 0.
            let kind = (b.newline >> at & 1) + (inner >> at & 1) + 3 * (irregular >> at & 1);
            spare[written & 63].write((kind as u32) << 30 | (base + at));
            written += 1;
            all &= all - 1;
        }
        let len = out.len() + written;
        // SAFETY: the `written` (at most 64, one per set bit) entries after the old length
        // were just initialised, within the capacity reserved for 64.
        unsafe { out.set_len(len) };
        end_before = b.ends >> 63;
        closing_before = b.closing >> 63;
        if let Some(next) = next {
            current = next;
        }
    }
    Found {
        // The padding holds no quote: the parity at bit 63 is the chunk's last byte's.
        open_at_end: blocks > 0 && current.inside >> 63 != 0,
        ascii: high == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The entries by a byte-at-a-time walk of the same rules.
    fn plain(data: &[u8]) -> (Vec<u32>, Found) {
        let n = data.len();
        let mut inside = vec![false; n];
        let mut parity = false;
        for (i, &b) in data.iter().enumerate() {
            parity ^= b == b'"';
            inside[i] = parity;
        }
        let is_end = |i: usize| i == n || (matches!(data[i], b',' | b'\n') && !inside[i]);
        let opening = |i: usize| i < n && data[i] == b'"' && inside[i];
        let closing = |i: usize| data[i] == b'"' && !inside[i];
        let mut out = Vec::new();
        for i in 0..n {
            let entry = |kind: u32| kind | i as u32;
            match data[i] {
                b',' | b'\n' if !inside[i] => {
                    out.push(entry(if data[i] == b'\n' { NEWLINE } else { COMMA }))
                }
                b'\n' => out.push(entry(INNER_NEWLINE)),
                b'"' => {
                    let doubled = if inside[i] {
                        i > 0 && closing(i - 1)
                    } else {
                        opening(i + 1)
                    };
                    let regular = doubled
                        || if inside[i] {
                            i == 0 || is_end(i - 1)
                        } else {
                            is_end(i + 1)
                        };
                    if !regular {
                        out.push(entry(IRREGULAR));
                    }
                }
                _ => {}
            }
        }
        let ascii = data.is_ascii();
        (
            out,
            Found {
                open_at_end: parity,
                ascii,
            },
        )
    }

    /// What each way of taking the masks that this CPU has finds.
    fn every_way(data: &[u8]) -> Vec<(&'static str, (Vec<u32>, Found))> {
        fn with<M: Masks>(data: &[u8]) -> (Vec<u32>, Found) {
            let mut found = Vec::new();
            let told = run::<M>(data, &mut found, &mut Vec::new());
            (found, told)
        }
        #[allow(unused_mut)]
        let mut ways = vec![("plain", with::<Plain>(data))];
        #[cfg(target_arch = "x86_64")]
        {
            ways.push(("sse2", with::<Sse2>(data)));
            if std::is_x86_feature_detected!("avx2") {
                ways.push(("avx2", with::<Avx2>(data)));
            }
        }
        ways
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]
        #[test]
        fn finds_what_a_plain_walk_finds(data in proptest::collection::vec(
            prop_oneof![Just(b','), Just(b'"'), Just(b'\n'), Just(b'a'), any::<u8>()],
            0..300,
        )) {
            let (mut found, mut quotes) = (Vec::new(), Vec::new());
            let told = find(&data, &mut found, &mut quotes);
            let expected = plain(&data);
            prop_assert_eq!((&found, told), (&expected.0, expected.1));
            // Every way of taking the masks this CPU has gives the same.
            for (way, told) in every_way(&data) {
                prop_assert_eq!(&told, &(expected.0.clone(), expected.1), "{}", way);
            }
            let bits: Vec<usize> = (0..quotes.len() * 64)
                .filter(|&i| quotes[i / 64] >> (i % 64) & 1 != 0)
                .collect();
            let plain_quotes: Vec<usize> = (0..data.len()).filter(|&i| data[i] == b'"').collect();
            prop_assert_eq!(bits, plain_quotes);
        }
    }

    #[test]
    fn a_dump_row_has_only_its_field_ends() {
        let row = b"2,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{\"\"size\"\":64}\",\"a\nb\",\n";
        let mut found = Vec::new();
        let told = find(row, &mut found, &mut Vec::new());
        assert_eq!(
            told,
            Found {
                open_at_end: false,
                ascii: true
            }
        );
        let kinds: Vec<u32> = found.iter().map(|e| e & KIND).collect();
        let mut expected = vec![COMMA; 10];
        expected.extend([INNER_NEWLINE, COMMA, NEWLINE]);
        assert_eq!(kinds, expected);
    }
}
