//! The binaries' global allocator: mimalloc, asked for alignment only when
//! a layout needs more than every block already has.
//!
//! The `mimalloc` crate passes every layout to `mi_malloc_aligned`. In
//! mimalloc 3, that call takes its fast path only for blocks of up to 1 KB
//! whose free list happens to start aligned; any larger block whose size
//! class is not a power of two (a result's 4.9 KB document, a page's 42 KB
//! answer, hyper's buffers) goes through `mi_malloc_is_naturally_aligned`
//! and the over-allocating fallback, even for an alignment of 1. Every
//! mimalloc block is aligned to a machine word, so, as the standard
//! library's `System` does with `malloc`, a layout whose alignment is at most
//! a word's (nearly all of them: bytes, strings, vectors of pointers) is
//! served by the plain calls. The same change is proposed to the crate
//! (purpleprotocol/mimalloc_rust#170); once it is there, this module goes.
//! Callgrind: 3–4 % fewer instructions per request, the baseline's as much
//! as any scenario's (BENCHMARKS.md).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// Alignment every mimalloc block has whatever its size: blocks are
/// multiples of a word and start at least 16-byte aligned in their page
/// (`MI_PAGE_MIN_START_BLOCK_ALIGN`).
const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc, with `mi_malloc`, `mi_zalloc` and `mi_realloc` for layouts
/// aligned to at most a word and the aligned calls for the rest.
pub struct MiMalloc;

// SAFETY: every pointer returned comes from mimalloc with at least the
// layout's size and alignment (plain calls only when the alignment is at
// most the word alignment every block has), and `mi_free` and the realloc
// calls accept any pointer mimalloc returned, aligned or not.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation calls have no preconditions.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_malloc(layout.size()) as *mut u8
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_zalloc(layout.size()) as *mut u8
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` was returned by this allocator (the caller's
        // contract), so by mimalloc.
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was returned by this allocator for `layout` (the
        // caller's contract); the block keeps the layout's alignment.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MiMalloc;
    use std::alloc::{GlobalAlloc, Layout};

    /// Sizes around mimalloc's size classes and its small, medium and large
    /// limits, with every alignment from a byte to a page.
    #[test]
    fn every_layout_is_served_aligned_and_keeps_its_bytes() {
        let sizes =
            [1, 7, 8, 9, 15, 16, 17, 24, 40, 100, 1000, 1024, 1025, 4889, 42_526, 70_000, 1 << 20, (1 << 22) + 3];
        let aligns = [1, 2, 4, 8, 16, 32, 64, 4096];
        let a = MiMalloc;
        for &size in &sizes {
            for &align in &aligns {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each pointer is freed once with its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "alloc({size}, {align}) not aligned");
                    std::ptr::write_bytes(p, 0xA5, size);

                    let grown = size * 3 + 5;
                    let q = a.realloc(p, layout, grown);
                    assert_eq!(q as usize % align, 0, "realloc({size} -> {grown}, {align}) not aligned");
                    assert!((0..size).all(|i| *q.add(i) == 0xA5), "realloc({size}, {align}) lost bytes");
                    let shrunk = size.div_ceil(2);
                    let r = a.realloc(q, Layout::from_size_align(grown, align).unwrap(), shrunk);
                    assert_eq!(r as usize % align, 0);
                    assert!((0..shrunk).all(|i| *r.add(i) == 0xA5));
                    a.dealloc(r, Layout::from_size_align(shrunk, align).unwrap());

                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "alloc_zeroed({size}, {align}) not aligned");
                    assert!((0..size).all(|i| *z.add(i) == 0), "alloc_zeroed({size}, {align}) not zeroed");
                    a.dealloc(z, layout);
                }
            }
        }
    }
}

/// For the unit tests: the system allocator, counting the bytes each
/// thread has live, so that a test can tell how much memory a piece of work
/// held at once ([`counting::peak_of`]), deterministically (no machine's
/// noise moves it).
#[cfg(test)]
pub(crate) mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        // Const-initialized, no destructor: usable from inside the
        // allocator without allocating.
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    pub struct Counting;

    // SAFETY: every call is passed to `System` as it came; the counting
    // around it touches only this thread's cells.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
            let ptr = unsafe { System.alloc(layout) };
            if !ptr.is_null() {
                let size = layout.size() as isize;
                let _ = LIVE.try_with(|live| {
                    live.set(live.get() + size);
                    let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
                });
            }
            ptr
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `alloc` above (`System`) with `layout`.
            unsafe { System.dealloc(ptr, layout) };
            let _ = LIVE.try_with(|live| live.set(live.get() - layout.size() as isize));
        }
    }

    /// `f`'s value, and the most bytes it had allocated at once on this
    /// thread beyond what was live when it began.
    pub(crate) fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let start = LIVE.with(Cell::get);
        PEAK.with(|peak| peak.set(start));
        let value = f();
        let peak = PEAK.with(Cell::get);
        (value, usize::try_from(peak - start).unwrap_or(0))
    }
}
