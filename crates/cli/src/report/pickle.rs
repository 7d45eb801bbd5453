//! A streaming writer of Python pickles (protocol 2 opcodes): just the value kinds a memory
//! snapshot needs (dicts with string keys, lists, pairs, str and int). Values
//! are written as they come, so a trace of millions of entries never sits in memory.
//!
//! Containers are built the way Python's own pickler builds them: an empty container first,
//! then each element followed by APPEND (lists) or SETITEM (dicts), then the next value.

use std::io::{self, Write};

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEM: u8 = b's';
const APPEND: u8 = b'a';
const BINUNICODE: u8 = b'X';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const TUPLE2: u8 = 0x86;
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
/// Strings remembered for reuse: dict keys, actions, file and function names repeat in every
/// entry, and a memo reference costs 2–5 bytes instead of the string.
const MAX_MEMO: usize = 1 << 20;

pub struct Pickler<W: Write> {
    out: W,
    memo: std::collections::HashMap<Box<str>, u32>,
}

impl<W: Write> Pickler<W> {
    /// Starts a pickle; the caller writes exactly one value, then [`Pickler::finish`].
    pub fn new(mut out: W) -> io::Result<Pickler<W>> {
        out.write_all(&[PROTO, 2])?;
        Ok(Pickler {
            out,
            memo: Default::default(),
        })
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[STOP])?;
        self.out.flush()?;
        Ok(self.out)
    }

    pub fn dict(&mut self) -> io::Result<()> {
        self.out.write_all(&[EMPTY_DICT])
    }

    /// Ends a key and its value, written after the dict.
    pub fn set_item(&mut self) -> io::Result<()> {
        self.out.write_all(&[SETITEM])
    }

    pub fn list(&mut self) -> io::Result<()> {
        self.out.write_all(&[EMPTY_LIST])
    }

    /// Ends an element, written after the list.
    pub fn append(&mut self) -> io::Result<()> {
        self.out.write_all(&[APPEND])
    }

    /// Makes a tuple of the last two values.
    pub fn tuple2(&mut self) -> io::Result<()> {
        self.out.write_all(&[TUPLE2])
    }

    /// A string; one seen before is a reference to the first (the unpickler shares it).
    pub fn str(&mut self, s: &str) -> io::Result<()> {
        if let Some(&index) = self.memo.get(s) {
            return match u8::try_from(index) {
                Ok(small) => self.out.write_all(&[BINGET, small]),
                Err(_) => {
                    self.out.write_all(&[LONG_BINGET])?;
                    self.out.write_all(&index.to_le_bytes())
                }
            };
        }
        self.out.write_all(&[BINUNICODE])?;
        self.out.write_all(&(s.len() as u32).to_le_bytes())?;
        self.out.write_all(s.as_bytes())?;
        if self.memo.len() >= MAX_MEMO || s.len() < 2 {
            return Ok(());
        }
        let index = self.memo.len() as u32;
        self.memo.insert(s.into(), index);
        match u8::try_from(index) {
            Ok(small) => self.out.write_all(&[BINPUT, small]),
            Err(_) => {
                self.out.write_all(&[LONG_BINPUT])?;
                self.out.write_all(&index.to_le_bytes())
            }
        }
    }

    pub fn int(&mut self, v: i128) -> io::Result<()> {
        if let Ok(small) = i32::try_from(v) {
            self.out.write_all(&[BININT])?;
            return self.out.write_all(&small.to_le_bytes());
        }
        // LONG1: little-endian two's complement, as few bytes as keep the sign.
        let bytes = v.to_le_bytes();
        let mut len = bytes.len();
        while len > 1 {
            let (top, next) = (bytes[len - 1], bytes[len - 2]);
            let redundant = (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
            if !redundant {
                break;
            }
            len -= 1;
        }
        self.out.write_all(&[LONG1, len as u8])?;
        self.out.write_all(&bytes[..len])
    }

    /// `key: int` inside an open dict.
    pub fn item_int(&mut self, key: &str, v: i128) -> io::Result<()> {
        self.str(key)?;
        self.int(v)?;
        self.set_item()
    }

    /// `key: str` inside an open dict.
    pub fn item_str(&mut self, key: &str, v: &str) -> io::Result<()> {
        self.str(key)?;
        self.str(v)?;
        self.set_item()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_bytes(v: i128) -> Vec<u8> {
        let mut p = Pickler::new(Vec::new()).unwrap();
        p.out.clear();
        p.int(v).unwrap();
        p.out
    }

    #[test]
    fn ints_take_the_shortest_form() {
        assert_eq!(int_bytes(5), [BININT, 5, 0, 0, 0]);
        assert_eq!(int_bytes(-1), [BININT, 0xff, 0xff, 0xff, 0xff]);
        // 2^31: needs a fifth byte so the sign stays positive.
        assert_eq!(int_bytes(1 << 31), [LONG1, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(
            int_bytes(0x7f00_0000_1000),
            [LONG1, 6, 0, 0x10, 0, 0, 0, 0x7f]
        );
        assert_eq!(
            int_bytes(u64::MAX as i128),
            [LONG1, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
        assert_eq!(int_bytes(-(1 << 40)), [LONG1, 6, 0, 0, 0, 0, 0, 0xff]);
    }

    #[test]
    fn repeated_strings_are_memo_references() {
        let mut p = Pickler::new(Vec::new()).unwrap();
        p.dict().unwrap();
        p.str("ab").unwrap();
        p.list().unwrap();
        p.int(1).unwrap();
        p.append().unwrap();
        p.set_item().unwrap();
        p.str("ab").unwrap();
        p.list().unwrap();
        p.int(1).unwrap();
        p.append().unwrap();
        p.set_item().unwrap();
        let bytes = p.finish().unwrap();
        // The key's second use is a memo reference to its first.
        assert_eq!(
            bytes,
            [
                PROTO, 2, b'}', b'X', 2, 0, 0, 0, b'a', b'b', BINPUT, 0, b']', b'J', 1, 0, 0, 0,
                b'a', b's', BINGET, 0, b']', b'J', 1, 0, 0, 0, b'a', b's', b'.'
            ]
        );
    }
}
