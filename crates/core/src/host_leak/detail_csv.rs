//! `block_detail_{stage}.csv`: one row per unfreed ledger block, largest first, RFC 4180.

#[cfg(test)]
use super::model::AllocDomain;
use super::model::BlockDetail;

/// The original msMemScope's columns, then the allocator the block came from (`malloc` or
/// `pymalloc`).
pub const HEADER: &str = "addr,size,alloc_ts,Call Stack(C),Call Stack(Python),Domain";

/// The columns a window sampled by bytes adds: every row is then a sampled block (`Sampled`
/// is `yes`), standing for `Estimated Bytes` of the program's allocations.
pub const SAMPLED_COLUMNS: &str = ",Sampled,Estimated Bytes";

/// Renders the rows in the order given (the caller sorts, largest first). Stacks are one
/// field each, frames separated by newlines inside the quoted field. `sampled`: the window
/// sampled by bytes, and the rows say what each sample stands for.
pub fn render_block_detail(blocks: &[BlockDetail], sampled: bool) -> String {
    let mut out = String::with_capacity(64 + blocks.len() * 128);
    out.push_str(HEADER);
    if sampled {
        out.push_str(SAMPLED_COLUMNS);
    }
    out.push_str("\r\n");
    for b in blocks {
        out.push_str(&format!("0x{:016x},{},{},", b.addr, b.size, b.alloc_ts_ns));
        out.push_str(&quote(&b.c_stack.join("\n")));
        out.push(',');
        out.push_str(&quote(&b.python_stack.join("\n")));
        out.push(',');
        out.push_str(b.domain.label());
        if sampled {
            let estimate = b.estimated_bytes.unwrap_or(b.size);
            out.push_str(&format!(",yes,{estimate}"));
        }
        out.push_str("\r\n");
    }
    out
}

/// Sorts blocks largest first; ties by address so the file is deterministic.
pub fn sort_blocks(blocks: &mut [BlockDetail]) {
    blocks.sort_by(|a, b| b.size.cmp(&a.size).then(a.addr.cmp(&b.addr)));
}

/// RFC 4180: a field containing a comma, quote, CR or LF is quoted, quotes doubled.
fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_stacks_and_orders() {
        let mut blocks = vec![
            BlockDetail {
                addr: 0x10,
                size: 8,
                alloc_ts_ns: 5,
                c_stack: vec![],
                python_stack: vec!["a.py(3): f".into()],
                domain: AllocDomain::Pymalloc,
                estimated_bytes: None,
            },
            BlockDetail {
                addr: 0x20,
                size: 64,
                alloc_ts_ns: 6,
                c_stack: vec!["f (m+0x1)".into(), "g \"q\", x".into()],
                python_stack: vec![],
                domain: AllocDomain::Malloc,
                estimated_bytes: Some(65536),
            },
        ];
        sort_blocks(&mut blocks);
        let text = render_block_detail(&blocks, false);
        assert_eq!(
            text,
            "addr,size,alloc_ts,Call Stack(C),Call Stack(Python),Domain\r\n\
             0x0000000000000020,64,6,\"f (m+0x1)\ng \"\"q\"\", x\",,malloc\r\n\
             0x0000000000000010,8,5,,a.py(3): f,pymalloc\r\n"
        );
        let text = render_block_detail(&blocks[..1], true);
        assert_eq!(
            text,
            "addr,size,alloc_ts,Call Stack(C),Call Stack(Python),Domain,Sampled,Estimated Bytes\r\n\
             0x0000000000000020,64,6,\"f (m+0x1)\ng \"\"q\"\", x\",,malloc,yes,65536\r\n"
        );
    }
}
