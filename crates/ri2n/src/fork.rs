//! Objects across `fork(2)`. A forked child has none of its parent's threads (an endpoint's
//! driver, a TCP link's reader and writer), and the locks they held stay held there: an
//! endpoint or connection made before the fork cannot work in the child, and closing it
//! there would speak for the parent on the sockets both share. The C and Python bindings
//! note the [`Generation`] each object is made in; in a child they refuse the object and
//! let it go without a word to the peer, a join or a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// Forks this process came out of as the child, counted by [`count_fork`].
static FORKS: AtomicU64 = AtomicU64::new(0);
static COUNTING: Once = Once::new();

extern "C" fn count_fork() {
    // an atomic add: async-signal-safe, as a handler in a forked child must be
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// The process an object was made in, told apart from the children forked after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(u64);

impl Generation {
    /// This process, now. The first call starts counting forks (`pthread_atfork`): an
    /// object made before it had no generation to be told apart by, and none exists.
    pub fn now() -> Self {
        COUNTING.call_once(|| {
            // SAFETY: registers a handler that only adds to an atomic
            unsafe { libc::pthread_atfork(None, None, Some(count_fork)) };
        });
        Self(FORKS.load(Ordering::SeqCst))
    }

    /// Whether this process is a child forked after the generation (or a child of one).
    pub fn inherited(self) -> bool {
        FORKS.load(Ordering::SeqCst) != self.0
    }
}

#[cfg(test)]
mod tests {
    use super::Generation;

    /// A child forked after a generation is told so; the parent is not.
    #[test]
    fn a_forked_child_is_told_apart_from_its_parent() {
        let made = Generation::now();
        assert!(!made.inherited());
        // SAFETY: the child only reads an atomic and exits at once
        match unsafe { libc::fork() } {
            0 => {
                let code = if made.inherited() && !Generation::now().inherited() {
                    0
                } else {
                    1
                };
                // SAFETY: ends the child without running the parent's destructors
                unsafe { libc::_exit(code) }
            }
            pid => {
                assert!(pid > 0, "fork failed");
                let mut status = 0;
                // SAFETY: waits for the child made above
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the child did not see the fork: {status:#x}"
                );
                assert!(!made.inherited(), "the parent took itself for a child");
            }
        }
    }
}
