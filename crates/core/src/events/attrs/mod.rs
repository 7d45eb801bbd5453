//! The Attr column and the numbers of a row: which Attr keys are numbers, the check every
//! reader makes of an Attr object, and the decimal and hexadecimal parsers the readers use.
//! A leaf: it imports nothing of the formats.

mod flat_json;

pub(crate) use flat_json::{first_special, plain_object, Plain};

/// At most 60 characters of `text`, quoted, for a message that must stay one line.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// The text right after `"key":` in a JSON object, or `None`. Only matches `key` in key
/// position (after `{` or `,`) of the object itself, so neither a string value equal to the key
/// nor a nested object's key of that name is mistaken for it.
pub(crate) fn raw_value<'a>(raw: &'a str, key: &str) -> Option<&'a str> {
    let bytes = raw.as_bytes();
    // A key is in quotes, so only the places after a quote can start it. An Attr object is
    // short: a plain walk beats setting up a substring (or byte) search on every call.
    let first = key.as_bytes().first().copied();
    for (quote, _) in bytes.iter().enumerate().filter(|(_, &b)| b == b'"') {
        let start = quote + 1;
        if bytes.get(start).copied() != first {
            continue;
        }
        let end = start + key.len();
        if bytes.get(start..end) != Some(key.as_bytes()) || bytes.get(end) != Some(&b'"') {
            continue;
        }
        let before = raw[..start - 1].trim_end();
        if !(before.ends_with('{') || before.ends_with(',')) || !at_top_level(bytes, start - 1) {
            continue;
        }
        let after = raw[end + 1..].trim_start();
        if let Some(value) = after.strip_prefix(':') {
            return Some(value.trim_start());
        }
    }
    None
}

/// Whether byte `at` of a JSON object's text, a key's opening quote, lies in the object itself
/// rather than in an object or array nested in it.
fn at_top_level(bytes: &[u8], at: usize) -> bool {
    // The usual flat object opens no bracket after its own: nothing to track. (A key's quote
    // follows `{` or `,` unescaped, so it is never inside a string.)
    if memchr::memchr2(b'{', b'[', &bytes[1.min(at)..at]).is_none() {
        return true;
    }
    let (mut depth, mut in_string, mut escaped) = (0i64, false, false);
    for &b in &bytes[..at] {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            _ => {}
        }
    }
    depth == 1 && !in_string
}

/// The text of a number value of `key` as written (up to the next `,` or `}`), for messages.
pub(crate) fn raw_number<'a>(raw: &'a str, key: &str) -> Option<&'a str> {
    let value = raw_value(raw, key)?;
    let end = value.find([',', '}']).unwrap_or(value.len());
    Some(value[..end].trim_end())
}

/// The Attr keys the analyses read as numbers (`EventRow::attr_u64`): byte counts and ids. A
/// value that is not an integer from 0 to `u64::MAX` would read as absent, which the analyses
/// take as 0, so such a row is refused instead.
pub const NUMERIC_ATTRS: [&str; 8] = [
    "size",
    "used",
    "total",
    "allocated",
    "free",
    "req_size",
    "allocation_id",
    "range_id",
];

/// The index of `key` in [`NUMERIC_ATTRS`].
pub(crate) fn numeric_attr_index(key: &str) -> Option<usize> {
    numeric_attr_index_of(key.as_bytes())
}

/// The Attr keys whose string values the analyses read on every MALLOC row
/// (`EventRow::attr_str`): the quick check keeps where their values are.
pub(crate) const STRING_ATTRS: [&str; 5] = ["owner", "site", "frame", "op", "module"];

/// The index of `key` in [`STRING_ATTRS`].
pub(crate) fn string_attr_index_of(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"owner" => 0,
        b"site" => 1,
        b"frame" => 2,
        b"op" => 3,
        b"module" => 4,
        _ => return None,
    })
}

/// [`numeric_attr_index`] of a key's bytes (a match: found by length, then compared once).
pub(crate) fn numeric_attr_index_of(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"size" => 0,
        b"used" => 1,
        b"total" => 2,
        b"allocated" => 3,
        b"free" => 4,
        b"req_size" => 5,
        b"allocation_id" => 6,
        b"range_id" => 7,
        _ => return None,
    })
}

/// A decimal `u64` as `str::parse` reads one (an optional `+`, then digits), without its
/// generality: readers parse four of these on every row.
pub(crate) fn decimal(text: &str) -> Option<u64> {
    decimal_digits(text.strip_prefix('+').unwrap_or(text).as_bytes())
}

