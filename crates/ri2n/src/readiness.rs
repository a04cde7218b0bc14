//! Readiness file descriptors: an `eventfd` per connection (and one for `accept`) that becomes
//! readable when the connection may have progressed, so an application's own event loop
//! (`poll`, `epoll`, mio, tokio) can wait for ri2n next to its other descriptors.
//!
//! The contract is edge-like and race-free: every non-blocking call (`try_read`, `try_write`,
//! `try_accept`, …) first clears the descriptor, then looks, both under the engine's lock;
//! the driver signals it, under the same lock, whenever the engine reports anything for the
//! connection. So after a call returned `WouldBlock`, the descriptor becomes readable as soon
//! as retrying may succeed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// One readiness descriptor.
#[derive(Debug)]
pub(crate) struct Readiness {
    fd: OwnedFd,
    /// The descriptor was signalled and not cleared since: spares a system call per event.
    signalled: AtomicBool,
}

impl Readiness {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd(2) returns a new descriptor that we own, or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `raw` is a valid descriptor owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            signalled: AtomicBool::new(false),
        })
    }

    /// Makes the descriptor readable.
    pub fn signal(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            let one = 1u64;
            // SAFETY: an 8-byte write from a live u64 to our eventfd; it only fails when the
            // counter would overflow, which leaves it readable anyway.
            unsafe {
                libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
    }

    /// Makes the descriptor not readable (until the next signal).
    pub fn clear(&self) {
        if self.signalled.swap(false, Ordering::AcqRel) {
            let mut count = 0u64;
            // SAFETY: an 8-byte read into a live u64 from our non-blocking eventfd.
            unsafe {
                libc::read(self.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8);
            }
        }
    }
}

impl AsFd for Readiness {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
