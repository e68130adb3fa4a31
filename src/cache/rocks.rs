//! The RocksDB block cache that every tenant store of a process shares.
//!
//! RocksDB's own LRU cache (it knows which blocks are pinned by readers and charges memtables
//! to the same budget), but its block memory comes from the host's slab allocator through a
//! `rocksdb::MemoryAllocator` in the shim: an evicted block's pages go back to the kernel at
//! once, so shrinking the cache shrinks the process. Hits, misses and evictions are counted in
//! the shim.

use std::sync::Arc;

use super::recent_misses::RecentMisses;
use super::rocks_lru::SlabLruCache;
use super::slab::{AddressedSlabs, SlabAllocator};

/// Counters and sizes of a [`RocksBlockCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RocksBlockCacheStats {
    pub capacity_bytes: u64,
    /// Charged bytes: blocks (their slot sizes) plus memtable reservations.
    pub usage_bytes: u64,
    /// Charged bytes held by readers or pinned (L0 index and filter blocks): not evictable.
    pub pinned_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// A handle to the shared cache; clones share it.
#[derive(Clone)]
pub struct RocksBlockCache {
    inner: Arc<Inner>,
}

struct Inner {
    lru: SlabLruCache,
    slabs: Arc<AddressedSlabs>,
    part_misses: RecentMisses,
}

impl RocksBlockCache {
    /// A cache of `capacity` bytes whose blocks are allocated from `slabs`.
    pub fn new(capacity: usize, slabs: &SlabAllocator) -> Self {
        let slabs = Arc::new(AddressedSlabs::new(slabs.clone()));
        // -1: RocksDB picks the shard count from the capacity.
        let lru = SlabLruCache::new(capacity, -1, slabs.clone());
        Self {
            inner: Arc::new(Inner {
                lru,
                slabs,
                part_misses: RecentMisses::default(),
            }),
        }
    }

    pub fn capacity(&self) -> usize {
        self.inner.lru.capacity()
    }

    pub fn usage(&self) -> usize {
        self.inner.lru.usage()
    }

    /// Sets the capacity; shrinking evicts unpinned blocks before it returns.
    pub fn set_capacity(&self, bytes: usize) {
        self.inner.lru.set_capacity(bytes);
    }

    /// Evicts least-recently-used blocks until `bytes` less are charged (or only pinned ones
    /// remain), keeping the capacity: the cache may fill again. Returns the charge dropped.
    pub fn release(&self, bytes: usize) -> usize {
        let before = self.usage();
        let capacity = self.capacity();
        self.set_capacity(before.saturating_sub(bytes));
        self.set_capacity(capacity);
        before.saturating_sub(self.usage())
    }

    pub fn stats(&self) -> RocksBlockCacheStats {
        let [hits, misses, evictions] = self.inner.lru.counters();
        RocksBlockCacheStats {
            capacity_bytes: self.capacity() as u64,
            usage_bytes: self.usage() as u64,
            pinned_bytes: self.inner.lru.pinned_usage() as u64,
            hits,
            misses,
            evictions,
        }
    }

    /// Block allocations now alive in slab memory.
    pub fn slab_allocations(&self) -> usize {
        self.inner.slabs.live_allocations()
    }

    /// Caches a copy of `data` under `key` directly (for benchmarks and tests of the cache
    /// itself; stores insert their blocks on their own). Keys must not collide with RocksDB's,
    /// which are 16+ bytes of cache-unique ids: use short keys or a prefix of your own.
    pub fn insert_raw(&self, key: &[u8], data: &[u8]) -> bool {
        self.inner.lru.raw_insert(key, data)
    }

    /// Drops the entry made by [`insert_raw`](Self::insert_raw) under `key`, if there is one:
    /// bytes no reader will ask for again give their memory back at once.
    pub fn erase_raw(&self, key: &[u8]) {
        self.inner.lru.raw_erase(key)
    }

