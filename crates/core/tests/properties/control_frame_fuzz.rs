//! Property tests of the attach channel's frames, both sides: any bytes a peer sends are
//! either a frame within the limits or one line of refusal, never a panic or an allocation
//! beyond the payload limit; a well-formed request comes back as its normalised command.

use msmemscope_core::control_frame::{
    check_request_header, parse_request, read, response_frames, Header, HeaderCheck, HEADER_LEN,
    MAX_PAYLOAD, TYPE_REQUEST, TYPE_RESPONSE,
};
use proptest::prelude::*;

use crate::util::config;

proptest! {
    #![proptest_config(config(256))]

    /// What the server does with a header: a request it may read, or one line of refusal; a
    /// length over the limit is refused before anything is read.
    #[test]
    fn any_header_is_checked_without_panicking(bytes in proptest::array::uniform12(any::<u8>())) {
        let h = Header::parse(&bytes);
        match check_request_header(&h) {
            HeaderCheck::Request => {
                prop_assert!(h.payload_len <= MAX_PAYLOAD);
                prop_assert_eq!(h.kind, TYPE_REQUEST);
            }
            HeaderCheck::WrongType(line) | HeaderCheck::Fatal(line) => {
                prop_assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
            }
        }
    }

    /// Any payload bytes: a command or one line saying why not.
    #[test]
    fn any_payload_is_parsed_or_refused_in_one_line(payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Err(line) = parse_request(&payload) {
            prop_assert!(!line.contains('\n'), "{line:?}");
        }
    }

    /// A request built from any words comes back with single spaces.
    #[test]
    fn requests_round_trip(words in proptest::collection::vec("[a-z_]{1,12}", 1..4), gap in "[ \t]{1,3}") {
        let command = words.join(&gap);
        let payload = serde_json::json!({ "command": command }).to_string();
        prop_assert_eq!(parse_request(payload.as_bytes()).unwrap(), words.join(" "));
    }

    /// The client reads any byte stream as one frame or one refusal, and never allocates for a
    /// payload length over the limit.
    #[test]
    fn the_client_reads_any_stream(bytes in proptest::collection::vec(any::<u8>(), 0..64), huge in any::<bool>()) {
        let mut stream = bytes.clone();
        if huge && stream.len() >= HEADER_LEN {
            stream[0] = msmemscope_core::control_frame::VERSION;
            stream[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        }
        match read(&mut stream.as_slice()) {
            Ok((h, payload)) => {
                prop_assert!(h.payload_len <= MAX_PAYLOAD);
                prop_assert_eq!(payload.len(), h.payload_len as usize);
            }
            Err(line) => prop_assert!(!line.contains('\n'), "{line:?}"),
        }
    }

    /// Responses of any length are split into frames within the limit that read back whole.
    #[test]
    fn responses_split_and_read_back(output in "\\PC{0,30000}", status in -3i32..3) {
        let frames = response_frames(7, status, &output);
        let mut text = String::new();
        for f in &frames {
            let (h, payload) = read(&mut f.as_slice()).unwrap();
            prop_assert_eq!(h.kind, TYPE_RESPONSE);
            let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            text.push_str(v["output"].as_str().unwrap());
        }
        prop_assert_eq!(text, output);
    }
}
