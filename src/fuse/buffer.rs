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

    /// Resident KiB of the mapping that starts at `p` (its entry in /proc/self/smaps).
    fn resident_kib(p: *const u8) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", p as usize);
        let entry = smaps
            .split_inclusive('\n')
            .skip_while(|l| !l.starts_with(&start))
            .skip(1)
            .find(|l| l.starts_with("Rss:"))
            .unwrap_or_else(|| panic!("no mapping at {start}"));
        entry.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Reads as zeros, takes writes over its whole length and keeps them; a large buffer has
    /// only the pages written resident (the reason it is a mapping).
    #[test]
    fn a_buffer_is_zeroed_writable_and_costs_only_the_pages_written() {
        let mut b = RequestBuffer::new(8 << 20).unwrap();
        assert_eq!(b.len(), 8 << 20);
        assert_eq!(
            resident_kib(b.as_ptr()),
            0,
            "nothing resident before a write"
        );
        b[0] = 7;
        let n = b.len();
        b[n - 1] = 9;
        assert_eq!((b[0], b[1], b[n - 2], b[n - 1]), (7, 0, 0, 9));
        assert_eq!(
            resident_kib(b.as_ptr()),
            8,
            "two pages written, two resident"
        );
    }
}
