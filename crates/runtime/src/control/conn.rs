//! One client's connection: its frames read without blocking (header checked before anything
//! is allocated for the payload), its command answered, its reply sent as the socket takes it.

use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use msmemscope_core::held_fd::{self, Identity};

use super::commands::answer_request;
use super::frame::{self, HeaderCheck, HEADER_LEN};
use super::Channel;
use crate::log;

/// How long a client has for one whole request (header and payload), counted from its
/// connection or from the end of the previous reply; then it is dropped.
pub(super) const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client has to take one whole reply.
const REPLY_DEADLINE: Duration = Duration::from_secs(30);

/// `Err(reason)` unless the peer is the same user or root.
pub(super) fn check_peer(stream: &UnixStream) -> Result<(), String> {
    let Ok((_, uid)) = frame::peer_credentials(stream.as_raw_fd()) else {
        return Err("permission denied: cannot read the peer's credentials".to_string());
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if uid == me || uid == 0 {
        Ok(())
    } else {
        Err(format!(
            "permission denied: uid {uid} may not attach to a process of uid {me}"
        ))
    }
}

/// Sends what the socket takes now of `bytes`, without waiting and without raising SIGPIPE
/// when the client has gone (the signal would stay pending on this thread, which blocks every
/// signal, but `MSG_NOSIGNAL` avoids it altogether). `Ok(n)`: `n` bytes sent, 0 when full.
pub(super) fn send_some(stream: &UnixStream, bytes: &[u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: sends from a valid buffer of `bytes.len()` bytes on an open socket.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// The payload of the frame being read, once its header passed the check.
enum Payload {
    /// A request: its bytes (`MAX_PAYLOAD` at most), `got` of them read so far.
    Keep { buf: Vec<u8>, got: usize },
    /// A frame of the wrong type: its bytes are skipped, then the reason is answered.
    Skip { left: usize, reason: String },
}

/// One accepted client: the frame it is sending, or the reply it is being sent.
pub(super) struct Conn {
    /// The channel whose commands the requests run.
    channel: &'static Channel,
    pub(super) stream: std::mem::ManuallyDrop<UnixStream>,
    /// The connection's identity: the program may close the number and reuse it.
    pub(super) id: Identity,
    /// Reading: the whole request must be in by then (from the connection, or from the end
    /// of the previous reply). Writing: the whole reply must be taken by then.
    pub(super) deadline: Instant,
    header: [u8; HEADER_LEN],
    header_got: usize,
    /// The header read and checked: its seq and payload.
    payload: Option<(u16, Payload)>,
    /// The reply not sent yet (from `out_pos`); while there is one, nothing is read.
    pub(super) out: Vec<u8>,
    out_pos: usize,
    /// Close once `out` is sent (a refusal, a fatal frame error, `exit`).
    close_after: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.id.holds(self.stream.as_raw_fd()) {
            // SAFETY: dropped once, here; the number is ours (checked just now).
            unsafe { std::mem::ManuallyDrop::drop(&mut self.stream) };
        }
    }
}

impl Conn {
    /// Checks the peer; `None` when the connection is done with already (refused).
    pub(super) fn accepted(channel: &'static Channel, stream: UnixStream) -> Option<Conn> {
        stream.set_nonblocking(true).ok()?;
        let (stream, id) = held_fd::hold(stream.into())?;
        let stream = UnixStream::from(stream);
        let mut conn = Conn {
            channel,
            stream: std::mem::ManuallyDrop::new(stream),
            id,
            deadline: Instant::now() + REQUEST_DEADLINE,
            header: [0; HEADER_LEN],
            header_got: 0,
            payload: None,
            out: Vec::new(),
            out_pos: 0,
            close_after: false,
        };
        if let Err(reason) = check_peer(&conn.stream) {
            log::info(&format!("control channel: {reason}"));
            conn.reply(vec![frame::error_frame(0, &reason)], true);
            return conn.flush().then_some(conn);
        }
        Some(conn)
    }

    pub(super) fn events(&self) -> libc::c_short {
        if self.out.is_empty() {
            libc::POLLIN
        } else {
            libc::POLLOUT
        }
    }

    /// Does what the socket allows now; `false` once the connection is to be closed. A panic
    /// (logged by the hook) closes this connection only.
    pub(super) fn on_ready(&mut self) -> bool {
        catch_unwind(AssertUnwindSafe(|| {
            if self.out.is_empty() {
                self.read_ready()
            } else {
                self.flush()
            }
        }))
        .unwrap_or(false)
    }

    /// The deadline passed: a client still sending its request is told why before it is
    /// dropped (if its socket takes it now).
    pub(super) fn expire(&mut self) {
        if self.out.is_empty() {
            let reason = format!(
                "timed out: no whole request within {} s",
                REQUEST_DEADLINE.as_secs()
            );
            log::info(&format!("control channel: a client was dropped: {reason}"));
            let _ = send_some(&self.stream, &frame::error_frame(0, &reason));
        } else {
            log::info("control channel: a client was dropped: it did not take its reply in time");
        }
    }

    /// Queues a reply; nothing more is read until it is sent.
    fn reply(&mut self, frames: Vec<Vec<u8>>, close_after: bool) {
        self.out = frames.concat();
        self.out_pos = 0;
        self.close_after = close_after;
        self.deadline = Instant::now() + REPLY_DEADLINE;
    }

    /// Sends what the socket takes of the reply; once all is sent, the next request's
    /// deadline starts (or the connection ends).
    fn flush(&mut self) -> bool {
        while self.out_pos < self.out.len() {
            match send_some(&self.stream, &self.out[self.out_pos..]) {
                Ok(0) => return true,
                Ok(n) => self.out_pos += n,
                Err(_) => return false,
            }
        }
        self.out = Vec::new();
        self.out_pos = 0;
        self.deadline = Instant::now() + REQUEST_DEADLINE;
        !self.close_after
    }

    /// Reads what has arrived, answering each frame completed; stops when the socket has no
    /// more or a reply is waiting to be sent.
    fn read_ready(&mut self) -> bool {
        let mut skip_buf = [0u8; 4096];
        loop {
            let read = match &mut self.payload {
                None => (&*self.stream).read(&mut self.header[self.header_got..]),
                Some((_, Payload::Keep { buf, got })) => (&*self.stream).read(&mut buf[*got..]),
                Some((_, Payload::Skip { left, .. })) => {
                    let want = (*left).min(skip_buf.len());
                    (&*self.stream).read(&mut skip_buf[..want])
                }
            };
            let n = match read {
                // The connection's end (or its reset) before a whole frame.
                Ok(0) => return false,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            };
            match &mut self.payload {
                None => {
                    self.header_got += n;
                    if self.header_got == HEADER_LEN {
                        self.header_complete();
                    }
                }
                Some((_, Payload::Skip { left, .. })) => *left -= n,
                Some((_, Payload::Keep { got, .. })) => *got += n,
            }
            if self.frame_complete() {
                self.answer();
            }
            if !self.out.is_empty() {
                // Nothing more is read until the reply is sent.
                return self.flush();
            }
        }
    }

    /// Checks the header just read: a fatal error is answered and ends the connection before
    /// anything is allocated for the payload.
    fn header_complete(&mut self) {
        let h = frame::Header::parse(&self.header);
        self.header_got = 0;
        match frame::check_request_header(&h) {
            HeaderCheck::Fatal(reason) => {
                self.reply(vec![frame::error_frame(h.seq, &reason)], true);
            }
            HeaderCheck::WrongType(reason) => {
                // The length is within the limit: skip the payload and go on.
                let left = h.payload_len as usize;
                self.payload = Some((h.seq, Payload::Skip { left, reason }));
            }
            // At most MAX_PAYLOAD bytes: the header check came first.
            HeaderCheck::Request => {
                let buf = vec![0; h.payload_len as usize];
                self.payload = Some((h.seq, Payload::Keep { buf, got: 0 }));
            }
        }
    }

    fn frame_complete(&self) -> bool {
        match &self.payload {
            None => false,
            Some((_, Payload::Skip { left, .. })) => *left == 0,
            Some((_, Payload::Keep { buf, got })) => *got == buf.len(),
        }
    }

    /// Answers the frame just read (running its command): queues the reply.
    fn answer(&mut self) {
        let Some((seq, payload)) = self.payload.take() else {
            return;
        };
        match payload {
            Payload::Skip { reason, .. } => {
                self.reply(vec![frame::error_frame(seq, &reason)], false)
            }
            Payload::Keep { buf, .. } => {
                let (frames, done) = answer_request(self.channel, seq, &buf);
                self.reply(frames, done);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer of the same user passes the credentials check.
    #[test]
    fn a_peer_of_the_same_user_is_accepted() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(check_peer(&a), Ok(()));
    }

    /// A whole request written at once is read, run and answered on the same connection, which
    /// stays open for the next; a header of another version ends it with a reason.
    #[test]
    fn frames_are_read_answered_and_checked() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let mut conn = Conn::accepted(&super::super::CHANNEL, server).expect("accepted");
        std::io::Write::write_all(
            &mut client,
            &frame::encode(frame::TYPE_REQUEST, 0, 9, br#"{"command":"help"}"#),
        )
        .unwrap();
        assert!(conn.on_ready(), "the connection stays open");
        let (h, payload) = frame::read(&mut client).unwrap();
        assert_eq!((h.kind, h.seq), (frame::TYPE_RESPONSE, 9));
        let value: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(value["output"], super::super::HELP);

        let mut bad = frame::encode(frame::TYPE_REQUEST, 0, 1, b"{}");
        bad[0] = 9;
        std::io::Write::write_all(&mut client, &bad).unwrap();
        assert!(!conn.on_ready(), "a wrong version ends the connection");
        let (h, payload) = frame::read(&mut client).unwrap();
        assert_eq!(h.kind, frame::TYPE_ERROR);
        assert!(String::from_utf8_lossy(&payload).contains("version 9"));
    }
}
