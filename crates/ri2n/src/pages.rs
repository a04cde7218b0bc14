//! Zeroed, page-aligned memory mapped straight from the OS: the receive batches' buffers.
//!
//! The kernel copies every datagram received into these buffers, and its copies into a buffer
//! starting a few bytes past a page, where glibc puts large blocks, run far slower: a mapping
//! starts on a page whatever allocator the application uses. Its pages also read as zero
//! without being written, and cost a page fault only once something lands in them: a batch has
//! room for 32 GRO messages of up to 64 KB per socket, of which most calls fill a few, and
//! zero-filling all of it made a short transfer fault in pages it never used. Figures:
//! docs/BENCHMARKS.md, "Misses", 2026-11-24 05:30–06:40 and 08:15–10:02.

use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zero-initialised buffer of whole pages, unmapped when dropped.
#[derive(Debug)]
pub(crate) struct PageBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its mapping exclusively (like a `Box<[u8]>`); shared access only
// reads through `&[u8]`.
unsafe impl Send for PageBuffer {}
unsafe impl Sync for PageBuffer {}

impl PageBuffer {
    /// Maps at least `len` bytes (rounded up to whole pages; at least one page).
    pub fn new(len: usize) -> io::Result<Self> {
        let page = page_size();
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

impl Deref for PageBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `ptr` are mapped readable and writable for the buffer's
        // life, start zeroed (anonymous mapping), and are only reached through `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for PageBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, which nothing refers to any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_zeroed_pages_on_a_page_boundary_that_keep_what_is_written() {
        let mut b = PageBuffer::new(100_000).unwrap();
        let page = page_size();
        assert_eq!(b.len() % page, 0);
        assert!(b.len() >= 100_000);
        assert_eq!(b.as_ptr() as usize % page, 0);
        assert!(b.iter().all(|&x| x == 0));
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8;
        }
        assert!(b.iter().enumerate().all(|(i, &x)| x == i as u8));
        assert_eq!(PageBuffer::new(0).unwrap().len(), page);
    }
}
