//! Request buffers: private anonymous mappings, so a buffer as large as the largest request
//! (the kernel insists on one per reader) costs only the pages requests actually touch.
//!
//! Why not a `Vec`: `vec![0; n]` is calloc, and glibc's calloc clears the memory it hands out
//! unless it comes straight from mmap, which its sliding mmap threshold stops after large
//! frees; every worker then paid megabytes of RSS for mostly small requests. A mapping's
//! untouched pages are the kernel's shared zero page until written.

use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, ProtFlags};

/// A zeroed, writable buffer of `len` bytes backed by its own anonymous mapping.
pub struct RequestBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its mapping exclusively (like a Box<[u8]>); nothing else refers to it.
unsafe impl Send for RequestBuffer {}

impl RequestBuffer {
    /// A buffer of `len` bytes (at least one page is mapped); None if the kernel refuses.
    pub fn new(len: usize) -> std::io::Result<Self> {
        let size = NonZeroUsize::new(len.max(1)).expect("at least one byte");
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks aliases no
        // existing memory.
        let p = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        Ok(Self { ptr: p.cast(), len })
    }
}

impl std::ops::Deref for RequestBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live readable mapping owned by self (unmapped only in
        // drop); anonymous memory is initialised (zero) from the start.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for RequestBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference into it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RequestBuffer {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`; no slice into it outlives `self`.
        let r = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len.max(1)) };
        if let Err(e) = r {
            tracing::error!(error = %e, len = self.len, "munmap of a request buffer failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `buf` present in memory, from /proc/self/pagemap (bit 63 of each page's
    /// entry). Per page, so a neighbouring mapping the kernel merged ours with does not count.
    fn resident_pages(buf: &[u8]) -> usize {
        use std::os::unix::fs::FileExt;
        let first = buf.as_ptr() as u64 / 4096;
        let pages = buf.len().div_ceil(4096);
        let mut entries = vec![0u8; pages * 8];
        let map = std::fs::File::open("/proc/self/pagemap").unwrap();
        map.read_exact_at(&mut entries, first * 8).unwrap();
        entries
            .chunks_exact(8)
            .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1)
            .count()
    }

    /// Reads as zeros, takes writes over its whole length and keeps them; a large buffer has
    /// only the pages written resident (the reason it is a mapping).
    #[test]
    fn a_buffer_is_zeroed_writable_and_costs_only_the_pages_written() {
        let mut b = RequestBuffer::new(8 << 20).unwrap();
        assert_eq!(b.len(), 8 << 20);
        assert_eq!(resident_pages(&b), 0, "nothing resident before a write");
        b[0] = 7;
        let n = b.len();
        b[n - 1] = 9;
        assert_eq!((b[0], b[1], b[n - 2], b[n - 1]), (7, 0, 0, 9));
        assert_eq!(resident_pages(&b), 2, "two pages written, two resident");
    }
}
