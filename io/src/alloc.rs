//! The process's global allocator: mimalloc, asked for an alignment only when a type needs one.
//! The binary installs it (`#[global_allocator]` in `src/main.rs`), and the request-path bench
//! counts its calls while forwarding to it, so that the bench measures what ships.
//!
//! One of the few places of the shipped code with `unsafe` (docs/ARCHITECTURE.md lists them):
//! a `GlobalAlloc` cannot be written without it.

#![allow(unsafe_code)]

/// mimalloc, asked for an alignment only when a type needs more than every block has.
///
/// `mimalloc::MiMalloc` passes every request through mimalloc's aligned entry points, whose
/// fast path only serves blocks of up to 1 KiB from a page that has a free one; anything else
/// (every request's boxed state, read buffers, envelopes) takes the aligned allocator's
/// generic path and over-allocates. Every mimalloc block is aligned to the word, so a layout
/// that needs no more goes to the plain entry points.
pub struct Allocator;

/// The alignment every block of `mi_malloc` has.
const WORD: usize = std::mem::size_of::<usize>();

/// Whether the plain entry points serve `align` for a block of `size` bytes.
fn is_word_aligned(size: usize, align: usize) -> bool {
    align <= WORD && align <= size
}

// SAFETY: every method forwards to mimalloc, which returns blocks aligned to the word (served
// here only for layouts that need no more) or, through `MiMalloc`, to the layout's alignment;
// blocks from either entry point are freed and resized by `mi_free` and `mi_realloc*`, which
// take any mimalloc block.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if is_word_aligned(layout.size(), layout.align()) {
            // SAFETY: `mi_malloc` has no preconditions.
            unsafe { libmimalloc_sys::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if is_word_aligned(layout.size(), layout.align()) {
            // SAFETY: `mi_zalloc` has no preconditions.
            unsafe { libmimalloc_sys::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: the caller passes a block this allocator returned, a mimalloc block.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if is_word_aligned(new_size, layout.align()) {
            // SAFETY: the caller passes a block this allocator returned, a mimalloc block.
            unsafe { libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast() }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}
