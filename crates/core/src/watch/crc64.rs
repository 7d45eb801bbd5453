//! CRC-64 as the original msMemScope's watch dumps use it (the CRC-64/XZ parameters): reflected
//! polynomial 0x42F0E1EBA9EA3693 (0xC96C5795D7870F42 bit-reversed), initial value and final xor all
//! ones. `"123456789"` checks to 0x995DC9BBDF1939FA.
//!
//! Slicing-by-8: eight 256-entry tables let the loop fold eight input bytes per step with eight
//! independent lookups instead of eight dependent ones, which is what makes a checksum of a
//! large tensor before and after every op affordable.

/// The polynomial in reflected (LSB-first) form.
const POLY_REFLECTED: u64 = 0xC96C_5795_D787_0F42;

/// `TABLES[0]` is the classic byte table; `TABLES[k][b]` is the CRC of byte `b` followed by `k`
/// zero bytes.
static TABLES: [[u64; 256]; 8] = build_tables();

const fn build_tables() -> [[u64; 256]; 8] {
    let mut tables = [[0u64; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut crc = b as u64;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][b] = crc;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = tables[k - 1][b];
            tables[k][b] = (prev >> 8) ^ tables[0][(prev & 0xFF) as usize];
            b += 1;
        }
        k += 1;
    }
    tables
}

/// A running CRC-64, for data that arrives in pieces (a block read in chunks).
#[derive(Clone, Copy, Debug)]
pub struct Crc64 {
    /// The register, before the final xor.
    state: u64,
}

impl Default for Crc64 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc64 {
    pub const fn new() -> Self {
        Crc64 { state: u64::MAX }
    }

    pub fn update(&mut self, data: &[u8]) {
        let t = &TABLES;
        let mut crc = self.state;
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let word = crc ^ u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            // `as u8` keeps every index provably below 256: no bounds checks in the loop.
            crc = t[7][word as u8 as usize]
                ^ t[6][(word >> 8) as u8 as usize]
                ^ t[5][(word >> 16) as u8 as usize]
                ^ t[4][(word >> 24) as u8 as usize]
                ^ t[3][(word >> 32) as u8 as usize]
                ^ t[2][(word >> 40) as u8 as usize]
                ^ t[1][(word >> 48) as u8 as usize]
                ^ t[0][(word >> 56) as u8 as usize];
        }
        for &byte in chunks.remainder() {
            crc = (crc >> 8) ^ t[0][(crc ^ byte as u64) as u8 as usize];
        }
        self.state = crc;
    }

    pub fn finish(&self) -> u64 {
        !self.state
    }
}

/// The CRC-64 of `data` in one call.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc = Crc64::new();
    crc.update(data);
    crc.finish()
}

/// The checksum as the watch CSV writes it: 16 lower-case hex digits.
pub fn hex(checksum: u64) -> String {
    format!("{checksum:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit by bit, straight from the definition: the reference the tables are checked against.
    fn bitwise(data: &[u8]) -> u64 {
        let mut crc = u64::MAX;
        for &byte in data {
            crc ^= byte as u64;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLY_REFLECTED
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn known_vectors() {
        assert_eq!(crc64(b"123456789"), 0x995D_C9BB_DF19_39FA);
        assert_eq!(crc64(b""), 0);
        assert_eq!(crc64(b"a"), bitwise(b"a"));
        assert_eq!(hex(crc64(b"123456789")), "995dc9bbdf1939fa");
        assert_eq!(hex(0), "0000000000000000");
    }

    #[test]
    fn tables_match_the_bitwise_definition_for_every_length_and_alignment() {
        // Deterministic pseudo-random bytes (xorshift), so every table entry gets exercised.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let data: Vec<u8> = (0..4099)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for len in (0..64).chain([255, 1000, 4096]) {
            for start in 0..3 {
                let piece = &data[start..start + len];
                assert_eq!(crc64(piece), bitwise(piece), "len {len} start {start}");
            }
        }
    }

    #[test]
    fn pieces_add_up_to_the_whole() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let mut crc = Crc64::new();
        for piece in data.chunks(777) {
            crc.update(piece);
        }
        assert_eq!(crc.finish(), crc64(&data));
    }
}
