//! A slab allocator whose memory truly goes back to the kernel.
//!
//! A cache built on `malloc` never shrinks the process: `free` keeps the pages in the
//! allocator. Here memory comes from `mmap(MAP_PRIVATE | MAP_ANONYMOUS)` slabs of 2 MiB, cut
//! into size classes: powers of two from 64 B to 2 KiB, then whole pages: 4, 8, 12, 16 KiB and
//! four steps per power of two up to 1 MiB (20, 24, 28, 32, 40 KiB, ...), so a 17 KiB block
//! takes 20 KiB, not 32. Every class from 4 KiB up is a whole number of pages, so its slots are
//! page-aligned and hold no page with another slot: when one is freed its pages are dropped at
//! once with `MADV_DONTNEED` (RSS follows live bytes); when a slab has no live slot left it is
//! unmapped.
//!
//! Except for a bounded pool: a cache at its budget frees a slot for every one it takes, and
//! giving each freed slot back only to fault its pages in again on the next insert cost a
//! minor fault, a page clear and a TLB shootdown per cached block. Up to
//! [`SlabAllocator::set_pool_limit`] bytes of freed page slots stay resident in a per-class
//! pool and are handed out first (zeroed by a memset, not by the kernel). The pool is the
//! first thing given back: [`SlabAllocator::trim_pool`] (a cache release, a smaller budget,
//! memory pressure) and a lower limit drop it at once.
//! Larger requests get a mapping of their own. Each size class has its own lock, so there is
//! no global lock on the allocation path.
//!
//! [`AddressedSlabs`] serves owners that free by address only (RocksDB's `MemoryAllocator`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags};

/// Size of one slab mapping.
pub const SLAB_SIZE: usize = 2 << 20;
const PAGE: usize = 4096;
const MAX_CLASS: usize = 1 << 20;
/// Powers of two 64 B .. 2 KiB; 4, 8, 12, 16 KiB; then four steps per power of two up to 1 MiB.
const CLASSES: usize = 6 + 4 + 6 * 4;
const CLASS_SIZES: [usize; CLASSES] = class_sizes();
const _: () = assert!(CLASS_SIZES[CLASSES - 1] == MAX_CLASS);

const fn class_sizes() -> [usize; CLASSES] {
    let mut out = [0; CLASSES];
    let mut i = 0;
    while i < 6 {
        out[i] = 64 << i;
        i += 1;
    }
    while i < 10 {
        out[i] = (i - 5) * PAGE;
        i += 1;
    }
    while i < CLASSES {
        let j = i - 10;
        out[i] = (5 + j % 4) << (12 + j / 4);
        i += 1;
    }
    out
}

/// Counters of an allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlabStats {
    /// Bytes of address space mapped (slabs and large mappings).
    pub mapped_bytes: u64,
    /// Bytes in live allocations (slot sizes).
    pub live_bytes: u64,
    /// Bytes given back to the kernel with MADV_DONTNEED or munmap since creation.
    pub released_bytes: u64,
    /// Bytes that may be resident: live page-multiple slots and large mappings, plus whole
    /// slabs of sub-page classes (an upper bound: a fresh slab's untouched pages count too),
    /// plus the pool of free slots kept resident.
    pub resident_bytes: u64,
    /// Free page slots kept resident for reuse (part of `resident_bytes`, not of `live_bytes`).
    pub pooled_bytes: u64,
    /// Allocations served from that pool (no page fault) since creation.
    pub pool_hits: u64,
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
    /// Freed page slots kept resident (slab id, slot): still counted live by their slab.
    pool: Vec<(usize, u32)>,
}

