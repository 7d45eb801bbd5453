//! The positions of the bytes that structure a CSV chunk (`,`, `"` and `\n`), found 16 bytes
//! at a time. A dump row is about 140 bytes with some 25 such bytes; finding each with its own
//! search, as a row-by-row reader does, costs several times more than this one pass.

/// Appends to `out` the offsets in `data` of every `,`, `"` and `\n`, in order. `data` must be
/// shorter than 4 GiB (a chunk is a few MB).
pub(super) fn find(data: &[u8], out: &mut Vec<u32>) {
    debug_assert!(data.len() < u32::MAX as usize);
    out.clear();
    #[cfg(target_arch = "x86_64")]
    let done = find_sse2(data, out);
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (i, &b) in data.iter().enumerate().skip(done) {
        if is_delimiter(b) {
            out.push(i as u32);
        }
    }
}

fn is_delimiter(b: u8) -> bool {
    matches!(b, b',' | b'"' | b'\n')
}

/// The whole 16-byte blocks of `data`; returns how many bytes it covered.
#[cfg(target_arch = "x86_64")]
fn find_sse2(data: &[u8], out: &mut Vec<u32>) -> usize {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let blocks = data.len() / 16;
    // SAFETY: SSE2 is part of the x86_64 baseline, so these intrinsics are always available;
    // each load reads the 16 bytes at `16 * block`, inside `data` as `block < data.len() / 16`,
    // and `_mm_loadu_si128` takes unaligned addresses.
    unsafe {
        let comma = _mm_set1_epi8(b',' as i8);
        let quote = _mm_set1_epi8(b'"' as i8);
        let newline = _mm_set1_epi8(b'\n' as i8);
        for block in 0..blocks {
            let at = block * 16;
            let bytes = _mm_loadu_si128(data.as_ptr().add(at).cast::<__m128i>());
            let hits = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(bytes, comma), _mm_cmpeq_epi8(bytes, quote)),
                _mm_cmpeq_epi8(bytes, newline),
            );
            let mut mask = _mm_movemask_epi8(hits) as u32;
            if out.capacity() - out.len() < 16 {
                // Room for many blocks at once: a dump has a delimiter every few bytes.
                out.reserve(16 + (blocks - block) * 4);
            }
            while mask != 0 {
                out.push(at as u32 + mask.trailing_zeros());
                mask &= mask - 1;
            }
        }
    }
    blocks * 16
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn finds_what_a_plain_scan_finds(data in proptest::collection::vec(
            prop_oneof![Just(b','), Just(b'"'), Just(b'\n'), Just(b'a'), Just(0xffu8), any::<u8>()],
            0..200,
        )) {
            let mut found = Vec::new();
            super::find(&data, &mut found);
            let plain: Vec<u32> = data
                .iter()
                .enumerate()
                .filter(|(_, &b)| super::is_delimiter(b))
                .map(|(i, _)| i as u32)
                .collect();
            prop_assert_eq!(found, plain);
        }
    }
}
