//! The raw handles of the RocksDB block cache on slab memory: an LRU cache built by the C++
//! shim (`store/shim.cc`) whose `MemoryAllocator` calls back into [`AddressedSlabs`] (one
//! `Arc` count held by the shim's allocator), and entries of the cache's own kind (raw bytes
//! under a caller's key) beside RocksDB's blocks. The safe side: `rocks::RocksBlockCache`;
//! stores attach the cache to their options through `store::ffi`.

use std::ffi::c_void;
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use librocksdb_sys as sys;

use super::slab::{usable_size, AddressedSlabs};

extern "C" {
    fn tenantfs_lru_cache_new(
        capacity: usize,
        num_shard_bits: i32,
        slabs: *const c_void,
    ) -> *mut sys::rocksdb_cache_t;
    fn tenantfs_lru_cache_counters(cache: *const sys::rocksdb_cache_t, out: *mut u64);
    fn tenantfs_cache_thread_misses() -> u64;
    fn tenantfs_cache_raw_insert(
        cache: *const sys::rocksdb_cache_t,
        key: *const c_char,
        key_len: usize,
        data: *const c_char,
        len: usize,
    ) -> i32;
    fn tenantfs_cache_raw_lookup(
        cache: *const sys::rocksdb_cache_t,
        key: *const c_char,
        key_len: usize,
        data: *mut *const c_char,
        len: *mut usize,
    ) -> *mut c_void;
    fn tenantfs_cache_raw_release(cache: *const sys::rocksdb_cache_t, handle: *mut c_void);
    fn tenantfs_cache_raw_erase(
        cache: *const sys::rocksdb_cache_t,
        key: *const c_char,
        key_len: usize,
    );
    #[cfg(test)]
    fn tenantfs_cache_uses_slabs(cache: *const sys::rocksdb_cache_t) -> i32;
}

/// Lookups that missed, in every cache `SlabLruCache::new` made, on the calling thread since
/// it started: a reader compares it before and after a read to learn whether the read went to
/// the disk (every block or extent read goes through one of these caches first).
pub(crate) fn thread_misses() -> u64 {
    // SAFETY: no arguments; the shim returns its own thread-local counter.
    unsafe { tenantfs_cache_thread_misses() }
}

/// A RocksDB LRU cache whose blocks live in slab memory (see `shim.cc`).
pub(crate) struct SlabLruCache {
    raw: NonNull<sys::rocksdb_cache_t>,
}

// SAFETY: RocksDB caches are internally synchronised; every method below goes through the
// thread-safe C API on a pointer that stays valid until Drop.
unsafe impl Send for SlabLruCache {}
// SAFETY: as above.
unsafe impl Sync for SlabLruCache {}

impl SlabLruCache {
    /// `num_shard_bits`: the cache has 2^bits independently locked shards.
    pub(crate) fn new(capacity: usize, num_shard_bits: i32, slabs: Arc<AddressedSlabs>) -> Self {
        let slabs = Arc::into_raw(slabs).cast::<c_void>();
        // SAFETY: `slabs` is one count of an Arc<AddressedSlabs> that the shim's allocator
        // takes over and gives back once through `tenantfs_slabs_release`.
        let raw = unsafe { tenantfs_lru_cache_new(capacity, num_shard_bits, slabs) };
        Self {
            raw: NonNull::new(raw).expect("the shim returns a cache or throws"),
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::rocksdb_cache_t {
        self.raw.as_ptr()
    }

    pub(crate) fn capacity(&self) -> usize {
        // SAFETY: a live cache (see the Send/Sync note).
        unsafe { sys::rocksdb_cache_get_capacity(self.raw()) }
    }

    pub(crate) fn usage(&self) -> usize {
        // SAFETY: as above.
        unsafe { sys::rocksdb_cache_get_usage(self.raw()) }
    }

    pub(crate) fn pinned_usage(&self) -> usize {
        // SAFETY: as above.
        unsafe { sys::rocksdb_cache_get_pinned_usage(self.raw()) }
    }

    /// Shrinking evicts unpinned entries down to `bytes` before it returns.
    pub(crate) fn set_capacity(&self, bytes: usize) {
        // SAFETY: as above.
        unsafe { sys::rocksdb_cache_set_capacity(self.raw(), bytes) }
    }

    /// (hits, misses, evictions) since creation.
    pub(crate) fn counters(&self) -> [u64; 3] {
        let mut out = [0u64; 3];
        // SAFETY: the cache was made by `tenantfs_lru_cache_new` (so its rep is the shim's
        // counting cache) and `out` has room for the three counters written.
        unsafe { tenantfs_lru_cache_counters(self.raw(), out.as_mut_ptr()) };
        out
    }

    /// Whether the cache hands its blocks to the slab allocator (for the layout test).
    #[cfg(test)]
    pub(crate) fn uses_slabs(&self) -> bool {
        // SAFETY: a live cache; the shim only reads its allocator's name.
        unsafe { tenantfs_cache_uses_slabs(self.raw()) == 1 }
    }
}

/// A raw entry found in a [`SlabLruCache`]; its bytes stay valid (pinned) until drop.
pub(crate) struct RawHit<'a> {
    cache: &'a SlabLruCache,
    handle: NonNull<c_void>,
    data: *const u8,
    len: usize,
}

impl SlabLruCache {
    /// Caches a copy of `data` under `key` (an entry of its own kind, not a RocksDB block).
    pub(crate) fn raw_insert(&self, key: &[u8], data: &[u8]) -> bool {
        // SAFETY: a live cache; both buffers are valid for their lengths for the call, and the
        // shim copies them.
        unsafe {
            tenantfs_cache_raw_insert(
                self.raw(),
                key.as_ptr().cast(),
                key.len(),
                data.as_ptr().cast(),
                data.len(),
            ) == 0
        }
    }

