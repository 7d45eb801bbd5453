//! The `sanitizer-op:` mark message (docs/analyses.md#sanitizer; the original msMemScope's
//! custom-operator marks):
//!
//! ```text
//! sanitizer-op: name=<operator>;read=<alias:addr:size>,...;write=<alias:addr:size>,...
//! ```
//!
//! Rules, all enforced here:
//! - at most [`MAX_MESSAGE_BYTES`] bytes in all; the prefix `sanitizer-op:` first, then optional
//!   spaces;
//! - top-level fields separated by `;`, each `key=value`; spaces around a field are allowed;
//!   keys `name` (required), `read`, `write` (optional), each at most once, no empty field;
//! - `name`: non-empty, without `,`, `=` or whitespace (`::` as in `my_ext::op` is fine);
//! - `read`/`write`: items separated by `,` (an empty value means no items), each item
//!   `alias:addr:size`; alias non-empty, without whitespace, shorter than [`ALIAS_LIMIT`] bytes;
//!   addr and size decimal or `0x`-prefixed hexadecimal, 64-bit, and the range must not pass the
//!   end of the address space; a size of 0 touches nothing;
//! - a range given in both `read` and `write` is one in-place (read-write) access.
//!
//! Errors carry the 1-based byte column where the offending part starts.

use std::fmt;

/// The prefix that routes a mark to the sanitizer.
pub const PREFIX: &str = "sanitizer-op:";
/// The longest accepted message, in bytes (prefix included).
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Aliases must be shorter than this many bytes.
pub const ALIAS_LIMIT: usize = 32;
/// The format, as error messages quote it.
pub const FORMAT: &str =
    "sanitizer-op: name=<operator>;read=<alias:addr:size>,...;write=<alias:addr:size>,...";

/// One argument of an operator: the memory `[addr, addr + size)` under the caller's alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    pub alias: String,
    pub addr: u64,
    pub size: u64,
}

/// What an operator reads and writes; `read_write` holds the in-place ranges (given in both
/// lists) with the aliases of both sides (`a` or `a/b` when they differ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpMark {
    pub name: String,
    pub read_only: Vec<Arg>,
    pub read_write: Vec<Arg>,
    pub write_only: Vec<Arg>,
}

impl OpMark {
    /// The ranges the operator writes (in place or not).
    pub fn writes(&self) -> impl Iterator<Item = &Arg> {
        self.read_write.iter().chain(&self.write_only)
    }
}

/// Why a message was rejected, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkError {
    /// 1-based byte column of the offending part.
    pub column: usize,
    pub reason: String,
}

impl fmt::Display for MarkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.reason)
    }
}

impl std::error::Error for MarkError {}

/// Whether `message` is meant for the sanitizer (then [`parse`] decides whether it is valid).
pub fn is_sanitizer_mark(message: &str) -> bool {
    message.starts_with(PREFIX)
}

fn err<T>(offset: usize, reason: impl Into<String>) -> Result<T, MarkError> {
    Err(MarkError {
        column: offset + 1,
        reason: reason.into(),
    })
}

/// Parses a `sanitizer-op:` message.
pub fn parse(message: &str) -> Result<OpMark, MarkError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return err(
            MAX_MESSAGE_BYTES,
            format!(
                "the message is {} bytes; at most {MAX_MESSAGE_BYTES} are accepted",
                message.len()
            ),
        );
    }
    let Some(body) = message.strip_prefix(PREFIX) else {
        return err(0, format!("the message does not start with `{PREFIX}`"));
    };
    let mut name: Option<String> = None;
    let mut reads: Option<Vec<(Arg, usize)>> = None;
    let mut writes: Option<Vec<(Arg, usize)>> = None;
    let mut offset = PREFIX.len();
    for field in body.split(';') {
        let start = offset;
        offset += field.len() + 1;
        let lead = field.len() - field.trim_start_matches(' ').len();
        let field = field.trim_matches(' ');
        let at = start + lead;
        if field.is_empty() {
            return err(
                at,
                "empty field (`;` twice in a row, or at the start or end)",
            );
        }
        let Some((key, value)) = field.split_once('=') else {
            return err(
                at,
                format!("field `{field}` has no `=`; fields are name=, read=, write="),
            );
        };
        let value_at = at + key.len() + 1;
        match key {
            "name" => {
                if name.is_some() {
                    return err(at, "field `name` is given twice");
                }
                name = Some(parse_name(value, value_at)?);
            }
            "read" | "write" => {
                let slot = if key == "read" {
                    &mut reads
                } else {
                    &mut writes
                };
                if slot.is_some() {
                    return err(at, format!("field `{key}` is given twice"));
                }
                *slot = Some(parse_items(key, value, value_at)?);
            }
            _ => {
                return err(
                    at,
                    format!("unknown field `{key}`; fields are name, read, write"),
                )
            }
        }
    }
    let Some(name) = name else {
        return err(message.len(), "field `name=<operator>` is missing");
    };
    Ok(combine(
        name,
        reads.unwrap_or_default(),
        writes.unwrap_or_default(),
    ))
}