    /// Looks up an entry made by [`insert_raw`](Self::insert_raw) and hands its bytes to `f`
    /// while it is pinned.
    pub fn with_raw<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.inner.lru.raw_lookup(key).map(|hit| f(&hit))
    }

    /// Records that a part of the raw entry under `key` was missed (and read alone); whether
    /// another part of it was missed lately, within a turn of the cache: then the caller
    /// reads and caches the entry whole (see `recent_misses`).
    pub fn part_missed_again(&self, key: &[u8]) -> bool {
        self.inner.part_misses.missed_again(key, self.capacity())
    }

    pub(crate) fn lru(&self) -> &SlabLruCache {
        &self.inner.lru
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_allocates_from_the_slabs() {
        let slabs = SlabAllocator::new();
        let cache = RocksBlockCache::new(8 << 20, &slabs);
        assert!(cache.lru().uses_slabs());
        assert_eq!(cache.capacity(), 8 << 20);
        cache.set_capacity(4 << 20);
        assert_eq!(cache.capacity(), 4 << 20);
        assert_eq!(cache.stats().hits, 0);
    }

    #[test]
    fn raw_entries_round_trip_and_free_their_slots() {
        let slabs = SlabAllocator::new();
        let cache = RocksBlockCache::new(1 << 20, &slabs);
        for i in 0u32..1000 {
            let data = vec![i as u8; 4000];
            assert!(cache.insert_raw(&i.to_le_bytes(), &data));
        }
        // 1000 x 4 KiB slots do not fit in 1 MiB: old ones were evicted and freed.
        assert!(cache.with_raw(&0u32.to_le_bytes(), |_| ()).is_none());
        let got = cache
            .with_raw(&999u32.to_le_bytes(), <[u8]>::to_vec)
            .unwrap();
        assert_eq!(got, vec![999u32 as u8; 4000]);
        let s = cache.stats();
        assert!(s.evictions > 0 && s.hits == 1 && s.misses == 1, "{s:?}");
        assert!(slabs.stats().live_bytes <= 1 << 20);
        cache.set_capacity(0);
        assert_eq!(slabs.stats().live_bytes, 0);
        assert_eq!(cache.slab_allocations(), 0);
    }

    /// An erased entry is gone for the next lookup and its slot is freed, but a reader that
    /// held it when it was erased still reads its bytes (the handle pins them: what
    /// `raw_erase`'s SAFETY relies on).
    #[test]
    fn an_erased_raw_entry_is_gone_but_a_pinned_reader_keeps_its_bytes() {
        let slabs = SlabAllocator::new();
        let cache = RocksBlockCache::new(1 << 20, &slabs);
        assert!(cache.insert_raw(b"k", &[7u8; 4096]));
        let before = slabs.stats().live_bytes;
        let hit = cache.lru().raw_lookup(b"k").unwrap();
        cache.erase_raw(b"k");
        assert!(cache.with_raw(b"k", |_| ()).is_none());
        assert_eq!(slabs.stats().live_bytes, before, "pinned: not freed yet");
        assert!(hit.iter().all(|&b| b == 7) && hit.len() == 4096);
        drop(hit);
        assert!(slabs.stats().live_bytes < before, "freed once released");
        cache.erase_raw(b"absent"); // nothing to erase: no effect
    }

    /// What the neighbour warming of the volume relies on: the thread's counter moves by one
    /// per lookup that missed on this thread, and not for a hit or for another thread's miss.
    #[test]
    fn the_thread_miss_counter_counts_this_threads_misses_only() {
        let slabs = SlabAllocator::new();
        let cache = RocksBlockCache::new(1 << 20, &slabs);
        assert!(cache.insert_raw(b"here", &[1u8; 4096]));
        let before = crate::cache::thread_misses();
        assert!(cache.with_raw(b"here", |_| ()).is_some());
        assert_eq!(crate::cache::thread_misses(), before, "a hit");
        assert!(cache.with_raw(b"absent", |_| ()).is_none());
        assert!(cache.with_raw(b"gone", |_| ()).is_none());
        assert_eq!(crate::cache::thread_misses(), before + 2, "two misses");
        let other = cache.clone();
        std::thread::spawn(move || {
            assert!(other.with_raw(b"elsewhere", |_| ()).is_none());
            assert_eq!(crate::cache::thread_misses(), 1, "a new thread starts at 0");
        })
        .join()
        .unwrap();
        assert_eq!(
            crate::cache::thread_misses(),
            before + 2,
            "not this thread's"
        );
    }

    #[test]
    fn the_slabs_outlive_the_cache_handle_until_rocksdb_drops_them() {
        let slabs = SlabAllocator::new();
        let cache = RocksBlockCache::new(1 << 20, &slabs);
        let weak = Arc::downgrade(&cache.inner.slabs);
        drop(cache);
        assert!(weak.upgrade().is_none(), "the shim released its count");
    }
}