struct Shared {
    classes: Vec<Mutex<Class>>,
    mapped: AtomicU64,
    live: AtomicU64,
    released: AtomicU64,
    resident: AtomicU64,
    pooled: AtomicU64,
    pool_limit: AtomicU64,
    pool_hits: AtomicU64,
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

/// The smallest class that holds `size` bytes; `None` above 1 MiB.
fn class_of(size: usize) -> Option<usize> {
    let c = CLASS_SIZES.partition_point(|&c| c < size.max(1));
    (c < CLASSES).then_some(c)
}

fn class_size(class: usize) -> usize {
    CLASS_SIZES[class]
}

/// Bytes an allocation of `size` really gets (its slot, or its page-rounded mapping).
pub fn usable_size(size: usize) -> usize {
    class_of(size).map_or_else(|| size.div_ceil(PAGE) * PAGE, class_size)
}

/// AddressSanitizer does not know slab slots (they are cut out of mmap'd memory), so with the
/// `asan` feature (only for builds with `-Zsanitizer=address`, see `make asan`) free slots are
/// poisoned: a use after free or a read past an allocation is reported as on the heap.
#[cfg(feature = "asan")]
mod asan {
    use std::ffi::c_void;
    use std::ptr::NonNull;

    extern "C" {
        fn __asan_poison_memory_region(addr: *const c_void, size: usize);
        fn __asan_unpoison_memory_region(addr: *const c_void, size: usize);
        fn __asan_address_is_poisoned(addr: *const c_void) -> i32;
    }

    pub(super) fn poison(p: NonNull<u8>, len: usize) {
        // SAFETY: only marks ASan's shadow memory for a range the allocator owns; the range is
        // not dereferenced.
        unsafe { __asan_poison_memory_region(p.as_ptr().cast(), len) }
    }

    pub(super) fn unpoison(p: NonNull<u8>, len: usize) {
        // SAFETY: as in `poison`.
        unsafe { __asan_unpoison_memory_region(p.as_ptr().cast(), len) }
    }

