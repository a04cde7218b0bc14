//! The process's allocator: the system's, with large blocks (64 KiB and up) placed on page
//! boundaries.
//!
//! The kernel copies every byte ri2n moves between its buffers and files, pipes and sockets
//! (`read`, `write`, `recvmmsg`, `sendmsg`), and its copies into a buffer that starts a few
//! bytes past a page run far slower than into one on a page. glibc hands out large blocks 16
//! bytes past a page (its block header), the slow case, which held back the input reads of
//! `ri2n send` (docs/BENCHMARKS.md, "Misses", 2026-11-24 05:30–06:40).

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this size are page-aligned.
const LARGE: usize = 64 * 1024;
const PAGE: usize = 4096;

pub struct PageAlignedLarge;

/// The layout the system allocator is asked for: the same for every call about one block,
/// since it depends on the size and alignment alone.
fn system_layout(layout: Layout) -> Layout {
    if layout.size() >= LARGE && layout.align() < PAGE {
        // fails only for sizes within a page of isize::MAX: such a block keeps its own
        // layout, the same at every call about it
        Layout::from_size_align(layout.size(), PAGE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every call forwards to the system allocator with `system_layout` of the caller's
// layout, which for one block is the same at allocation, reallocation and deallocation (it
// depends on the size and alignment alone, and `realloc` moves a block whose layout changes
// class itself).
unsafe impl GlobalAlloc for PageAlignedLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        System.alloc(system_layout(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        System.alloc_zeroed(system_layout(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, system_layout(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let (old_sys, new_sys) = (system_layout(layout), system_layout(new_layout));
        if old_sys.align() == new_sys.align() {
            return System.realloc(ptr, old_sys, new_size);
        }
        // the block changes class (crosses LARGE): a new one, the bytes, the old one freed
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
}