fn parse_name(value: &str, at: usize) -> Result<String, MarkError> {
    if value.is_empty() {
        return err(at, "`name` is empty");
    }
    if let Some((i, c)) = value
        .char_indices()
        .find(|&(_, c)| c == ',' || c == '=' || c.is_whitespace() || c.is_control())
    {
        return err(
            at + i,
            format!(
                "`name` contains {}; an operator name cannot contain `,`, `=`, `;` or whitespace",
                describe_char(c)
            ),
        );
    }
    Ok(value.to_owned())
}

fn describe_char(c: char) -> String {
    if c.is_whitespace() || c.is_control() {
        format!("the character {:?}", c)
    } else {
        format!("`{c}`")
    }
}

/// The items of a `read`/`write` value, each with its column offset.
fn parse_items(key: &str, value: &str, at: usize) -> Result<Vec<(Arg, usize)>, MarkError> {
    let mut items = Vec::new();
    if value.is_empty() {
        return Ok(items);
    }
    let mut offset = at;
    for item in value.split(',') {
        let item_at = offset;
        offset += item.len() + 1;
        if item.is_empty() {
            return err(
                item_at,
                format!("empty item in `{key}` (`,` twice in a row, or at the start or end)"),
            );
        }
        items.push((parse_item(key, item, item_at)?, item_at));
    }
    Ok(items)
}

fn parse_item(key: &str, item: &str, at: usize) -> Result<Arg, MarkError> {
    let parts: Vec<&str> = item.split(':').collect();
    let [alias, addr, size] = parts[..] else {
        return err(
            at,
            format!(
                "item `{item}` of `{key}` has {} `:`-separated parts; expected alias:addr:size",
                parts.len()
            ),
        );
    };
    if alias.is_empty() {
        return err(at, format!("item `{item}` of `{key}` has an empty alias"));
    }
    if let Some((i, c)) = alias
        .char_indices()
        .find(|&(_, c)| c.is_whitespace() || c.is_control())
    {
        return err(
            at + i,
            format!("alias `{alias}` contains {}", describe_char(c)),
        );
    }
    if alias.len() >= ALIAS_LIMIT {
        return err(
            at,
            format!(
                "alias `{alias}` is {} bytes; aliases must be shorter than {ALIAS_LIMIT} bytes",
                alias.len()
            ),
        );
    }
    let addr_at = at + alias.len() + 1;
    let size_at = addr_at + addr.len() + 1;
    let addr = parse_number(addr).map_err(|why| MarkError {
        column: addr_at + 1,
        reason: format!("address `{addr}` of `{alias}` {why}"),
    })?;
    let size = parse_number(size).map_err(|why| MarkError {
        column: size_at + 1,
        reason: format!("size `{size}` of `{alias}` {why}"),
    })?;
    if addr.checked_add(size).is_none() {
        return err(
            addr_at,
            format!(
                "the range of `{alias}` ({addr:#x} + {size} bytes) passes the end of the \
                 64-bit address space"
            ),
        );
    }
    Ok(Arg {
        alias: alias.to_owned(),
        addr,
        size,
    })
}

