//! The control channel's sockets, held by identity (see held_fd).

use std::os::fd::OwnedFd;
use std::os::unix::io::AsRawFd;

use msmemscope_core::held_fd::{self, Identity};

/// A socket of ours, remembered by identity: a number the program closed and reused is
/// forgotten, never closed.
pub(super) struct Held<T: AsRawFd + Into<OwnedFd> + From<OwnedFd>> {
    pub(super) socket: std::mem::ManuallyDrop<T>,
    id: Identity,
}

impl<T: AsRawFd + Into<OwnedFd> + From<OwnedFd>> Held<T> {
    /// Moves the socket to a high number and remembers it (`None`: the program closed it
    /// meanwhile).
    pub(super) fn new(socket: T) -> Option<Held<T>> {
        let (fd, id) = held_fd::hold(socket.into())?;
        Some(Held {
            socket: std::mem::ManuallyDrop::new(T::from(fd)),
            id,
        })
    }

    pub(super) fn is_ours(&self) -> bool {
        self.id.holds(self.socket.as_raw_fd())
    }
}

impl<T: AsRawFd + Into<OwnedFd> + From<OwnedFd>> Drop for Held<T> {
    fn drop(&mut self) {
        if self.is_ours() {
            // SAFETY: dropped once, here; the number is ours (checked just now).
            unsafe { std::mem::ManuallyDrop::drop(&mut self.socket) };
        }
    }
}
