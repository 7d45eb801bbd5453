//! A quick accept for the Attr objects writers produce: one flat JSON object of plain keys and
//! scalar values. Reading a dump checks every row's Attr ([`super::reader::check_attrs`]), and
//! a general JSON parser costs more there than all the rest of a row; this scan accepts, in one
//! pass and without allocating, exactly the texts that are plainly fine, and leaves everything
//! else (escapes, nesting, exponents, anything malformed) to the full check, which also words
//! the error. So it may only answer "yes" where the full check would.

use super::{decimal_digits, numeric_attr_index_of, string_attr_index_of};

/// Whether `attrs` is a JSON object whose keys and string values have no escapes and no
/// control characters, whose values are strings, integers, plain decimals, `true`, `false`,
/// `null` or arrays of those, and whose [`NUMERIC_ATTRS`](super::reader::NUMERIC_ATTRS) keys
/// appear at most once each with an integer from 0 to `u64::MAX` written in digits. `false`
/// means "not known", not "invalid".
#[cfg(test)]
pub(crate) fn plainly_valid(attrs: &str) -> bool {
    plain_object(attrs).is_some()
}

/// What the quick accept learns of an object it takes, for the row to answer from without
/// searching the text again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plain {
    /// Which [`NUMERIC_ATTRS`](super::reader::NUMERIC_ATTRS) keys the object has (bit i for key
    /// i), and their values.
    pub(crate) present: u8,
    pub(crate) values: [u64; 8],
    /// Which [`STRING_ATTRS`](super::STRING_ATTRS) keys the object has (bit i for key i), and
    /// the text of each one's first value when it is a string (between its quotes): decompose,
    /// the leaks analysis and the report read them on every MALLOC row.
    pub(crate) strings_seen: u8,
    pub(crate) strings: [Option<(u32, u32)>; super::STRING_ATTRS.len()],
}

/// When [`plainly_valid`] says yes: what it learnt of the object.
pub(crate) fn plain_object(attrs: &str) -> Option<Plain> {
    let mut scan = Scan {
        b: attrs.as_bytes(),
        at: 0,
        found: Plain::default(),
    };
    scan.object()?;
    scan.skip_ws();
    (scan.at == scan.b.len()).then_some(scan.found)
}