/// A decimal or `0x`-prefixed hexadecimal 64-bit number; the error completes a sentence.
fn parse_number(text: &str) -> Result<u64, &'static str> {
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    let valid = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    if !valid {
        return Err("is neither decimal nor 0x-prefixed hexadecimal");
    }
    u64::from_str_radix(digits, radix).map_err(|_| "does not fit in 64 bits")
}

/// Splits the ranges into read-only, in-place and write-only accesses. A range in both lists
/// is in place; its aliases are joined when the two sides name it differently.
fn combine(name: String, reads: Vec<(Arg, usize)>, writes: Vec<(Arg, usize)>) -> OpMark {
    let mut read_only = Vec::new();
    let mut read_write: Vec<Arg> = Vec::new();
    let mut write_only = Vec::new();
    let same = |a: &Arg, b: &Arg| a.addr == b.addr && a.size == b.size;
    for (w, _) in writes {
        let mut aliases: Vec<&str> = Vec::new();
        for (r, _) in reads.iter().filter(|(r, _)| same(r, &w)) {
            if !aliases.contains(&r.alias.as_str()) {
                aliases.push(&r.alias);
            }
        }
        if aliases.is_empty() {
            write_only.push(w);
            continue;
        }
        if !aliases.contains(&w.alias.as_str()) {
            aliases.push(&w.alias);
        }
        let alias = aliases.join("/");
        if !read_write.iter().any(|x| same(x, &w)) {
            read_write.push(Arg { alias, ..w });
        }
    }
    for (r, _) in reads {
        if !read_write.iter().any(|w| same(w, &r)) {
            read_only.push(r);
        }
    }
    OpMark {
        name,
        read_only,
        read_write,
        write_only,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(alias: &str, addr: u64, size: u64) -> Arg {
        Arg {
            alias: alias.into(),
            addr,
            size,
        }
    }

    fn rejected(message: &str) -> String {
        parse(message).unwrap_err().to_string()
    }

    #[test]
    fn the_original_example() {
        let m = parse(
            "sanitizer-op: name=my_ext.my_fused_op;read=input_a:0x7f00:1024,\
             input_b:0x7f04:512;write=output:0x7f08:2048",
        )
        .unwrap();
        assert_eq!(m.name, "my_ext.my_fused_op");
        assert_eq!(
            m.read_only,
            vec![arg("input_a", 0x7f00, 1024), arg("input_b", 0x7f04, 512)]
        );
        assert!(m.read_write.is_empty());
        assert_eq!(m.write_only, vec![arg("output", 0x7f08, 2048)]);
    }

    #[test]
    fn decimal_and_hex_numbers_fields_in_any_order_and_optional_lists() {
        let m = parse("sanitizer-op:write=o:4096:0X10;name=ns::op").unwrap();
        assert_eq!(m.name, "ns::op");
        assert!(m.read_only.is_empty());
        assert_eq!(m.write_only, vec![arg("o", 4096, 16)]);
        let m = parse("sanitizer-op: name=only.reads;read=x:0xFFFFffff:0").unwrap();
        assert_eq!(m.read_only, vec![arg("x", 0xffff_ffff, 0)]);
        let m = parse("sanitizer-op:  name=a ; read= ;write=").unwrap();
        assert_eq!(
            (m.name.as_str(), m.read_only.len(), m.writes().count()),
            ("a", 0, 0)
        );
        let max = format!("sanitizer-op: name=x;read=a:{}:1", u64::MAX - 1);
        assert_eq!(parse(&max).unwrap().read_only[0].addr, u64::MAX - 1);
    }

    #[test]
    fn in_place_ranges() {
        let m = parse(
            "sanitizer-op: name=op;read=x:0x100:64,y:0x200:8,z:0x100:32;write=x:0x100:64,o:0x200:8",
        )
        .unwrap();
        assert_eq!(
            m.read_write,
            vec![arg("x", 0x100, 64), arg("y/o", 0x200, 8)]
        );
        assert_eq!(m.read_only, vec![arg("z", 0x100, 32)]);
        assert!(m.write_only.is_empty());
        assert_eq!(m.writes().count(), 2);
    }

    #[test]
    fn aliases_up_to_31_bytes() {
        let ok = format!("sanitizer-op: name=op;read={}:1:1", "a".repeat(31));
        assert_eq!(parse(&ok).unwrap().read_only[0].alias.len(), 31);
        let long = format!("sanitizer-op: name=op;read={}:1:1", "a".repeat(32));
        assert_eq!(
            rejected(&long),
            format!(
                "column 28: alias `{}` is 32 bytes; aliases must be shorter than 32 bytes",
                "a".repeat(32)
            )
        );
    }

    #[test]
    fn messages_up_to_1024_bytes() {
        let head = "sanitizer-op: name=";
        let ok = format!("{head}{}", "n".repeat(1024 - head.len()));
        assert_eq!(ok.len(), 1024);
        assert!(parse(&ok).is_ok());
        let long = format!("{ok}n");
        assert_eq!(
            rejected(&long),
            "column 1025: the message is 1025 bytes; at most 1024 are accepted"
        );
    }

    #[test]
    fn rejected_messages_name_the_reason_and_column() {
        let cases = [
            ("sanitizer op: name=x", "column 1: the message does not start with `sanitizer-op:`"),
            ("sanitizer-op:", "column 14: empty field (`;` twice in a row, or at the start or end)"),
            ("sanitizer-op: name=x;;read=a:1:1", "column 22: empty field (`;` twice in a row, or at the start or end)"),
            ("sanitizer-op: name=x;", "column 22: empty field (`;` twice in a row, or at the start or end)"),
            ("sanitizer-op: name=x;read", "column 22: field `read` has no `=`; fields are name=, read=, write="),
            ("sanitizer-op: name=x;size=3", "column 22: unknown field `size`; fields are name, read, write"),
            ("sanitizer-op: Name=x", "column 15: unknown field `Name`; fields are name, read, write"),
            ("sanitizer-op: name=x;name=y", "column 22: field `name` is given twice"),
            ("sanitizer-op: name=x;write=a:1:1;write=b:2:2", "column 34: field `write` is given twice"),
            ("sanitizer-op: read=a:1:1", "column 25: field `name=<operator>` is missing"),
            ("sanitizer-op: name=", "column 20: `name` is empty"),
            ("sanitizer-op: name=a,b", "column 21: `name` contains `,`; an operator name cannot contain `,`, `=`, `;` or whitespace"),
            ("sanitizer-op: name=a=b", "column 21: `name` contains `=`; an operator name cannot contain `,`, `=`, `;` or whitespace"),
            ("sanitizer-op: name=my op", "column 22: `name` contains the character ' '; an operator name cannot contain `,`, `=`, `;` or whitespace"),
            ("sanitizer-op: name=x;read=a:1:1,", "column 33: empty item in `read` (`,` twice in a row, or at the start or end)"),
            ("sanitizer-op: name=x;read=,a:1:1", "column 27: empty item in `read` (`,` twice in a row, or at the start or end)"),
            ("sanitizer-op: name=x;read=a:1", "column 27: item `a:1` of `read` has 2 `:`-separated parts; expected alias:addr:size"),
            ("sanitizer-op: name=x;write=a:1:2:3", "column 28: item `a:1:2:3` of `write` has 4 `:`-separated parts; expected alias:addr:size"),
            ("sanitizer-op: name=x;read=:1:1", "column 27: item `:1:1` of `read` has an empty alias"),
            ("sanitizer-op: name=x;read=a:1:1, b:2:2", "column 33: alias ` b` contains the character ' '"),
            ("sanitizer-op: name=x;read=a:(nil):4", "column 29: address `(nil)` of `a` is neither decimal nor 0x-prefixed hexadecimal"),
            ("sanitizer-op: name=x;read=a:0x:4", "column 29: address `0x` of `a` is neither decimal nor 0x-prefixed hexadecimal"),
            ("sanitizer-op: name=x;read=a:0x7g:4", "column 29: address `0x7g` of `a` is neither decimal nor 0x-prefixed hexadecimal"),
            ("sanitizer-op: name=x;read=a:-5:4", "column 29: address `-5` of `a` is neither decimal nor 0x-prefixed hexadecimal"),
            ("sanitizer-op: name=x;read=a:0x10000000000000000:4", "column 29: address `0x10000000000000000` of `a` does not fit in 64 bits"),
            ("sanitizer-op: name=x;read=a:18446744073709551616:4", "column 29: address `18446744073709551616` of `a` does not fit in 64 bits"),
            ("sanitizer-op: name=x;write=out:16:1k", "column 35: size `1k` of `out` is neither decimal nor 0x-prefixed hexadecimal"),
            ("sanitizer-op: name=x;write=out:16:", "column 35: size `` of `out` is neither decimal nor 0x-prefixed hexadecimal"),
            ("sanitizer-op: name=x;write=out:0xffffffffffffff00:0x100", "column 32: the range of `out` (0xffffffffffffff00 + 256 bytes) passes the end of the 64-bit address space"),
        ];
        for (message, expected) in cases {
            assert_eq!(rejected(message), expected, "message {message:?}");
        }
    }

    /// Random messages built from the format's own characters: parsing never panics, every
    /// rejection points inside the message (or just past it), and every acceptance keeps
    /// the rules.
    #[test]
    fn random_messages_never_panic_and_results_keep_the_rules() {
        const PIECES: &[&str] = &[
            "name=",
            "read=",
            "write=",
            ";",
            ",",
            ":",
            "=",
            " ",
            "0x",
            "0X",
            "ff",
            "12",
            "0",
            "a",
            "op.x",
            "::",
            "\u{e9}",
            "18446744073709551615",
            "99999999999999999999",
            "(nil)",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut accepted, mut rejected) = (0, 0);
        let pick = |n: u64, r: u64| (r % n) as usize;
        for _ in 0..20_000 {
            // A well-formed skeleton with random parts...
            let mut m = format!("{PREFIX} name=op{}", next() % 10);
            for key in ["read", "write"] {
                if next() % 3 == 0 {
                    continue;
                }
                let items: Vec<String> = (0..1 + next() % 3)
                    .map(|i| {
                        let addr = PIECES[pick(PIECES.len() as u64, next())];
                        let size = if next() % 2 == 0 { "64" } else { "0x10" };
                        let addr = if next() % 2 == 0 { "0x7f00" } else { addr };
                        format!("{key}{i}:{addr}:{size}")
                    })
                    .collect();
                m.push_str(&format!(";{key}={}", items.join(",")));
            }
            // ...then, for half of them, pieces spliced in at random byte boundaries.
            if next() % 2 == 0 {
                for _ in 0..1 + next() % 3 {
                    let mut at = pick(m.len() as u64 + 1, next());
                    while !m.is_char_boundary(at) {
                        at -= 1;
                    }
                    m.insert_str(at, PIECES[pick(PIECES.len() as u64, next())]);
                }
            }
            match parse(&m) {
                Ok(op) => {
                    accepted += 1;
                    assert!(!op.name.is_empty());
                    for a in op.read_only.iter().chain(&op.write_only) {
                        assert!(!a.alias.is_empty() && a.alias.len() < ALIAS_LIMIT, "{m:?}");
                    }
                    // In place: both sides' aliases, each within the limit.
                    for a in &op.read_write {
                        let longest = a.alias.split('/').map(str::len).max().unwrap_or(0);
                        assert!(longest > 0 && longest < ALIAS_LIMIT, "{m:?}");
                    }
                    for a in op.read_only.iter().chain(op.writes()) {
                        assert!(a.addr.checked_add(a.size).is_some(), "{m:?}");
                    }
                }
                Err(e) => {
                    rejected += 1;
                    assert!(e.column >= 1 && e.column <= m.len() + 1, "{m:?}: {e}");
                }
            }
        }
        assert!(accepted > 100 && rejected > 100, "{accepted} / {rejected}");
    }

    #[test]
    fn only_the_prefix_routes() {
        assert!(is_sanitizer_mark("sanitizer-op: name=x"));
        assert!(is_sanitizer_mark("sanitizer-op:garbage"));
        assert!(!is_sanitizer_mark(" sanitizer-op: name=x"));
        assert!(!is_sanitizer_mark("step start"));
    }
}
