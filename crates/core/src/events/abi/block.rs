//! A block row (a MALLOC or FREE of an allocator's block) as its producer hands it over: numbers
//! and texts the producer interned, with no Attr text. Formatting the Attr object cost the
//! program's thread more than queueing the row did (a PyTorch capture makes one per tensor);
//! the runtime copies the record and its writer thread renders the text, the same text the
//! producer used to write.

use super::StrRef;
use crate::events::attrs::{first_special, numeric_attr_index_of, string_attr_index_of, Plain};
use crate::events::row::{AttrNumbers, EventRow};

/// Bits of `BlockRecord::flags` besides `WANT_C_STACK`: which members the Attr object has.
pub const BLOCK_USED: u32 = 4;
pub const BLOCK_TOTAL: u32 = 8;
/// The `owner` member (`PTA[@category][@labels]`) and the allocation site's members.
pub const BLOCK_OWNER: u32 = 16;

/// One block row from a producer (`msmemscope_emit_block`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockRecord {
    /// The Event column's code: MALLOC or FREE.
    pub event: u32,
    /// The Event Type column's code.
    pub event_type: u32,
    /// One of `DEVICE_*`, and the CUDA index for `DEVICE_CUDA`.
    pub device_kind: u32,
    pub device_index: u32,
    pub ptr: u64,
    pub allocation_id: u64,
    pub size: u64,
    /// `WANT_C_STACK` and the `BLOCK_*` bits.
    pub flags: u32,
    pub reserved: u32,
    /// Bytes in use on the device after this row (with `BLOCK_USED`).
    pub used: u64,
    /// The allocator's own count of bytes allocated (with `BLOCK_TOTAL`).
    pub total: u64,
    /// Texts interned by the producer: they stay valid, unchanged, until the process exits,
    /// and are written as they are (JSON-escaped already). Empty: the member is left out.
    pub category: StrRef,
    pub labels: StrRef,
    /// The user's line that allocated, the innermost frame when it is another, the op.
    pub site: StrRef,
    pub frame: StrRef,
    pub op: StrRef,
    /// The module whose forward was running (`model.layers.3.attn`).
    pub module: StrRef,
    /// Python frames for this call only (copied), as in `EventRecord::python_stack`.
    pub python_stack: StrRef,
}

/// The part of a [`BlockRecord`] its Attr column is made of, kept with the queued row.
#[derive(Clone, Copy, Debug)]
pub struct BlockAttrs {
    pub allocation_id: u64,
    pub addr: u64,
    pub size: u64,
    pub used: Option<u64>,
    pub total: Option<u64>,
    /// The owner and site members, or none of them (a FREE row has none).
    pub owner: bool,
    pub category: StrRef,
    pub labels: StrRef,
    pub site: StrRef,
    pub frame: StrRef,
    pub op: StrRef,
    pub module: StrRef,
}

impl BlockAttrs {
    pub fn of(r: &BlockRecord) -> BlockAttrs {
        BlockAttrs {
            allocation_id: r.allocation_id,
            addr: r.ptr,
            size: r.size,
            used: (r.flags & BLOCK_USED != 0).then_some(r.used),
            total: (r.flags & BLOCK_TOTAL != 0).then_some(r.total),
            owner: r.flags & BLOCK_OWNER != 0,
            category: r.category,
            labels: r.labels,
            site: r.site,
            frame: r.frame,
            op: r.op,
            module: r.module,
        }
    }

    /// Writes the Attr object into `out` (cleared first):
    /// `{"allocation_id":…,"addr":"0x…","size":…[,"used":…][,"total":…][,"owner":"PTA[@category][@labels]"][,"site":"…"][,"frame":"…"][,"op":"…"][,"module":"…"]}`.
    /// Bytes that are not UTF-8 become U+FFFD.
    ///
    /// # Safety
    /// Every text of `self` points at bytes that are still valid (interned texts are).
    pub unsafe fn render(&self, out: &mut String) {
        // SAFETY: the caller's promise.
        unsafe { self.render_learning(out) };
    }