    #[cfg(test)]
    pub(super) fn is_poisoned(p: *const u8) -> bool {
        // SAFETY: only reads ASan's shadow memory for the address; `p` is not dereferenced.
        unsafe { __asan_address_is_poisoned(p.cast()) != 0 }
    }
}

#[cfg(not(feature = "asan"))]
mod asan {
    use std::ptr::NonNull;
    pub(super) fn poison(_: NonNull<u8>, _: usize) {}
    pub(super) fn unpoison(_: NonNull<u8>, _: usize) {}
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
    // The addresses may be mapped again later, for anyone.
    asan::unpoison(ptr, len);
    // SAFETY: `ptr..ptr+len` is a whole mapping made by `map` whose every slot has been freed,
    // so nothing references it any more.
    if let Err(e) = unsafe { nix::sys::mman::munmap(ptr.cast::<c_void>(), len) } {
        tracing::error!(error = %e, len, "munmap of a slab failed");
    }
}

fn dont_need(ptr: NonNull<u8>, len: usize) {
    // SAFETY: `ptr..ptr+len` is a page-aligned free slot inside a live mapping; no SlabBox
    // refers to it, and MADV_DONTNEED on private anonymous memory only makes it read as zeros.
    let advised =
        unsafe { nix::sys::mman::madvise(ptr.cast::<c_void>(), len, MmapAdvise::MADV_DONTNEED) };
    if let Err(e) = advised {
        tracing::error!(error = %e, len, "madvise(DONTNEED) failed");
    }
}

/// Whether `MADV_POPULATE_WRITE` works here (Linux 5.14+); cleared at the first refusal.
static POPULATE: AtomicBool = AtomicBool::new(true);

/// Faults in the pages of a fresh slot in one call before the caller fills it. Filling a 64
/// KiB slot page by page took 16 page faults; the trap alone was a quarter of a read-ahead
/// thread's time on a cold streaming read (exception entry is dear in a VM). Best effort: when
/// the kernel refuses (too old, or the cgroup is at its limit), the caller's writes fault the
/// pages in as before.
fn populate(ptr: NonNull<u8>, len: usize) {
    if !POPULATE.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: `ptr..ptr+len` is a page-aligned slot inside a live private anonymous mapping,
    // exclusively the caller's; MADV_POPULATE_WRITE only faults its pages in (as writes would)
    // and leaves their contents (zero) as they are.
    let r = unsafe {
        libc::madvise(
            ptr.as_ptr().cast::<c_void>(),
            len,
            libc::MADV_POPULATE_WRITE,
        )
    };
    if r != 0 && nix::errno::Errno::last() == nix::errno::Errno::EINVAL {
        POPULATE.store(false, Ordering::Relaxed);
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
                resident: AtomicU64::new(0),
                pooled: AtomicU64::new(0),
                pool_limit: AtomicU64::new(0),
                pool_hits: AtomicU64::new(0),
            }),
        }
    }

    /// Keeps up to `bytes` of freed page slots resident for reuse (0, the default: none).
    /// Lowering the limit trims the pool to it at once.
    pub fn set_pool_limit(&self, bytes: u64) {
        self.shared.pool_limit.store(bytes, Ordering::Relaxed);
        if self.shared.pooled.load(Ordering::Relaxed) > bytes {
            self.trim_pool();
        }
    }

    /// Gives every pooled free slot back to the kernel now.
    pub fn trim_pool(&self) {
        for class in 0..CLASSES {
            let size = class_size(class);
            let pooled: Vec<_> = {
                let mut c = self.shared.classes[class]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let pool = std::mem::take(&mut c.pool);
                pool.into_iter()
                    .map(|(slab, slot)| {
                        let base = c.slabs[slab]
                            .as_ref()
                            .expect("pooled slots' slabs are mapped");
                        // SAFETY: `slot < SLAB_SIZE / size`: inside the slab mapping.
                        (slab, slot, unsafe { base.base.add(slot as usize * size) })
                    })
                    .collect()
            };
            for (slab, slot, ptr) in pooled {
                // Back from the pool to live for a moment: `free_slot` frees a live slot.
                self.shared.pooled.fetch_sub(size as u64, Ordering::Relaxed);
                self.shared.live.fetch_add(size as u64, Ordering::Relaxed);
                free_slot(&self.shared, class, slab, slot, ptr, false);
            }
        }
    }

    pub fn stats(&self) -> SlabStats {
        SlabStats {
            mapped_bytes: self.shared.mapped.load(Ordering::Relaxed),
            live_bytes: self.shared.live.load(Ordering::Relaxed),
            released_bytes: self.shared.released.load(Ordering::Relaxed),
            resident_bytes: self.shared.resident.load(Ordering::Relaxed),
            pooled_bytes: self.shared.pooled.load(Ordering::Relaxed),
            pool_hits: self.shared.pool_hits.load(Ordering::Relaxed),
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
            self.shared
                .resident
                .fetch_add(mapped as u64, Ordering::Relaxed);
            return Some(SlabBox {
                ptr,
                len,
                origin: Origin::Large { mapped },
                shared: self.shared.clone(),
            });
        };
        let size = class_size(class);
        let (id, slot, ptr, pooled) = self.take_slot(class, size)?;
        asan::unpoison(ptr, len);
        let shared = &self.shared;
        shared.live.fetch_add(size as u64, Ordering::Relaxed);
        if pooled {
            shared.pooled.fetch_sub(size as u64, Ordering::Relaxed);
            shared.pool_hits.fetch_add(1, Ordering::Relaxed);
        } else if size >= PAGE {
            shared.resident.fetch_add(size as u64, Ordering::Relaxed);
            populate(ptr, len.div_ceil(PAGE) * PAGE);
        }
        // Sub-page slots and pooled page slots may hold an earlier allocation's bytes (other
        // page slots were DONTNEED'd and read as zeros, fresh mappings are zero): clear what the
        // caller will see.
        if pooled || size < PAGE {
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

    /// A free slot of `class`: from the resident pool if it has one (`true`), else from a
    /// slab with room, mapping a new slab when none has. `None` when the kernel refuses.
    fn take_slot(&self, class: usize, size: usize) -> Option<(usize, u32, NonNull<u8>, bool)> {
        let mut c = self.shared.classes[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((id, slot)) = c.pool.pop() {
            let base = c.slabs[id]
                .as_ref()
                .expect("pooled slots' slabs are mapped")
                .base;
            // SAFETY: a pooled slot is `< SLAB_SIZE / size` of its slab, which stays mapped
            // while the slot is counted live.
            return Some((id, slot, unsafe { base.add(slot as usize * size) }, true));
        }
        let id = match c.partial.last() {
            Some(&id) => id,
            None => {
                let base = map(SLAB_SIZE)?;
                asan::poison(base, SLAB_SIZE);
                self.shared
                    .mapped
                    .fetch_add(SLAB_SIZE as u64, Ordering::Relaxed);
                if size < PAGE {
                    self.shared
                        .resident
                        .fetch_add(SLAB_SIZE as u64, Ordering::Relaxed);
                }
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
        Some((id, slot, ptr, false))
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
                shared.resident.fetch_sub(mapped as u64, Ordering::Relaxed);
                shared.released.fetch_add(mapped as u64, Ordering::Relaxed);
            }
            Origin::Slot { class, slab, slot } => {
                free_slot(shared, class, slab, slot, self.ptr, true);
            }
        }
    }
}

/// Returns the live slot at `ptr`: into the resident pool if `may_pool` (a dropped box's),
/// it is a page slot and the pool has room; else to its slab, its pages to the kernel (and the
/// slab too once empty).
fn free_slot(
    shared: &Shared,
    class: usize,
    slab: usize,
    slot: u32,
    ptr: NonNull<u8>,
    may_pool: bool,
) {
    let size = class_size(class);
    asan::poison(ptr, size);
    shared.live.fetch_sub(size as u64, Ordering::Relaxed);
    if size >= PAGE {
        let limit = shared.pool_limit.load(Ordering::Relaxed);
        // Room is reserved before the slot goes in, so racing frees never overfill the pool.
        if may_pool
            && shared.pooled.fetch_add(size as u64, Ordering::Relaxed) + size as u64 <= limit
        {
            shared.classes[class]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pool
                .push((slab, slot));
            return;
        }
        if may_pool {
            shared.pooled.fetch_sub(size as u64, Ordering::Relaxed);
        }
        // Give the pages back while the slot is still exclusively ours (it is on no free
        // list yet, and no lock is held for the syscall): once it is, another thread may hand
        // it out and write to it.
        dont_need(ptr, size);
        shared.released.fetch_add(size as u64, Ordering::Relaxed);
        shared.resident.fetch_sub(size as u64, Ordering::Relaxed);
    }
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
            shared
                .resident
                .fetch_sub(SLAB_SIZE as u64, Ordering::Relaxed);
        }
        return;
    }
    let was_full = s.free.is_empty();
    s.free.push(slot);
    if was_full {
        c.partial.push(slab);
    }
}

