//! The one sequential stage of the fast CSV reader: reading the file in large blocks and
//! cutting each at its last record boundary, so that every chunk holds whole records and can
//! be parsed on its own. A record boundary is a line end outside quotes: the parity of the
//! quotes since the chunk's start (always a record start) tells which line ends those are.

use crate::events::source::MAX_ROW_BYTES;

/// Whole records from a record start, and where they sit in the file.
pub(super) struct Chunk {
    pub(super) seq: u64,
    /// The byte offset of the first record. Lines and records before it are counted by the
    /// consumer, which sees the chunks in order.
    pub(super) offset: u64,
    /// The records, each with its line end but for a last record at the end of the file.
    pub(super) data: Vec<u8>,
    /// Whether the fast path ends after this chunk's records and leaves the rest of the file
    /// to the row-by-row reader: a record longer than a dump row may be, a quote left open at
    /// the end of the file, a read error.
    pub(super) hand_over: bool,
}

pub(super) struct Splitter {
    file: std::fs::File,
    block: usize,
    /// Bytes read past the last cut: the start of the next chunk.
    carry: Vec<u8>,
    /// Where `carry` starts.
    offset: u64,
    seq: u64,
    ended: bool,
}

impl Splitter {
    /// Reads `file` from `offset` (a record start), in blocks of about `block` bytes.
    pub(super) fn new(file: std::fs::File, offset: u64, block: usize) -> Splitter {
        Splitter {
            file,
            block: block.max(1),
            carry: Vec::new(),
            offset,
            seq: 0,
            ended: false,
        }
    }

    /// Whether the last chunk has been cut.
    pub(super) fn ended(&self) -> bool {
        self.ended
    }

    /// Fills `chunk` with the next whole records; false when the file has no more.
    pub(super) fn next(&mut self, chunk: &mut Chunk) -> bool {
        if self.ended {
            return false;
        }
        chunk.data.clear();
        chunk.data.extend_from_slice(&self.carry);
        self.carry.clear();
        chunk.seq = self.seq;
        chunk.offset = self.offset;
        chunk.hand_over = false;
        self.seq += 1;
        let mut want = self.block.saturating_sub(chunk.data.len()) as u64;
        let (at_end, cut) = loop {
            let at_end = match read_up_to(&self.file, want as usize, &mut chunk.data) {
                Ok(n) => n < want as usize,
                Err(_) => {
                    // The row-by-row reader reads this part again and reports the error.
                    chunk.data.clear();
                    chunk.hand_over = true;
                    self.ended = true;
                    return true;
                }
            };
            let cut = last_boundary(&chunk.data, at_end);
            // A record longer than a block: read on (doubling) until it ends, up to the
            // longest row a dump may hold, past which the other reader refuses it.
            if cut > 0 || at_end || chunk.data.len() > MAX_ROW_BYTES {
                break (at_end, cut);
            }
            want = chunk.data.len() as u64;
        };
        if at_end {
            self.ended = true;
        }
        if cut < chunk.data.len() && (at_end || cut == 0) {
            // Left over at the end of the file (a quote never closed), or no boundary in
            // more than the longest row: the other reader takes it from there.
            chunk.hand_over = true;
            self.ended = true;
        }
        self.carry.extend_from_slice(&chunk.data[cut..]);
        chunk.data.truncate(cut);
        self.offset += cut as u64;
        !(chunk.data.is_empty() && !chunk.hand_over && self.ended)
    }
}

/// Appends up to `want` bytes of `file` to `data`; how many (fewer only at the file's end).
/// One `read` per block where `read_to_end` would make several (it probes and grows), and
/// straight into the vector's spare room: zero-filling each block first cost a pass over it,
/// under the splitter's lock.
fn read_up_to(file: &std::fs::File, want: usize, data: &mut Vec<u8>) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    data.reserve(want);
    let mut filled = 0;
    while filled < want {
        let room = &mut data.spare_capacity_mut()[..want - filled];
        // SAFETY: `read` writes at most `room.len()` bytes into `room`, the vector's own spare
        // capacity, which nothing else borrows meanwhile; `file` is an open descriptor.
        let n = unsafe { libc::read(file.as_raw_fd(), room.as_mut_ptr().cast(), room.len()) };
        match n {
            0 => break,
            n if n > 0 => {
                let n = n as usize;
                // SAFETY: `read` initialised the first `n` bytes of the spare capacity.
                unsafe { data.set_len(data.len() + n) };
                filled += n;
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(filled)
}

/// Where the last whole record of `data` (which starts at a record start) ends: after the
/// last line end with an even number of quotes before it, found from the back with SIMD
/// counts (quotes are dense in a dump; visiting each would cost more than the parse). At the
/// end of the file a last record without a line end counts, if its quotes are closed.
fn last_boundary(data: &[u8], at_end: bool) -> usize {
    let quotes = |bytes: &[u8]| memchr::memchr_iter(b'"', bytes).count();
    let mut end = data.len();
    let mut before = quotes(data);
    if at_end && before.is_multiple_of(2) {
        return data.len();
    }
    while let Some(nl) = memchr::memrchr(b'\n', &data[..end]) {
        before -= quotes(&data[nl..end]);
        if before.is_multiple_of(2) {
            return nl + 1;
        }
        end = nl;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::last_boundary;

    #[test]
    fn boundaries_are_line_ends_outside_quotes() {
        assert_eq!(last_boundary(b"a,b\nc,\"d\ne\"\nf", false), 12);
        assert_eq!(last_boundary(b"a,b\nc,\"d\ne\"\nf", true), 13);
        assert_eq!(last_boundary(b"a,b\nc,\"d\ne\"\n", true), 12);
        assert_eq!(last_boundary(b"a,\"b\nc", true), 0);
        assert_eq!(last_boundary(b"a,\"b\nc\n", false), 0);
        assert_eq!(last_boundary(b"x\na,\"b\nc\n", false), 2);
        assert_eq!(last_boundary(b"", true), 0);
    }
}