    /// Renders the Attr object into `text` (as [`BlockAttrs::render`]) and makes it `row`'s,
    /// with what the reader's quick check would learn of it (its numbers and string members,
    /// found while rendering, not by a scan of the text): the online analyses read a block
    /// row's size, owner and site without searching the text.
    ///
    /// # Safety
    /// As for [`BlockAttrs::render`].
    pub unsafe fn render_into_row(&self, mut text: String, row: &mut EventRow) {
        // SAFETY: the caller's promise.
        let found = unsafe { self.render_learning(&mut text) };
        // Taken before the move, which keeps the text where it is (what the numbers answer for).
        row.numbers =
            found.map_or_else(AttrNumbers::default, |found| AttrNumbers::of(&text, found));
        row.attrs_json = Some(text);
    }

    /// [`BlockAttrs::render`], returning what [`plain_object`] would find in the text, or
    /// `None` where it would take none (a string member that needs an escape).
    unsafe fn render_learning(&self, out: &mut String) -> Option<Plain> {
        // By hand (integers through itoa): the writer renders one per block row.
        let mut n = itoa::Buffer::new();
        let mut found = Plain::default();
        let mut number = |out: &mut String, found: &mut Plain, key: &[u8], value: u64| {
            out.push_str(n.format(value));
            if let Some(index) = numeric_attr_index_of(key) {
                found.present |= 1 << index;
                found.values[index] = value;
            }
        };
        out.clear();
        out.push_str("{\"allocation_id\":");
        number(out, &mut found, b"allocation_id", self.allocation_id);
        out.push_str(",\"addr\":\"0x");
        push_hex16(out, self.addr);
        out.push_str("\",\"size\":");
        number(out, &mut found, b"size", self.size);
        if let Some(used) = self.used {
            out.push_str(",\"used\":");
            number(out, &mut found, b"used", used);
        }
        if let Some(total) = self.total {
            out.push_str(",\"total\":");
            number(out, &mut found, b"total", total);
        }
        let mut plain = true;
        let mut string = |out: &str, found: &mut Plain, key: &[u8], start: usize| {
            plain &= first_special(&out.as_bytes()[start..]).is_none();
            if let (Some(index), Ok(start), Ok(end)) = (
                string_attr_index_of(key),
                u32::try_from(start),
                u32::try_from(out.len()),
            ) {
                found.strings_seen |= 1 << index;
                found.strings[index] = Some((start, end));
            } else {
                plain = false;
            }
        };
        if self.owner {
            out.push_str(",\"owner\":\"");
            let start = out.len();
            out.push_str("PTA");
            for part in [self.category, self.labels] {
                // SAFETY: the caller's promise.
                let text = unsafe { part.as_bytes() };
                if !text.is_empty() {
                    out.push('@');
                    push_lossy(out, text);
                }
            }
            string(out, &mut found, b"owner", start);
            out.push('"');
            for (member, key, text) in [
                (",\"site\":\"", &b"site"[..], self.site),
                (",\"frame\":\"", &b"frame"[..], self.frame),
                (",\"op\":\"", &b"op"[..], self.op),
                (",\"module\":\"", &b"module"[..], self.module),
            ] {
                // SAFETY: the caller's promise.
                let text = unsafe { text.as_bytes() };
                if !text.is_empty() {
                    out.push_str(member);
                    let start = out.len();
                    push_lossy(out, text);
                    string(out, &mut found, key, start);
                    out.push('"');
                }
            }
        }
        out.push('}');
        plain.then_some(found)
    }
}

/// `v` as 16 lowercase hex digits.
fn push_hex16(out: &mut String, v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((v >> (shift * 4)) & 0xf) as usize] as char);
    }
}