struct Scan<'a> {
    b: &'a [u8],
    at: usize,
    /// The numeric keys met and their values, and the string keys.
    found: Plain,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        // Whitespace is at most b' ': one comparison for the usual byte that is not.
        while let Some(&c) = self.b.get(self.at) {
            if c > b' ' || !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                break;
            }
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.skip_ws();
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    fn object(&mut self) -> Option<()> {
        self.eat(b'{')?;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_ws();
            let key = self.string()?;
            self.eat(b':')?;
            self.skip_ws();
            match numeric_attr_index_of(key) {
                Some(index) => {
                    if self.found.present & (1 << index) != 0 {
                        return None;
                    }
                    self.found.present |= 1 << index;
                    self.found.values[index] = self.u64_digits()?;
                }
                None => match string_attr_index_of(key) {
                    Some(index) if self.found.strings_seen & (1 << index) == 0 => {
                        self.found.strings_seen |= 1 << index;
                        let start = self.at + 1;
                        let is_string = self.peek() == Some(b'"');
                        self.scalar()?;
                        if is_string {
                            let (start, end) =
                                (u32::try_from(start).ok()?, u32::try_from(self.at - 1).ok()?);
                            self.found.strings[index] = Some((start, end));
                        }
                    }
                    _ => self.scalar()?,
                },
            }
            self.skip_ws();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes or control characters; its text between the quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.at + 1;
        // One pass: the closing quote, and no backslash or control character before it.
        let end = start + first_special(self.b.get(start..)?)?;
        if self.b[end] != b'"' {
            return None;
        }
        self.at = end + 1;
        let b: &'a [u8] = self.b;
        Some(&b[start..end])
    }

    fn scalar(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            b'[' => self.array(),
            _ => self.number(),
        }
    }

    /// An array of scalars (a shape, a stride): one level deep, deeper is left to the full
    /// check.
    fn array(&mut self) -> Option<()> {
        self.at += 1;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_ws();
            if self.peek() == Some(b'[') {
                return None;
            }
            self.scalar()?;
            self.skip_ws();
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn word(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?`: exponents are left to the full check.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        self.int_digits()?;
        if self.peek() == Some(b'.') {
            self.at += 1;
            let from = self.at;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.at += 1;
            }
            if self.at == from {
                return None;
            }
        }
        // A following character other than a delimiter (an exponent, a letter) is not ours.
        (!matches!(self.peek(), Some(b'e' | b'E'))).then_some(())
    }

    /// `0|[1-9][0-9]*`; the digits.
    fn int_digits(&mut self) -> Option<&'a [u8]> {
        let from = self.at;
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.at += 1;
                }
            }
            _ => return None,
        }
        let b: &'a [u8] = self.b;
        Some(&b[from..self.at])
    }

    /// An integer from 0 to `u64::MAX` in digits only; its value.
    fn u64_digits(&mut self) -> Option<u64> {
        let digits = self.int_digits()?;
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) || digits.len() > 20 {
            return None;
        }
        decimal_digits(digits)
    }
}

/// The offset of the first quote, backslash or control character in `b`, eight bytes at a time
/// (a dump's keys and values are short, and a loop over bytes costs more than they do).
pub(crate) fn first_special(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x80 * ONES;
    // Bit 7 of each byte that is `"`, `\` or below 0x20. A borrow can flag bytes after a
    // true one, never before it, so the lowest flagged byte is the first special one.
    let special = |w: u64| {
        let quote = w ^ (u64::from(b'"') * ONES);
        let backslash = w ^ (u64::from(b'\\') * ONES);
        (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | w.wrapping_sub(0x20 * ONES) & !w)
            & HIGH
    };
    let word = |at: usize| {
        b.get(at..at + 8)
            .map(|eight| u64::from_le_bytes(eight.try_into().expect("8 bytes")))
    };
    let mut at = 0;
    while let Some(w) = word(at) {
        let found = special(w);
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    if at < b.len() && b.len() >= 8 {
        // The last bytes, as the word ending at the end (those before `at` are not special).
        let last = b.len() - 8;
        let found = special(word(last)?) & (!0u64 << (8 * (at - last)));
        return (found != 0).then(|| last + (found.trailing_zeros() / 8) as usize);
    }
    b[at..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|p| at + p)
}

#[cfg(test)]
mod tests {
    use super::plainly_valid;
    use crate::events::attrs::check_attrs_fully;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn first_special_is_the_first_quote_backslash_or_control(
            b in proptest::collection::vec(prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x21, 0x5au8..0x5e, any::<u8>()], 0..40),
        ) {
            let want = b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
            prop_assert_eq!(super::first_special(&b), want, "{:?}", b);
        }
    }

    #[test]
    fn writer_attrs_are_accepted() {
        for ok in [
            "{}",
            " { } ",
            r#"{"size":4096,"owner":"weight","addr":"0x10"}"#,
            r#"{"allocation_id": 7, "used":0,"total":18446744073709551615}"#,
            r#"{"x":-1.5,"y":true,"z":null,"w":false,"v":"é"}"#,
            r#"{"note":"a","note":"b"}"#,
            r#"{"dtype":"torch.float32","shape":[64,64],"s":[],"t":[ "a" , 1.5 ]}"#,
        ] {
            assert!(plainly_valid(ok), "{ok}");
            assert!(check_attrs_fully(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn anything_unusual_is_left_to_the_full_check() {
        for unsure in [
            "",
            "[]",
            r#"{"size":18446744073709551616}"#,
            r#"{"size":-0}"#,
            r#"{"size":01}"#,
            r#"{"size":1.0}"#,
            r#"{"size":1e3}"#,
            r#"{"size":1,"size":2}"#,
            r#"{"si\u007ae":1}"#,
            r#"{"a":{"size":"x"}}"#,
            r#"{"a":[[1]]}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[1}"#,
            r#"{"a":1e999}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            r#"{"a":tru}"#,
            r#"{"a":1."#,
        ] {
            assert!(!plainly_valid(unsure), "{unsure}");
        }
    }

    fn near_json() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            Just(" ".to_string()),
            Just("\"size\"".to_string()),
            Just("\"used\"".to_string()),
            Just("\"owner\"".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("-".to_string()),
            Just(".".to_string()),
            Just("e".to_string()),
            Just("true".to_string()),
            Just("nul".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            "[0-9]{1,22}",
            "[a-z]{1,3}",
        ];
        proptest::collection::vec(token, 0..24).prop_map(|t| t.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        /// The quick accept never takes what the full check refuses.
        #[test]
        fn accepts_only_what_the_full_check_accepts(text in near_json()) {
            if plainly_valid(&text) {
                prop_assert!(check_attrs_fully(&text).is_ok(), "{}", text);
            }
        }

        #[test]
        fn flat_objects_are_accepted(
            pairs in proptest::collection::vec(("[a-z_]{1,8}", prop_oneof![
                "[0-9]{1,12}".prop_map(|d| d.trim_start_matches('0').to_string())
                    .prop_map(|d| if d.is_empty() { "0".into() } else { d }),
                "[a-zA-Z0-9 ]{0,10}".prop_map(|s| format!("\"{s}\"")),
            ]), 0..8)
        ) {
            let mut seen = std::collections::HashSet::new();
            let body: Vec<String> = pairs
                .into_iter()
                .filter(|(k, _)| seen.insert(k.clone()))
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect();
            let text = format!("{{{}}}", body.join(","));
            let full = check_attrs_fully(&text).is_ok();
            prop_assert_eq!(plainly_valid(&text), full, "{}", text);
        }
    }
}