/// Digits only (at least one) as a `u64`; `None` for anything else or an overflow.
pub(crate) fn decimal_digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    if digits.len() <= 19 {
        // Nineteen digits stay below 10^19 < u64::MAX: no step can overflow. Eight at a time,
        // since a dump's timestamps have nineteen.
        let mut value = 0u64;
        let mut eights = digits.chunks_exact(8);
        for eight in &mut eights {
            value = value * 100_000_000 + eight_digits(eight.try_into().expect("8 bytes"))?;
        }
        for &d in eights.remainder() {
            let d = d.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            value = value * 10 + u64::from(d);
        }
        return Some(value);
    }
    let mut value = 0u64;
    for &d in digits {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(value)
}

/// Eight ASCII digits as their value, all in one word; `None` when any byte is not a digit.
fn eight_digits(eight: [u8; 8]) -> Option<u64> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let word = u64::from_le_bytes(eight);
    // A digit's high nibble is 3, and its low nibble plus 6 stays below 16.
    let digits = word & (0xF0 * ONES) == 0x30 * ONES
        && (word.wrapping_add(0x06 * ONES)) & (0xF0 * ONES) == 0x30 * ONES;
    if !digits {
        return None;
    }
    // The first byte is the lowest and the most significant digit: pairs, then fours, then
    // all eight.
    let mut v = word - 0x30 * ONES;
    v = (v * 10 + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    v = (v * 100 + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    v = (v * 10_000 + (v >> 32)) & 0xFFFF_FFFF;
    Some(v)
}

/// Each byte's hex digit value, or [`NOT_HEX`].
const HEX_DIGITS: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = match c as u8 {
            d @ b'0'..=b'9' => d - b'0',
            d @ b'a'..=b'f' => d - b'a' + 10,
            d @ b'A'..=b'F' => d - b'A' + 10,
            _ => NOT_HEX,
        };
        c += 1;
    }
    table
};
const NOT_HEX: u8 = 0x80;

/// Hex digits only (no sign, no prefix), at most 64 bits.
pub(crate) fn hexadecimal(text: &str) -> Option<u64> {
    let mut digits = text.as_bytes();
    if digits.is_empty() {
        return None;
    }
    // Leading zeros are not among the sixteen digits a u64 holds.
    while digits.len() > 16 && digits[0] == b'0' {
        digits = &digits[1..];
    }
    if digits.len() > 16 {
        return None;
    }
    if let Ok(sixteen) = <&[u8; 16]>::try_from(digits) {
        // A dump's Ptr: sixteen digits, eight to a word.
        let (high, low) = sixteen.split_at(8);
        let high = eight_hex_digits(high.try_into().expect("8 bytes"))?;
        let low = eight_hex_digits(low.try_into().expect("8 bytes"))?;
        return Some(u64::from(high) << 32 | u64::from(low));
    }
    let mut value = 0u64;
    let mut seen = 0u8;
    for &c in digits {
        let d = HEX_DIGITS[usize::from(c)];
        seen |= d;
        value = value << 4 | u64::from(d & 0xF);
    }
    (seen & NOT_HEX == 0).then_some(value)
}

/// Eight ASCII hex digits (either case) as their value, all in one word; `None` when any byte
/// is not one.
fn eight_hex_digits(eight: [u8; 8]) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x80 * ONES;
    let word = u64::from_le_bytes(eight);
    if word & HIGH != 0 {
        return None;
    }
    // Every byte is below 0x80, so adding up to 0x80 to each cannot carry into the next: a
    // byte's high bit then says whether it is at least a bound.
    let at_least = |bound: u8| word.wrapping_add(u64::from(0x80 - bound) * ONES) & HIGH;
    let lower = word | (0x20 * ONES); // letters to lower case; digits have the bit already
    let lower_at_least = |bound: u8| lower.wrapping_add(u64::from(0x80 - bound) * ONES) & HIGH;
    let digit = at_least(b'0') & !at_least(b'9' + 1);
    let letter = lower_at_least(b'a') & !lower_at_least(b'f' + 1);
    if digit | letter != HIGH {
        return None;
    }
    // Each byte's value: its low nibble, plus 9 for a letter ('a' is 0x61).
    let mut v = (word & (0x0F * ONES)) + (letter >> 7) * 9;
    // The first byte is the lowest and the most significant digit: pairs, fours, then eight.
    v = (v & 0x00FF_00FF_00FF_00FF) << 4 | (v >> 8 & 0x00FF_00FF_00FF_00FF);
    v = (v & 0x0000_FFFF_0000_FFFF) << 8 | (v >> 16 & 0x0000_FFFF_0000_FFFF);
    v = (v & 0xFFFF_FFFF) << 16 | v >> 32;
    Some(v as u32)
}

