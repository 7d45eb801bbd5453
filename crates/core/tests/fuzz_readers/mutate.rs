//! The stable driver's mutations of a real file: cut, bytes changed, inserted, removed or
//! repeated, pieces of another file spliced in, numbers made huge, lengths made huge, invalid
//! UTF-8 and NUL bytes; a few at a time. Deterministic for a seed, so a failure reproduces.

/// xorshift64*: enough randomness for picking edits, and no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 for 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Bytes that mean something to one of the formats.
const INTERESTING: &[u8] = b",\"\n\r{}[]:0x-9 \0\xff\x80\xc3";

/// Numbers past what a field holds, or at its edges.
const NUMBERS: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999",
    "9223372036854775808",
    "4294967296",
    "-1",
    "0",
    "1e308",
    "0x",
];

/// Lengths a binary header may claim.
const LENGTHS: &[u64] = &[
    u32::MAX as u64,
    i32::MAX as u64,
    u64::MAX,
    i64::MAX as u64,
    1 << 31,
    1 << 40,
    0,
];

/// One to four edits of `seed`, with `other` (another seed) for splicing.
pub fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        edit(rng, &mut bytes, other);
    }
    bytes
}

fn edit(rng: &mut Rng, bytes: &mut Vec<u8>, other: &[u8]) {
    let len = bytes.len();
    let at = rng.below(len + 1);
    match rng.below(11) {
        0 => bytes.truncate(at),
        1 if at < len => bytes[at] ^= 1 << rng.below(8),
        2 if at < len => bytes[at] = *rng.pick(INTERESTING),
        3 => bytes.insert(at, *rng.pick(INTERESTING)),
        4 => {
            let n = rng.below(64).min(len - at);
            bytes.drain(at..at + n);
        }
        5 => {
            // A piece of the file repeated: rows, pages, a footer twice.
            let n = rng.below(256).min(len - at);
            let piece = bytes[at..at + n].to_vec();
            let to = rng.below(len + 1);
            bytes.splice(to..to, piece);
        }
        6 if !other.is_empty() => {
            let from = rng.below(other.len());
            let n = rng.below(512).min(other.len() - from);
            let end = (at + rng.below(512)).min(len);
            bytes.splice(at..end, other[from..from + n].iter().copied());
        }
        7 => huge_number(rng, bytes),
        8 if len >= 4 => {
            let value = *rng.pick(LENGTHS);
            let at = rng.below(len - 3);
            if len - at >= 8 && rng.below(2) == 0 {
                bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            } else {
                bytes[at..at + 4].copy_from_slice(&(value as u32).to_le_bytes());
            }
        }
        9 => {
            let invalid: &[&[u8]] = &[b"\xc3\x28", b"\xff", b"\xed\xa0\x80", b"\xe2\x82", b"\0"];
            let piece = rng.pick(invalid);
            bytes.splice(at..at, piece.iter().copied());
        }
        _ => {
            let n = 1 + rng.below(16);
            let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, junk);
        }
    }
}

/// A run of digits replaced by one of [`NUMBERS`].
fn huge_number(rng: &mut Rng, bytes: &mut Vec<u8>) {
    let start = rng.below(bytes.len());
    let Some(first) = bytes[start..].iter().position(u8::is_ascii_digit) else {
        return;
    };
    let first = start + first;
    let end = bytes[first..]
        .iter()
        .position(|b| !b.is_ascii_digit())
        .map_or(bytes.len(), |n| first + n);
    let number = rng.pick(NUMBERS).as_bytes();
    bytes.splice(first..end, number.iter().copied());
}