    /// Drops the entry made by [`raw_insert`](Self::raw_insert) under `key`, if there is one.
    pub(crate) fn raw_erase(&self, key: &[u8]) {
        // SAFETY: a live cache; `key` is valid for the call (the cache copies what it keeps of
        // it); an entry pinned by a `RawHit` stays valid until that hit releases it.
        unsafe { tenantfs_cache_raw_erase(self.raw(), key.as_ptr().cast(), key.len()) }
    }

    /// Looks up an entry made by [`raw_insert`](Self::raw_insert) under `key`.
    pub(crate) fn raw_lookup(&self, key: &[u8]) -> Option<RawHit<'_>> {
        let mut data = std::ptr::null();
        let mut len = 0;
        // SAFETY: a live cache; `key` is valid for the call; the out pointers are valid for one
        // write each. Only raw entries are ever stored under keys callers pass here (RocksDB's
        // block keys are cache-unique ids a caller cannot name).
        let handle = unsafe {
            tenantfs_cache_raw_lookup(
                self.raw(),
                key.as_ptr().cast(),
                key.len(),
                &mut data,
                &mut len,
            )
        };
        NonNull::new(handle).map(|handle| RawHit {
            cache: self,
            handle,
            data: data.cast(),
            len,
        })
    }
}

impl std::ops::Deref for RawHit<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the handle pins the entry, whose value holds `len` bytes at `data`, until
        // `drop` releases it; nothing writes to a cached value.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

impl Drop for RawHit<'_> {
    fn drop(&mut self) {
        // SAFETY: a handle from a successful lookup on this cache, released exactly once.
        unsafe { tenantfs_cache_raw_release(self.cache.raw(), self.handle.as_ptr()) }
    }
}

impl Drop for SlabLruCache {
    fn drop(&mut self) {
        // SAFETY: made by the shim with `new rocksdb_cache_t`; this drops our shared_ptr count
        // (stores holding the cache in their options keep theirs).
        unsafe { sys::rocksdb_cache_destroy(self.raw()) }
    }
}

#[no_mangle]
extern "C" fn tenantfs_slab_allocate(slabs: *const c_void, size: usize) -> *mut c_void {
    // SAFETY: `slabs` is the Arc<AddressedSlabs> count the shim's allocator holds until
    // `tenantfs_slabs_release`, so it is alive here.
    let slabs = unsafe { &*slabs.cast::<AddressedSlabs>() };
    slabs
        .allocate(size)
        .map_or(std::ptr::null_mut(), |p| p.as_ptr().cast())
}

#[no_mangle]
extern "C" fn tenantfs_slab_deallocate(slabs: *const c_void, p: *mut c_void) -> i32 {
    // SAFETY: as in `tenantfs_slab_allocate`.
    let slabs = unsafe { &*slabs.cast::<AddressedSlabs>() };
    i32::from(slabs.deallocate(p.cast()))
}

#[no_mangle]
extern "C" fn tenantfs_slab_usable_size(size: usize) -> usize {
    usable_size(size)
}

#[no_mangle]
extern "C" fn tenantfs_slabs_release(slabs: *const c_void) {
    // SAFETY: the count handed over by `Arc::into_raw` in `SlabLruCache::new`, released once
    // when RocksDB destroys the allocator.
    drop(unsafe { Arc::from_raw(slabs.cast::<AddressedSlabs>()) });
}