/// Checks that Attr is one JSON object whose [`NUMERIC_ATTRS`] are integers from 0 to
/// `u64::MAX`, each given once and spelled without escapes (`attr_u64` reads the raw text, so
/// it must find them as written); the reason names the key. Public so that a producer can
/// refuse at emit time what the readers would refuse later.
pub fn check_attrs(attrs: &str) -> Result<(), String> {
    check_attrs_numbers(attrs).map(drop)
}

/// [`check_attrs`], and the [`NUMERIC_ATTRS`] values (which are present, and each value) when
/// the quick accept took the object.
pub(crate) fn check_attrs_numbers(attrs: &str) -> Result<Option<Plain>, String> {
    if let Some(numbers) = plain_object(attrs) {
        return Ok(Some(numbers));
    }
    check_attrs_fully(attrs).map(|()| None)
}

/// [`check_attrs`] without the quick accept: a full JSON walk.
pub(crate) fn check_attrs_fully(attrs: &str) -> Result<(), String> {
    use serde::Deserializer as _;
    let mut de = serde_json::Deserializer::from_str(attrs);
    let checked = de
        .deserialize_map(AttrCheck)
        .and_then(|r| de.end().map(|_| r));
    let not_u64 = |key: &str, written: &str| {
        format!(
            "Attr {key:?} is not an integer from 0 to {}: {}",
            u64::MAX,
            excerpt(written)
        )
    };
    match checked {
        Ok(Ok(seen)) => {
            // `attr_u64` reads the digits as written: `-0`, which JSON takes for 0, would be
            // nothing to it.
            for (index, key) in NUMERIC_ATTRS.iter().enumerate() {
                if seen & (1 << index) == 0 {
                    continue;
                }
                let written = raw_number(attrs, key).unwrap_or_default();
                if written.is_empty() || !written.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(not_u64(key, written));
                }
            }
            Ok(())
        }
        Ok(Err(bad)) => Err(match bad {
            BadAttr::Twice(key) => format!("Attr {key:?} is given twice"),
            BadAttr::Escaped(key) => format!("Attr {key:?} is written with escapes"),
            BadAttr::NotU64(key, value) => {
                // The number as written: a too-large one parses as a float, which would
                // print differently.
                let written = value
                    .is_number()
                    .then(|| raw_number(attrs, key))
                    .flatten()
                    .map_or_else(|| value.to_string(), str::to_owned);
                not_u64(key, &written)
            }
        }),
        Err(e) => Err(format!(
            "Attr is not a JSON object ({e}): {}",
            excerpt(attrs)
        )),
    }
}

enum BadAttr {
    Twice(&'static str),
    Escaped(&'static str),
    NotU64(&'static str, serde_json::Value),
}

/// Walks an Attr object once, parsing only the values of [`NUMERIC_ATTRS`].
struct AttrCheck;

impl<'de> serde::de::Visitor<'de> for AttrCheck {
    /// The [`NUMERIC_ATTRS`] present, as a bit set by index.
    type Value = Result<u32, BadAttr>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = 0u32;
        let mut bad = None;
        while let Some(key) = map.next_key::<AttrKey>()? {
            let AttrKey::Numeric { index, escaped } = key else {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            };
            let name = NUMERIC_ATTRS[index];
            let value: serde_json::Value = map.next_value()?;
            if bad.is_some() {
                continue;
            }
            if escaped {
                bad = Some(BadAttr::Escaped(name));
            } else if seen & (1 << index) != 0 {
                bad = Some(BadAttr::Twice(name));
            } else if value.as_u64().is_none() {
                bad = Some(BadAttr::NotU64(name, value));
            }
            seen |= 1 << index;
        }
        Ok(bad.map_or(Ok(seen), Err))
    }
}

/// An Attr key: one of [`NUMERIC_ATTRS`] (and whether its text had escapes), or another.
enum AttrKey {
    Numeric { index: usize, escaped: bool },
    Other,
}

impl<'de> serde::Deserialize<'de> for AttrKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AttrKey, D::Error> {
        struct KeyVisitor;
        impl KeyVisitor {
            fn key(text: &str, escaped: bool) -> AttrKey {
                NUMERIC_ATTRS
                    .iter()
                    .position(|k| *k == text)
                    .map_or(AttrKey::Other, |index| AttrKey::Numeric { index, escaped })
            }
        }
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = AttrKey;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }

            // serde_json hands a key over borrowed exactly when its text has no escapes.
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<AttrKey, E> {
                Ok(KeyVisitor::key(v, false))
            }

            fn visit_str<E>(self, v: &str) -> Result<AttrKey, E> {
                Ok(KeyVisitor::key(v, true))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}
