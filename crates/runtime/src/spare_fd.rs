//! Descriptors kept in reserve for the end of the run. A program that has used up its
//! descriptors (EMFILE) when it exits would leave the runtime unable to write its report; the
//! spares (one memfd of our own and its duplicates, at high numbers, checked by identity: no
//! program holds that file) are closed right before the report is written, which gives the runtime the slots it needs at once (a directory and its file
//! open together, the files of the modules it symbolizes).

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use msmemscope_core::held_fd::{hold, Identity};

const SPARES: usize = 8;

static SPARE: [AtomicI32; SPARES] = [const { AtomicI32::new(-1) }; SPARES];
/// The memfd's identity (every spare is a descriptor of it).
static SPARE_DEV: AtomicU64 = AtomicU64::new(0);
static SPARE_INO: AtomicU64 = AtomicU64::new(0);

/// Takes the spares (the runtime's constructor).
pub fn take() {
    // SAFETY: a NUL-terminated name; the descriptor is owned below.
    let first = unsafe { libc::memfd_create(c"msmemscope-spare".as_ptr(), libc::MFD_CLOEXEC) };
    if first < 0 {
        return;
    }
    for (i, slot) in SPARE.iter().enumerate() {
        let raw = if i == 0 {
            first
        } else {
            // SAFETY: duplicates the memfd, which is ours (held in slot 0).
            unsafe { libc::fcntl(SPARE[0].load(Ordering::Acquire), libc::F_DUPFD_CLOEXEC, 3) }
        };
        if raw < 0 {
            return;
        }
        // SAFETY: just opened, owned by nobody else.
        let Some((fd, id)) = hold(unsafe { OwnedFd::from_raw_fd(raw) }) else {
            return;
        };
        let (dev, ino) = id.parts();
        SPARE_DEV.store(dev, Ordering::Relaxed);
        SPARE_INO.store(ino, Ordering::Relaxed);
        slot.store(fd.into_raw_fd(), Ordering::Release);
    }
}

/// Gives the spares' slots back (once; each only if its number still holds our memfd).
pub fn release() {
    let id = Identity::from_parts(
        SPARE_DEV.load(Ordering::Relaxed),
        SPARE_INO.load(Ordering::Relaxed),
    );
    for slot in &SPARE {
        let fd = slot.swap(-1, Ordering::AcqRel);
        if fd >= 0 && id.holds(fd) {
            // SAFETY: our own descriptor (checked just now), closed once.
            unsafe { libc::close(fd) };
        }
    }
}
