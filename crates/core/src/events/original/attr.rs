//! The original tool's Attr column: `{key:value,...}` with nothing quoted (`{allocation_id:4,
//! addr:0x12c0,size:16778240}`), values that may be empty (`owner:`), and in its older dumps a
//! FREE's `size` written negative. Rewritten here as the JSON object our dumps hold.

use serde_json::{Map, Value};

use crate::events::attrs::numeric_attr_index;

/// What rewriting the Attr of the rows so far changed, for the one note on stderr.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct AttrNotes {
    /// `key:` with nothing after it: left out.
    pub empty_values: u64,
    /// A FREE row's negative `size`: its magnitude is kept.
    pub negative_sizes: u64,
}

/// Our JSON object for `text`. A text that is JSON already (`{"size":1}`), or empty, is taken
/// as it is. `free`: the row is a FREE (the only row whose `size` may be negative).
pub(super) fn to_json(text: &str, free: bool, notes: &mut AttrNotes) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() || text == "{}" {
        return Ok("{}".to_string());
    }
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| format!("Attr {} is not {{key:value,...}}", shorten(text)))?;
    if inner.trim_start().starts_with('"') {
        return Ok(text.to_string());
    }
    let mut object = Map::new();
    for (key, value) in pairs(inner)? {
        if value.is_empty() {
            notes.empty_values += 1;
            continue;
        }
        let value = self::value(key, value, free, notes)?;
        if object.insert(key.to_string(), value).is_some() {
            return Err(format!("Attr key {key:?} is given twice"));
        }
    }
    Ok(Value::Object(object).to_string())
}

/// The `key:value` pairs of the text between the braces. A value may hold commas: a piece that
/// does not start with a key and a colon belongs to the value before it.
fn pairs(inner: &str) -> Result<Vec<(&str, &str)>, String> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    // Where the current pair's value starts and ends in `inner`.
    let mut open: Option<(usize, usize, usize)> = None;
    let mut start = 0;
    for piece in inner.split(',') {
        let end = start + piece.len();
        match key_of(piece) {
            Some(key_len) => {
                if let Some((k, v0, v1)) = open.take() {
                    pairs.push((&inner[k..k + (v0 - k - 1)], inner[v0..v1].trim()));
                }
                let key_start = start + (piece.len() - piece.trim_start().len());
                open = Some((key_start, key_start + key_len + 1, end));
            }
            None => match open.as_mut() {
                Some((_, _, v1)) => *v1 = end,
                None if piece.trim().is_empty() && inner.trim().is_empty() => {}
                None => {
                    return Err(format!(
                        "Attr piece {} is not key:value",
                        shorten(piece.trim())
                    ))
                }
            },
        }
        start = end + 1;
    }
    if let Some((k, v0, v1)) = open {
        pairs.push((&inner[k..k + (v0 - k - 1)], inner[v0..v1].trim()));
    }
    Ok(pairs.into_iter().map(|(k, v)| (k.trim_end(), v)).collect())
}

/// The length of the key at the start of `piece` (after blanks), when it is one: a name of
/// letters, digits, `_`, `.` or `-`, starting with a letter or `_`, followed by a colon.
fn key_of(piece: &str) -> Option<usize> {
    let piece = piece.trim_start();
    let colon = piece.find(':')?;
    let key = piece[..colon].trim_end();
    let mut chars = key.chars();
    let first = chars.next()?;
    let ok = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    ok.then_some(colon)
}

/// A value as JSON: integers as numbers (the byte counts and ids the analyses read), the rest
/// as strings.
fn value(key: &str, text: &str, free: bool, notes: &mut AttrNotes) -> Result<Value, String> {
    let numeric = numeric_attr_index(key).is_some();
    if let Some(digits) = text.strip_prefix('-') {
        if is_digits(digits) {
            if numeric && key == "size" && free {
                notes.negative_sizes += 1;
                return digits
                    .parse::<u64>()
                    .map(Value::from)
                    .map_err(|_| format!("Attr size {} is out of range", shorten(text)));
            }
            if numeric {
                return Err(format!(
                    "Attr {key:?} is negative ({}); byte counts and ids are from 0 up",
                    shorten(text)
                ));
            }
            return Ok(text
                .parse::<i64>()
                .map_or_else(|_| Value::from(text), Value::from));
        }
    }
    if is_digits(text) {
        return match text.parse::<u64>() {
            Ok(n) => Ok(Value::from(n)),
            Err(_) if numeric => Err(format!(
                "Attr {key:?} {} is larger than {}",
                shorten(text),
                u64::MAX
            )),
            Err(_) => Ok(Value::from(text)),
        };
    }
    if numeric {
        return Err(format!("Attr {key:?} is {}, not an integer", shorten(text)));
    }
    Ok(Value::from(text))
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// At most 60 characters of `text`, quoted.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str, free: bool) -> Result<String, String> {
        to_json(text, free, &mut AttrNotes::default())
    }

    #[test]
    fn current_dialect_attr_becomes_json_with_numbers() {
        assert_eq!(
            json("{allocation_id:4,addr:0x000012c041400000,size:16778240,total:20971520,used:16780288}", false)
                .unwrap(),
            r#"{"allocation_id":4,"addr":"0x000012c041400000","size":16778240,"total":20971520,"used":16780288}"#
        );
    }

    #[test]
    fn old_dialect_drops_empty_values_and_takes_a_free_size_magnitude() {
        let mut notes = AttrNotes::default();
        assert_eq!(
            to_json(
                "{addr:20616939216384,size:-14336,owner:,total:2097152,used:3645440}",
                true,
                &mut notes
            )
            .unwrap(),
            r#"{"addr":20616939216384,"size":14336,"total":2097152,"used":3645440}"#
        );
        assert_eq!(
            notes,
            AttrNotes {
                empty_values: 1,
                negative_sizes: 1
            }
        );
        assert!(json("{size:-5}", false).unwrap_err().contains("negative"));
    }

    #[test]
    fn a_value_with_commas_keeps_them_and_json_passes_through() {
        assert_eq!(
            json("{owner:PTA@model@a,b,size:8}", false).unwrap(),
            r#"{"owner":"PTA@model@a,b","size":8}"#
        );
        assert_eq!(json(r#"{"size":8}"#, false).unwrap(), r#"{"size":8}"#);
        assert_eq!(json("", false).unwrap(), "{}");
        assert!(json("size:8", false).is_err());
        assert!(json("{size:8,size:9}", false)
            .unwrap_err()
            .contains("twice"));
        assert!(json("{size:big}", false)
            .unwrap_err()
            .contains("not an integer"));
    }
}
