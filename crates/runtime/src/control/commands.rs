//! The words a client may send (`help` lists them) and the replies they get: each runs to its
//! end on the service thread, one at a time, under the channel's `busy` lock.

use std::panic::catch_unwind;
use std::time::Instant;

use super::{frame, Channel};
use crate::host_leak::window;
use crate::pipeline;
use crate::session::{self, StartError, Started, Stopped};

pub const HELP: &str = "\
start                      open a host-leak window (host-leak runs) or start the event trace
stop                       close the host-leak window and write its report, or stop the trace
step                       start the next step (as the Python API's step())
display config             the active configuration (JSON)
display memory summary     VmRSS/VmHWM/VmSize, live blocks of the open window, tracing state
display host_leak summary  interim snapshot of the open host-leak window (it stays open)
help                       this list
exit                       end the session";

/// The reply frames to one request, and whether the connection ends after them (`exit`).
pub(super) fn answer_request(channel: &Channel, seq: u16, payload: &[u8]) -> (Vec<Vec<u8>>, bool) {
    match frame::parse_request(payload) {
        Err(reason) => (vec![frame::error_frame(seq, &reason)], false),
        Ok(command) => {
            let done = command == "exit";
            let frames = match catch_unwind(|| run_command(channel, &command)) {
                Ok(Ok((status, output))) => frame::response_frames(seq, status, &output),
                Ok(Err(reason)) => vec![frame::error_frame(seq, &reason)],
                Err(_) => vec![frame::error_frame(
                    seq,
                    "internal error while running the command (see the runtime log)",
                )],
            };
            (frames, done)
        }
    }
}

/// Runs one command word: `Ok((status, output))`, or `Err` for a word that does not exist.
fn run_command(channel: &Channel, command: &str) -> Result<(i32, String), String> {
    if channel.closing() {
        return Err("the process is exiting".to_string());
    }
    let _busy = channel.busy.lock().unwrap_or_else(|e| e.into_inner());
    if channel.closing() {
        return Err("the process is exiting".to_string());
    }
    Ok(match command {
        "help" => (0, HELP.to_string()),
        "exit" => (0, "bye".to_string()),
        "start" => start_recording(),
        "stop" => stop_recording(),
        "step" => {
            session::step();
            (0, "next step started".to_string())
        }
        "display config" => (0, session::config().to_json()),
        "display memory summary" => (0, memory_summary()),
        "display host_leak summary" => match window::snapshot() {
            Some(text) => (0, text),
            None => (1, "no active window".to_string()),
        },
        other => {
            return Err(format!(
                "unknown command \"{other}\"; `help` lists the words"
            ))
        }
    })
}

/// `start`: what the Python API's `start()` does; in a launched host-leak run, a new window
/// with the run's settings.
fn start_recording() -> (i32, String) {
    // The run's end (its report, the dump's last rows) happens at exit.
    crate::lifecycle::ensure_exit_handler();
    match session::start() {
        Ok(Started::Window(stage)) => (0, format!("host-leak window {stage} opened")),
        Ok(Started::Trace) => (0, "event trace started".to_string()),
        Err(StartError::WindowOpen(stage)) => {
            (1, format!("host-leak window {stage} is already open"))
        }
        Err(StartError::NoHostHooks) => (
            1,
            "host-leak analysis needs the runtime library preloaded (source msmemscope --load-api-env=host)"
                .to_string(),
        ),
        Err(StartError::NoRunDir(e)) => (1, format!("start failed: {e}")),
        Err(StartError::ForkedChild) => (1, "a forked child records nothing".to_string()),
    }
}

/// `stop`: closes the open window (its report is written) or stops the event trace.
fn stop_recording() -> (i32, String) {
    match session::stop() {
        Ok(Stopped::Window(stage, Some(path))) => (
            0,
            format!("host-leak window {stage} closed: {}", path.display()),
        ),
        Ok(Stopped::Window(stage, None)) => (
            1,
            format!("host-leak window {stage}: no report written (see the runtime log)"),
        ),
        Ok(Stopped::Trace) => (0, "event trace stopped".to_string()),
        Ok(Stopped::Nothing) => (
            1,
            "nothing to stop: no active window and no event trace".to_string(),
        ),
        Err(e) => (1, format!("cannot close the host-leak window: {e}")),
    }
}

fn memory_summary() -> String {
    let mut out = String::new();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for key in ["VmRSS:", "VmHWM:", "VmSize:"] {
        if let Some(line) = status.lines().find(|l| l.starts_with(key)) {
            let value = line[key.len()..].trim();
            out.push_str(&format!("{key:<8}{value}\n"));
        }
    }
    if let Some(ledger) = window::active() {
        let (live, unread) = ledger.live_now(Instant::now() + window::SNAPSHOT_DEADLINE);
        out.push_str(&format!(
            "host-leak window {}: {} live blocks, {} bytes tracked{}\n",
            ledger.stage,
            live.count,
            live.bytes,
            if unread > 0 {
                format!(" ({unread} ledger shard(s) busy, not counted)")
            } else {
                String::new()
            }
        ));
    } else {
        out.push_str("host-leak window: none open\n");
    }
    out.push_str(if pipeline::is_tracing() {
        "tracing: on"
    } else {
        "tracing: off"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one frame of a reply: its header and JSON payload.
    fn decode(frames: &[Vec<u8>]) -> Vec<(frame::Header, serde_json::Value)> {
        frames
            .iter()
            .map(|f| {
                let (h, payload) = frame::read(&mut &f[..]).unwrap();
                (h, serde_json::from_slice(&payload).unwrap())
            })
            .collect()
    }

    #[test]
    fn help_is_answered_with_the_words_and_status_zero() {
        let (frames, done) = answer_request(&Channel::new(), 7, br#"{"command":"help"}"#);
        assert!(!done);
        let replies = decode(&frames);
        assert_eq!(replies.len(), 1);
        let (h, value) = &replies[0];
        assert_eq!((h.kind, h.seq, h.flags), (frame::TYPE_RESPONSE, 7, 0));
        assert_eq!(value["status"], 0);
        assert_eq!(value["output"], HELP);
    }

    #[test]
    fn exit_ends_the_connection_after_its_reply() {
        let (frames, done) = answer_request(&Channel::new(), 2, br#"{"command":"exit"}"#);
        assert!(done);
        let replies = decode(&frames);
        assert_eq!(replies[0].1["output"], "bye");
    }

    #[test]
    fn unknown_words_and_bad_payloads_get_error_frames() {
        let (frames, done) = answer_request(&Channel::new(), 3, br#"{"command":"launch rockets"}"#);
        assert!(!done);
        let replies = decode(&frames);
        assert_eq!(replies[0].0.kind, frame::TYPE_ERROR);
        assert_eq!(replies[0].0.seq, 3);
        assert_eq!(
            replies[0].1["error"],
            "unknown command \"launch rockets\"; `help` lists the words"
        );
        let (frames, _) = answer_request(&Channel::new(), 4, b"not json");
        let replies = decode(&frames);
        assert_eq!(replies[0].0.kind, frame::TYPE_ERROR);
        assert_eq!(replies[0].0.seq, 4);
    }

    #[test]
    fn nothing_to_stop_says_so() {
        assert_eq!(
            run_command(&Channel::new(), "stop").unwrap(),
            (
                1,
                "nothing to stop: no active window and no event trace".to_string()
            )
        );
    }

    /// Once the exit handler has begun closing the channel, a command that arrives is refused
    /// instead of running under the exiting process.
    #[test]
    fn a_closing_channel_runs_no_command() {
        let channel = Channel::new();
        channel
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(
            run_command(&channel, "help"),
            Err("the process is exiting".to_string())
        );
        assert_eq!(run_command(&Channel::new(), "help").map(|r| r.0), Ok(0));
    }
}
