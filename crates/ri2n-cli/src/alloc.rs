//! The process's allocator: the system's, with large blocks (64 KiB and up) placed on page
//! boundaries.
//!
//! The kernel copies every byte ri2n moves between its buffers and files, pipes and sockets
//! (`read`, `write`, `recvmmsg`, `sendmsg`), and its copies into a buffer that starts a few
//! bytes past a page run far slower than into one on a page. glibc hands out large blocks 16
//! bytes past a page (its block header), the slow case, which held back the input reads of
//! `ri2n send` (docs/BENCHMARKS.md, "Misses", 2026-11-24 05:30–06:40).
//!
//! A large block is therefore taken from `malloc` one page larger than asked and handed out
//! from its first page boundary past the pointer `malloc` returned, which is kept in the
//! bytes just before. glibc's own aligned allocation (`posix_memalign`) asks its heap for the
//! size plus the alignment plus a header, so a block freed could never serve the next
//! request of the same size alone: every large buffer of the TCP transport, which come and go
//! with the data, took fresh memory, and a sender's heap grew far past its buffers before free
//! neighbours merged, each new page faulted in and zeroed by the kernel. A block of the same
//! size freed and allocated again is now the same memory.
//!
//! glibc maps a block above its mmap threshold from the kernel and unmaps it when freed, so
//! the next one is faulted in and zeroed page by page. It raises that threshold to the size
//! of each such block freed, which ends this for a program that keeps allocating blocks of
//! one size; before the first large block the thresholds are fixed where glibc's raising
//! would stop ([`keep_large_blocks`]), so that no block size is mapped afresh meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Once;

/// Blocks of at least this size are page-aligned.
const LARGE: usize = 64 * 1024;
const PAGE: usize = 4096;
/// Blocks up to this size come from the heap (glibc's largest dynamic mmap threshold).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Free memory at the top of a heap kept rather than given back (twice the mmap threshold,
/// as glibc's dynamic rule keeps it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 2 * MMAP_THRESHOLD;

static KEEP_LARGE_BLOCKS: Once = Once::new();

/// Fixes glibc's mmap and trim thresholds (see the module doc); once per process.
fn keep_large_blocks() {
    KEEP_LARGE_BLOCKS.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes the allocator's parameters; it takes glibc's own
        // locks, none of which an allocation in progress holds here
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    });
}

pub struct PageAlignedLarge;

/// Whether a block of `layout` is placed on a page boundary by this allocator (decided by the
/// size and alignment alone, so the same at every call about one block). Blocks asking for a
/// page or more of alignment get it from the system allocator itself.
fn page_aligned_here(layout: Layout) -> bool {
    layout.size() >= LARGE && layout.align() < PAGE
}

/// A block of `size` bytes on a page boundary, inside a `malloc` block one page larger whose
/// address is kept in the word before it; null if there is no memory.
unsafe fn alloc_large(size: usize) -> *mut u8 {
    keep_large_blocks();
    let Some(total) = size.checked_add(PAGE) else {
        return std::ptr::null_mut();
    };
    let base = libc::malloc(total).cast::<u8>();
    if base.is_null() {
        return base;
    }
    // malloc's blocks are 16-byte aligned: the first page boundary at least a word past
    // `base` is at most a page past it, so the block ends within the allocation
    let addr = base as usize;
    let block = base.add((addr + std::mem::size_of::<usize>()).next_multiple_of(PAGE) - addr);
    block.cast::<*mut u8>().sub(1).write(base);
    block
}

/// Frees a block of [`alloc_large`].
unsafe fn dealloc_large(block: *mut u8) {
    libc::free(block.cast::<*mut u8>().sub(1).read().cast());
}

// SAFETY: a block is page-aligned here or by the system allocator according to
// `page_aligned_here` of its layout, the same at allocation, reallocation and deallocation
// (`realloc` moves a block whose class changes itself); blocks of `alloc_large` are freed by
// `dealloc_large` only.
unsafe impl GlobalAlloc for PageAlignedLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if page_aligned_here(layout) {
            return alloc_large(layout.size());
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if page_aligned_here(layout) {
            let block = alloc_large(layout.size());
            if !block.is_null() {
                std::ptr::write_bytes(block, 0, layout.size());
            }
            return block;
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if page_aligned_here(layout) {
            return dealloc_large(ptr);
        }
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        if !page_aligned_here(layout) && !page_aligned_here(new_layout) {
            return System.realloc(ptr, layout, new_size);
        }
        // a large block, or one crossing LARGE: a new one, the bytes, the old one freed
        let new = self.alloc(new_layout);
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_start_on_a_page_and_keep_their_bytes_across_growth() {
        let mut v: Vec<u8> = Vec::with_capacity(1000);
        v.extend((0..1000u32).map(|i| i as u8));
        // grows across LARGE: moved into a page-aligned block, bytes kept
        v.reserve(LARGE * 2);
        assert_eq!(v.as_ptr() as usize % PAGE, 0);
        assert!(v.iter().enumerate().all(|(i, &b)| b == i as u8));
        let big = vec![7u8; 256 * 1024];
        assert_eq!(big.as_ptr() as usize % PAGE, 0);
        // shrinks below it again: bytes kept
        v.truncate(10);
        v.shrink_to_fit();
        assert_eq!(v, (0..10u8).collect::<Vec<_>>());
    }

    /// A large block freed and allocated again reuses the memory of the one before: the
    /// pages are not faulted in again each time.
    #[test]
    fn large_blocks_are_reused_not_mapped_afresh() {
        const BLOCK: usize = 1 << 20;
        const ROUNDS: usize = 50;
        let faults = || {
            let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
            // SAFETY: getrusage writes the struct it is given
            unsafe {
                libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr());
                usage.assume_init().ru_minflt
            }
        };
        let layout = Layout::from_size_align(BLOCK, 8).unwrap();
        let round = || {
            // SAFETY: a block of a non-zero size, every page of it written, then freed with
            // the layout it was allocated with
            unsafe {
                let p = PageAlignedLarge.alloc(layout);
                assert!(!p.is_null());
                for page in (0..BLOCK).step_by(PAGE) {
                    p.add(page).write_volatile(1);
                }
                PageAlignedLarge.dealloc(p, layout);
            }
        };
        round();
        let before = faults();
        for _ in 0..ROUNDS {
            round();
        }
        let per_round = (faults() - before) as usize / ROUNDS;
        // mapped afresh, each round faults in all its pages
        assert!(
            per_round < BLOCK / PAGE / 10,
            "{per_round} page faults per round of a {BLOCK}-byte block"
        );
    }
}
