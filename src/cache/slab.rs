//! A slab allocator whose memory truly goes back to the kernel.
//!
//! A cache built on `malloc` never shrinks the process: `free` keeps the pages in the
//! allocator. Here memory comes from `mmap(MAP_PRIVATE | MAP_ANONYMOUS)` slabs of 2 MiB, cut
//! into power-of-two size classes (64 B .. 1 MiB). When a slot of a page-multiple class is
//! freed, its pages are dropped at once with `MADV_DONTNEED` (RSS follows live bytes); when a
//! slab has no live slot left it is unmapped. Larger requests get a mapping of their own.
//! Each size class has its own lock, so there is no global lock on the allocation path.

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags};

/// Size of one slab mapping.
pub const SLAB_SIZE: usize = 2 << 20;
const PAGE: usize = 4096;
const MIN_CLASS_SHIFT: u32 = 6; // 64 B
const MAX_CLASS_SHIFT: u32 = 20; // 1 MiB
const CLASSES: usize = (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1) as usize;

/// Counters of an allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlabStats {
    /// Bytes of address space mapped (slabs and large mappings).
    pub mapped_bytes: u64,
    /// Bytes in live allocations (slot sizes).
    pub live_bytes: u64,
    /// Bytes given back to the kernel with MADV_DONTNEED or munmap since creation.
    pub released_bytes: u64,
}

struct Slab {
    base: NonNull<u8>,
    free: Vec<u32>,
    live: u32,
}

#[derive(Default)]
struct Class {
    /// Slab slots by id; `None` once unmapped (ids are reused).
    slabs: Vec<Option<Slab>>,
    /// Ids of slabs with at least one free slot.
    partial: Vec<usize>,
}

struct Shared {
    classes: Vec<Mutex<Class>>,
    mapped: AtomicU64,
    live: AtomicU64,
    released: AtomicU64,
}

// SAFETY: the raw slab pointers are only dereferenced by the owners of their slots
// (`SlabBox`), and the bookkeeping that holds them is behind the class mutexes.
unsafe impl Send for Shared {}
// SAFETY: as above; all shared mutation goes through mutexes and atomics.
unsafe impl Sync for Shared {}

/// The allocator. Cheap to clone (shared state).
#[derive(Clone)]
pub struct SlabAllocator {
    shared: Arc<Shared>,
}

/// Where an allocation lives, so that its drop can free it.
enum Origin {
    Slot {
        class: usize,
        slab: usize,
        slot: u32,
    },
    Large {
        mapped: usize,
    },
}

/// One allocation: owns `len` bytes (zeroed when handed out), freed when dropped.
pub struct SlabBox {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
    shared: Arc<Shared>,
}

// SAFETY: a SlabBox exclusively owns its bytes; moving it to another thread moves that
// ownership, and `&SlabBox` only gives shared read access.
unsafe impl Send for SlabBox {}
// SAFETY: see above.
unsafe impl Sync for SlabBox {}

fn class_of(size: usize) -> Option<usize> {
    let shift = size
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_CLASS_SHIFT);
    (shift <= MAX_CLASS_SHIFT).then(|| (shift - MIN_CLASS_SHIFT) as usize)
}

fn class_size(class: usize) -> usize {
    1 << (class as u32 + MIN_CLASS_SHIFT)
}

fn map(len: usize) -> Option<NonNull<u8>> {
    let len = NonZeroUsize::new(len)?;
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks aliases no
    // existing memory.
    let p = unsafe {
        nix::sys::mman::mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    };
    p.ok().map(NonNull::cast)
}

fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: `ptr..ptr+len` is a whole mapping made by `map` whose every slot has been freed,
    // so nothing references it any more.
    if let Err(e) = unsafe { nix::sys::mman::munmap(ptr.cast::<c_void>(), len) } {
        tracing::error!(error = %e, len, "munmap of a slab failed");
    }
}

