//! The frame format of the control channel `msmemscope --pid` talks over (docs/cli.md#attach).
//! Every frame is a 12-byte little-endian header followed by a UTF-8 JSON payload of at most
//! [`MAX_PAYLOAD`] bytes:
//!
//! ```text
//!   version u8 (= 1) | type u8 | flags u16 | seq u16 | reserved u16 | payload_len u32
//! ```
//!
//! Types: 1 request `{"command": "…"}`, 2 response `{"status": 0|1, "output": "…"}`, 3 error
//! `{"error": "…"}`. A response longer than one frame is split: every frame but the last has
//! [`FLAG_MORE`] set, and the client joins the outputs. Both sides use this module: the runtime's
//! listener (crates/runtime/src/control) and the CLI's attach client.

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 12;
pub const MAX_PAYLOAD: u32 = 64 * 1024;

pub const TYPE_REQUEST: u8 = 1;
pub const TYPE_RESPONSE: u8 = 2;
pub const TYPE_ERROR: u8 = 3;

/// More response frames follow for the same `seq`.
pub const FLAG_MORE: u16 = 1;

/// Output bytes per response frame: JSON escaping at most sextuples a byte, so a chunk always
/// fits the payload limit.
/// The command words a runtime answers (`help` lists them with their meaning).
pub const COMMAND_WORDS: [&str; 8] = [
    "start",
    "stop",
    "step",
    "display config",
    "display memory summary",
    "display host_leak summary",
    "help",
    "exit",
];

pub const OUTPUT_CHUNK: usize = 10 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub kind: u8,
    pub flags: u16,
    pub seq: u16,
    pub payload_len: u32,
}

impl Header {
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Header {
        Header {
            version: bytes[0],
            kind: bytes[1],
            flags: u16::from_le_bytes([bytes[2], bytes[3]]),
            seq: u16::from_le_bytes([bytes[4], bytes[5]]),
            payload_len: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
        }
    }
}

/// One encoded frame of `kind` with `payload`.
pub fn encode(kind: u8, flags: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// An error frame with a one-line reason.
pub fn error_frame(seq: u16, reason: &str) -> Vec<u8> {
    let payload = serde_json::json!({ "error": reason }).to_string();
    encode(TYPE_ERROR, 0, seq, payload.as_bytes())
}

/// The response frames for `output`: one, or several joined by [`FLAG_MORE`].
pub fn response_frames(seq: u16, status: i32, output: &str) -> Vec<Vec<u8>> {
    let mut chunks = Vec::new();
    let mut rest = output;
    loop {
        let mut cut = rest.len().min(OUTPUT_CHUNK);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        chunks.push(&rest[..cut]);
        rest = &rest[cut..];
        if rest.is_empty() {
            break;
        }
    }
    let last = chunks.len() - 1;
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let payload = serde_json::json!({ "status": status, "output": chunk }).to_string();
            let flags = if i < last { FLAG_MORE } else { 0 };
            encode(TYPE_RESPONSE, flags, seq, payload.as_bytes())
        })
        .collect()
}

/// Reads one frame, refusing a bad version or a payload over the limit before reading (or
/// allocating for) the payload.
pub fn read(stream: &mut impl std::io::Read) -> Result<(Header, Vec<u8>), String> {
    let mut header = [0u8; HEADER_LEN];
    stream
        .read_exact(&mut header)
        .map_err(|e| format!("no reply from the process: {e}"))?;
    let h = Header::parse(&header);
    if h.version != VERSION {
        return Err(format!("reply frame of unsupported version {}", h.version));
    }
    if h.payload_len > MAX_PAYLOAD {
        return Err(format!(
            "reply frame of {} bytes exceeds the limit",
            h.payload_len
        ));
    }
    let mut payload = vec![0u8; h.payload_len as usize];
    stream
        .read_exact(&mut payload)
        .map_err(|e| format!("truncated reply from the process: {e}"))?;
    Ok((h, payload))
}

/// What a request header says about the frame, before its payload is read.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderCheck {
    /// A request: read `payload_len` bytes.
    Request,
    /// A frame of another type with an acceptable length: skip its payload, answer the error.
    WrongType(String),
    /// The stream cannot be trusted any more: answer the error and close.
    Fatal(String),
}