fn push_lossy(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(flags: u32) -> BlockRecord {
        BlockRecord {
            event: 1,
            event_type: 2,
            device_kind: 1,
            device_index: 0,
            ptr: 0x7f00_1234_5670,
            allocation_id: 42,
            size: 4096,
            flags,
            reserved: 0,
            used: 8192,
            total: 12288,
            category: StrRef::new("weight"),
            labels: StrRef::new("encoder@layer0"),
            site: StrRef::new("train.py:12 (step)"),
            frame: StrRef::new("torch/nn/modules/linear.py:125 (forward)"),
            op: StrRef::new("aten::empty"),
            module: StrRef::EMPTY,
            python_stack: StrRef::EMPTY,
        }
    }

    /// What rendering learns is what the reader's quick check finds in the text, whatever
    /// the texts hold (escapes, control characters, bytes that are not UTF-8, nothing).
    #[test]
    fn rendering_learns_what_the_quick_check_finds() {
        let texts: [&[u8]; 7] = [
            b"",
            b"weight",
            b"train.py:12 (step)",
            b"a\\\"b",
            b"tab\there",
            &[b'a', 0xff],
            "\u{e9}t\u{e9}".as_bytes(),
        ];
        let at = |i: usize| StrRef {
            ptr: texts[i % texts.len()].as_ptr().cast(),
            len: texts[i % texts.len()].len(),
        };
        for flags in [
            0,
            BLOCK_OWNER,
            BLOCK_OWNER | BLOCK_USED,
            BLOCK_TOTAL | BLOCK_OWNER,
        ] {
            for i in 0..texts.len() * 3 {
                let mut r = record(flags);
                (r.category, r.labels, r.site) = (at(i), at(i + 1), at(i + 2));
                (r.frame, r.op) = (at(i + 3), at(i * 5));
                let mut text = String::new();
                // SAFETY: the texts are the array's, alive for the test.
                let learned = unsafe { BlockAttrs::of(&r).render_learning(&mut text) };
                let scanned = crate::events::attrs::plain_object(&text);
                assert_eq!(learned, scanned, "{text}");
                let mut row = EventRow::new(
                    crate::events::Event::Malloc,
                    crate::events::EventType::Pta,
                    "",
                );
                // SAFETY: as above.
                unsafe { BlockAttrs::of(&r).render_into_row(String::new(), &mut row) };
                let mut searched = row.clone();
                searched.numbers = Default::default();
                for key in ["owner", "site", "frame", "op"] {
                    assert_eq!(row.attr_str(key), searched.attr_str(key), "{key} {text}");
                }
                for key in ["size", "used", "total", "allocation_id"] {
                    assert_eq!(row.attr_u64(key), searched.attr_u64(key), "{key} {text}");
                }
            }
        }
    }

    fn rendered(b: BlockAttrs) -> String {
        let mut out = String::from("left over");
        // SAFETY: the texts are static strings.
        unsafe { b.render(&mut out) };
        out
    }

    #[test]
    fn a_malloc_row_has_every_member_in_the_order_the_dump_writes_them() {
        let text = rendered(BlockAttrs::of(&record(BLOCK_USED | BLOCK_OWNER)));
        assert_eq!(
            text,
            r#"{"allocation_id":42,"addr":"0x00007f0012345670","size":4096,"used":8192,"owner":"PTA@weight@encoder@layer0","site":"train.py:12 (step)","frame":"torch/nn/modules/linear.py:125 (forward)","op":"aten::empty"}"#
        );
        assert!(crate::events::reader::check_attrs(&text).is_ok());
    }

    #[test]
    fn absent_texts_and_counts_leave_their_members_out() {
        let mut r = record(BLOCK_USED | BLOCK_TOTAL);
        assert_eq!(
            rendered(BlockAttrs::of(&r)),
            r#"{"allocation_id":42,"addr":"0x00007f0012345670","size":4096,"used":8192,"total":12288}"#
        );
        r.flags = BLOCK_OWNER;
        (r.category, r.site, r.op) = (StrRef::EMPTY, StrRef::EMPTY, StrRef::EMPTY);
        r.labels = StrRef::new("\u{e9}t\u{e9}");
        assert_eq!(
            rendered(BlockAttrs::of(&r)),
            "{\"allocation_id\":42,\"addr\":\"0x00007f0012345670\",\"size\":4096,\"owner\":\"PTA@\u{e9}t\u{e9}\",\"frame\":\"torch/nn/modules/linear.py:125 (forward)\"}"
        );
        let bad = [b'a', 0xff];
        r.frame = StrRef {
            ptr: bad.as_ptr().cast(),
            len: 2,
        };
        assert!(rendered(BlockAttrs::of(&r)).contains("\"frame\":\"a\u{fffd}\""));
    }
}