fn dont_need(ptr: NonNull<u8>, len: usize) {
    // SAFETY: `ptr..ptr+len` is a page-aligned free slot inside a live mapping; no SlabBox
    // refers to it, and MADV_DONTNEED on private anonymous memory only makes it read as zeros.
    if let Err(e) =
        unsafe { nix::sys::mman::madvise(ptr.cast::<c_void>(), len, MmapAdvise::MADV_DONTNEED) }
    {
        tracing::error!(error = %e, len, "madvise(DONTNEED) failed");
    }
}

impl Default for SlabAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl SlabAllocator {
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                classes: (0..CLASSES).map(|_| Mutex::new(Class::default())).collect(),
                mapped: AtomicU64::new(0),
                live: AtomicU64::new(0),
                released: AtomicU64::new(0),
            }),
        }
    }

    pub fn stats(&self) -> SlabStats {
        SlabStats {
            mapped_bytes: self.shared.mapped.load(Ordering::Relaxed),
            live_bytes: self.shared.live.load(Ordering::Relaxed),
            released_bytes: self.shared.released.load(Ordering::Relaxed),
        }
    }

    /// Allocates `len` zeroed bytes; `None` when the kernel refuses more memory.
    pub fn alloc(&self, len: usize) -> Option<SlabBox> {
        let Some(class) = class_of(len) else {
            let mapped = len.div_ceil(PAGE) * PAGE;
            let ptr = map(mapped)?;
            self.shared
                .mapped
                .fetch_add(mapped as u64, Ordering::Relaxed);
            self.shared.live.fetch_add(mapped as u64, Ordering::Relaxed);
            return Some(SlabBox {
                ptr,
                len,
                origin: Origin::Large { mapped },
                shared: self.shared.clone(),
            });
        };
        let size = class_size(class);
        let mut c = self.shared.classes[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let id = match c.partial.last() {
            Some(&id) => id,
            None => {
                let base = map(SLAB_SIZE)?;
                self.shared
                    .mapped
                    .fetch_add(SLAB_SIZE as u64, Ordering::Relaxed);
                let slots = (SLAB_SIZE / size) as u32;
                let slab = Slab {
                    base,
                    free: (0..slots).rev().collect(),
                    live: 0,
                };
                let id = match c.slabs.iter().position(Option::is_none) {
                    Some(free_id) => {
                        c.slabs[free_id] = Some(slab);
                        free_id
                    }
                    None => {
                        c.slabs.push(Some(slab));
                        c.slabs.len() - 1
                    }
                };
                c.partial.push(id);
                id
            }
        };
        let slab = c.slabs[id].as_mut().expect("partial slabs are mapped");
        let slot = slab.free.pop().expect("partial slabs have a free slot");
        slab.live += 1;
        // SAFETY: `slot < SLAB_SIZE / size`, so the offset stays inside the slab mapping.
        let ptr = unsafe { slab.base.add(slot as usize * size) };
        if slab.free.is_empty() {
            c.partial.retain(|&p| p != id);
        }
        drop(c);
        self.shared.live.fetch_add(size as u64, Ordering::Relaxed);
        // Sub-page slots may hold an earlier allocation's bytes (page slots were DONTNEED'd and
        // read as zeros, fresh mappings are zero): clear what the caller will see.
        if size < PAGE {
            // SAFETY: the slot is `size >= len` bytes, exclusively ours from here on.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        }
        Some(SlabBox {
            ptr,
            len,
            origin: Origin::Slot {
                class,
                slab: id,
                slot,
            },
            shared: self.shared.clone(),
        })
    }
}

impl SlabBox {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes this allocation holds from the allocator (its slot or mapping size).
    pub fn footprint(&self) -> usize {
        match self.origin {
            Origin::Slot { class, .. } => class_size(class),
            Origin::Large { mapped } => mapped,
        }
    }
}

impl std::ops::Deref for SlabBox {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to at least `len` bytes owned by this box for its lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for SlabBox {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SlabBox {
    fn drop(&mut self) {
        let shared = &self.shared;
        match self.origin {
            Origin::Large { mapped } => {
                unmap(self.ptr, mapped);
                shared.mapped.fetch_sub(mapped as u64, Ordering::Relaxed);
                shared.live.fetch_sub(mapped as u64, Ordering::Relaxed);
                shared.released.fetch_add(mapped as u64, Ordering::Relaxed);
            }
            Origin::Slot { class, slab, slot } => {
                let size = class_size(class);
                // Give the pages back while the slot is still exclusively ours: once it is on
                // the free list another thread may hand it out and write to it.
                if size >= PAGE {
                    dont_need(self.ptr, size);
                    shared.released.fetch_add(size as u64, Ordering::Relaxed);
                }
                shared.live.fetch_sub(size as u64, Ordering::Relaxed);
                let mut c = shared.classes[class]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let s = c.slabs[slab]
                    .as_mut()
                    .expect("a live slot's slab is mapped");
                s.live -= 1;
                if s.live == 0 {
                    let base = s.base;
                    c.slabs[slab] = None;
                    c.partial.retain(|&p| p != slab);
                    drop(c);
                    unmap(base, SLAB_SIZE);
                    shared.mapped.fetch_sub(SLAB_SIZE as u64, Ordering::Relaxed);
                    if size < PAGE {
                        // Small-slot slabs go back whole, only now.
                        shared
                            .released
                            .fetch_add(SLAB_SIZE as u64, Ordering::Relaxed);
                    }
                    return;
                }
                let was_full = s.free.is_empty();
                s.free.push(slot);
                if was_full {
                    c.partial.push(slab);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_size(class_of(64).unwrap()), 64);
        assert_eq!(class_size(class_of(65).unwrap()), 128);
        assert_eq!(class_size(class_of(4096).unwrap()), 4096);
        assert_eq!(class_size(class_of(1 << 20).unwrap()), 1 << 20);
        assert_eq!(class_of((1 << 20) + 1), None);
    }

    #[test]
    fn slots_are_distinct_zeroed_and_aligned() {
        let a = SlabAllocator::new();
        for len in [1usize, 100, 4096, 5000, 65536, 3 << 20] {
            let mut boxes: Vec<SlabBox> = (0..20).map(|_| a.alloc(len).unwrap()).collect();
            for (i, b) in boxes.iter_mut().enumerate() {
                assert_eq!(b.len(), len);
                assert!(b.iter().all(|&x| x == 0), "not zeroed");
                assert_eq!(b.as_ptr() as usize % b.footprint().min(PAGE), 0);
                b.fill(i as u8);
            }
            for (i, b) in boxes.iter().enumerate() {
                assert!(b.iter().all(|&x| x == i as u8), "slots overlap");
            }
        }
        assert_eq!(a.stats().live_bytes, 0);
        assert_eq!(a.stats().mapped_bytes, 0, "empty slabs must be unmapped");
    }

    #[test]
    fn reused_small_slots_are_zeroed() {
        let a = SlabAllocator::new();
        let keep = a.alloc(100).unwrap(); // keeps the slab mapped
        let mut b = a.alloc(100).unwrap();
        b.fill(0xff);
        drop(b);
        let c = a.alloc(100).unwrap();
        assert!(c.iter().all(|&x| x == 0));
        drop((keep, c));
    }

    #[test]
    fn page_slots_are_released_at_once() {
        let a = SlabAllocator::new();
        let keep = a.alloc(65536).unwrap();
        let boxes: Vec<_> = (0..10).map(|_| a.alloc(65536).unwrap()).collect();
        let before = a.stats();
        drop(boxes);
        let after = a.stats();
        assert_eq!(after.released_bytes - before.released_bytes, 10 * 65536);
        assert_eq!(after.live_bytes, 65536);
        assert_eq!(after.mapped_bytes, SLAB_SIZE as u64);
        drop(keep);
    }
}