pub fn check_request_header(h: &Header) -> HeaderCheck {
    if h.version != VERSION {
        return HeaderCheck::Fatal(format!(
            "unsupported frame version {} (expected {VERSION})",
            h.version
        ));
    }
    if h.payload_len > MAX_PAYLOAD {
        return HeaderCheck::Fatal(format!(
            "payload of {} bytes exceeds the {} KiB limit",
            h.payload_len,
            MAX_PAYLOAD / 1024
        ));
    }
    if h.kind != TYPE_REQUEST {
        return HeaderCheck::WrongType(format!(
            "unexpected frame type {} (a client sends type {TYPE_REQUEST}, request)",
            h.kind
        ));
    }
    HeaderCheck::Request
}

/// The command of a request payload, normalised (words separated by single spaces).
pub fn parse_request(payload: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(payload).map_err(|_| "payload is not UTF-8".to_string())?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("bad request JSON: {e}"))?;
    let command = value
        .get("command")
        .and_then(|c| c.as_str())
        .ok_or_else(|| "bad request: expected {\"command\": \"…\"}".to_string())?;
    Ok(command.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The pid and uid of the process at the other end of a connected Unix socket (SO_PEERCRED):
/// the listener checks who attaches, the client checks who serves.
pub fn peer_credentials(fd: std::os::fd::RawFd) -> std::io::Result<(i32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred into the buffer of `len` bytes we pass.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(frame: &[u8]) -> Header {
        Header::parse(frame[..HEADER_LEN].try_into().unwrap())
    }

    #[test]
    fn header_round_trip() {
        let frame = encode(TYPE_REQUEST, 0, 7, br#"{"command":"help"}"#);
        let h = header_of(&frame);
        assert_eq!(
            h,
            Header {
                version: 1,
                kind: 1,
                flags: 0,
                seq: 7,
                payload_len: 18
            }
        );
        assert_eq!(check_request_header(&h), HeaderCheck::Request);
        assert_eq!(parse_request(&frame[HEADER_LEN..]).unwrap(), "help");
    }

    #[test]
    fn bad_headers_and_payloads() {
        let mut h = header_of(&encode(TYPE_REQUEST, 0, 1, b"{}"));
        h.version = 2;
        assert!(
            matches!(check_request_header(&h), HeaderCheck::Fatal(m) if m.contains("version 2"))
        );
        h.version = 1;
        h.payload_len = u32::MAX;
        assert!(matches!(check_request_header(&h), HeaderCheck::Fatal(m) if m.contains("exceeds")));
        h.payload_len = 2;
        h.kind = 9;
        assert!(matches!(
            check_request_header(&h),
            HeaderCheck::WrongType(_)
        ));
        assert_eq!(
            parse_request(b"\xff\xfe").unwrap_err(),
            "payload is not UTF-8"
        );
        assert!(parse_request(b"{nope")
            .unwrap_err()
            .starts_with("bad request JSON"));
        assert!(parse_request(b"{\"cmd\":1}")
            .unwrap_err()
            .starts_with("bad request:"));
        assert_eq!(
            parse_request(br#"{"command":"  display   host_leak summary "}"#).unwrap(),
            "display host_leak summary"
        );
    }

    #[test]
    fn long_output_is_split_within_the_limit() {
        let output = "é\"\n".repeat(20_000);
        let frames = response_frames(3, 0, &output);
        assert!(frames.len() > 1);
        let mut joined = String::new();
        for (i, f) in frames.iter().enumerate() {
            let h = header_of(f);
            assert!(h.payload_len <= MAX_PAYLOAD);
            assert_eq!(h.flags & FLAG_MORE != 0, i + 1 < frames.len());
            let v: serde_json::Value = serde_json::from_slice(&f[HEADER_LEN..]).unwrap();
            joined.push_str(v["output"].as_str().unwrap());
        }
        assert_eq!(joined, output);
        assert_eq!(response_frames(1, 1, "").len(), 1);
    }
}