const ADDRESS_SHARDS: usize = 16;

/// Allocations known by their address, for owners that free by pointer alone (RocksDB's
/// `MemoryAllocator::Deallocate(void*)` gets no size). Each live allocation's [`SlabBox`] is
/// kept in a map sharded by address; freeing drops it, which returns the slot as usual.
pub struct AddressedSlabs {
    slabs: SlabAllocator,
    shards: Box<[Mutex<HashMap<usize, SlabBox>>]>,
}

impl AddressedSlabs {
    pub fn new(slabs: SlabAllocator) -> Self {
        Self {
            slabs,
            shards: (0..ADDRESS_SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    pub fn allocator(&self) -> &SlabAllocator {
        &self.slabs
    }

    fn shard(&self, addr: usize) -> &Mutex<HashMap<usize, SlabBox>> {
        &self.shards[(addr >> 12) % ADDRESS_SHARDS]
    }

    /// Allocates `len` bytes; the caller writes through the pointer until it calls
    /// [`deallocate`](Self::deallocate) with it. `None` when the kernel refuses memory.
    pub fn allocate(&self, len: usize) -> Option<NonNull<u8>> {
        let b = self.slabs.alloc(len)?;
        let ptr = b.ptr;
        self.shard(ptr.as_ptr() as usize)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr.as_ptr() as usize, b);
        Some(ptr)
    }

    /// Frees an allocation made by [`allocate`](Self::allocate); `false` if `ptr` is not one.
    pub fn deallocate(&self, ptr: *mut u8) -> bool {
        let b = self
            .shard(ptr as usize)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ptr as usize));
        b.is_some()
    }

    /// Allocations not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests;
