//! One memory budget for both host caches.
//!
//! The RocksDB block cache (tenant stores' blocks, index/filter blocks, memtable charges) and the
//! content-addressed block cache (shared base-image blocks) allocate from one slab allocator,
//! and one budget bounds the two together. Shared base blocks serve many tenants per byte, so
//! they come first: the content-addressed cache may hold up to 3/4 of the budget, and the
//! RocksDB cache gets what it leaves (at least 1/4). The split follows the content-addressed
//! cache's use: it is redone on every budget change, every governor tick and every 64 block
//! inserts ([`HostCache::rebalance`], [`HostCache::block_inserted`]), shrinking the RocksDB
//! cache at once (its LRU evicts down to the new capacity before the call returns).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::blocks::{BlockCache, BlockCacheStats};
use super::rocks::{RocksBlockCache, RocksBlockCacheStats};
use super::slab::{SlabAllocator, SlabStats};

/// Numbers for `tenantfs cache stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostCacheStats {
    pub budget_bytes: u64,
    /// Bytes the two caches hold (their charges).
    pub used_bytes: u64,
    /// Slab memory that may be resident (see [`SlabStats::resident_bytes`]).
    pub resident_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Bytes given back to the kernel (MADV_DONTNEED, munmap) since start.
    pub released_bytes: u64,
    pub mapped_bytes: u64,
    pub live_bytes: u64,
    /// Free slab slots kept resident for reuse (part of `resident_bytes`).
    pub pooled_bytes: u64,
    /// Allocations served from that pool since start (no page fault each).
    pub pool_hits: u64,
    pub rocksdb: RocksBlockCacheStats,
    pub blocks: BlockCacheStats,
}

/// The two caches and their budget.
pub struct HostCache {
    slabs: SlabAllocator,
    rocks: RocksBlockCache,
    blocks: BlockCache,
    budget: AtomicU64,
    inserts: AtomicU32,
}

impl HostCache {
    pub fn new(budget: u64) -> Self {
        let slabs = SlabAllocator::new();
        let cache = Self {
            rocks: RocksBlockCache::new(budget as usize, &slabs),
            blocks: BlockCache::builder((budget / 4 * 3) as usize)
                .slabs(slabs.clone())
                .build(),
            slabs,
            budget: AtomicU64::new(budget),
            inserts: AtomicU32::new(0),
        };
        cache.slabs.set_pool_limit(pool_limit(budget));
        cache.rebalance();
        cache
    }

    /// The cache to give every tenant store (see `StoreHostBuilder::block_cache`).
    pub fn rocksdb(&self) -> &RocksBlockCache {
        &self.rocks
    }

    pub fn blocks(&self) -> &BlockCache {
        &self.blocks
    }

    pub fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }

    pub fn used(&self) -> u64 {
        self.rocks.usage() as u64 + self.blocks.stats().used_bytes
    }

    /// Sets the budget; shrinking evicts at once (and gives the memory back to the kernel,
    /// the pool of free slots first).
    pub fn set_budget(&self, bytes: u64) {
        let before = self.budget.swap(bytes, Ordering::Relaxed);
        self.slabs.set_pool_limit(pool_limit(bytes));
        self.rebalance();
        if bytes < before {
            // After the evictions, which freed their slots into the pool.
            self.slabs.trim_pool();
            super::malloc::give_back_free_heap();
        }
    }

    /// Re-splits the budget between the two caches (see the module doc).
    pub fn rebalance(&self) {
        let budget = self.budget();
        let blocks = budget / 4 * 3;
        let rocks = budget - self.blocks.stats().used_bytes.min(blocks);
        // Shrink first, so the two never hold more than the budget between the calls.
        if (rocks as usize) < self.rocks.capacity() {
            self.rocks.set_capacity(rocks as usize);
            self.set_blocks_budget(blocks);
        } else {
            self.set_blocks_budget(blocks);
            self.rocks.set_capacity(rocks as usize);
        }
    }

    /// Tells the cache a block was inserted into the content-addressed cache: every 64th
    /// re-splits the budget, so that cache can grow between governor ticks.
    pub fn block_inserted(&self) {
        if self.inserts.fetch_add(1, Ordering::Relaxed) % 64 == 63 {
            self.rebalance();
        }
    }

    fn set_blocks_budget(&self, bytes: u64) {
        if let Err(e) = self.blocks.set_budget(bytes as usize) {
            tracing::error!(error = %e, bytes, "cannot resize the block cache");
        }
    }

    /// Evicts about `bytes` now from the two caches in proportion to what they hold, keeping
    /// the budget (they may fill again). Returns the bytes given back to the kernel; blocks a
    /// reader still holds go back when it lets go.
    pub fn release(&self, bytes: u64) -> u64 {
        let before = self.slabs.stats().released_bytes;
        let rocks_used = self.rocks.usage() as u64;
        let blocks_used = self.blocks.stats().used_bytes;
        let total = rocks_used + blocks_used;
        if total > 0 {
            let from_rocks = (bytes as u128 * rocks_used as u128 / total as u128) as u64;
            self.rocks.release(from_rocks as usize);
            if let Err(e) = self
                .blocks
                .release(bytes.saturating_sub(from_rocks) as usize)
            {
                tracing::error!(error = %e, "cannot release from the block cache");
            }
        }
        // Last: the evictions above freed their slots into the pool.
        self.slabs.trim_pool();
        let released = self.slabs.stats().released_bytes - before;
        tracing::info!(requested = bytes, released, "released cache memory");
        released
    }

    pub fn stats(&self) -> HostCacheStats {
        let rocksdb = self.rocks.stats();
        let blocks = self.blocks.stats();
        let SlabStats {
            mapped_bytes,
            live_bytes,
            released_bytes,
            resident_bytes,
            pooled_bytes,
            pool_hits,
        } = self.slabs.stats();
        HostCacheStats {
            budget_bytes: self.budget(),
            used_bytes: rocksdb.usage_bytes + blocks.used_bytes,
            resident_bytes,
            hits: rocksdb.hits + blocks.hits,
            misses: rocksdb.misses + blocks.misses,
            evictions: rocksdb.evictions + blocks.evictions,
            released_bytes,
            mapped_bytes,
            live_bytes,
            pooled_bytes,
            pool_hits,
            rocksdb,
            blocks,
        }
    }
}

/// Free slots kept resident for a budget: enough that a cache churning at its budget reuses
/// freed slots instead of faulting fresh pages in, little against the budget itself.
fn pool_limit(budget: u64) -> u64 {
    (budget / 32).clamp(1 << 20, 64 << 20)
}

impl crate::pressure::CacheBudget for HostCache {
    fn budget(&self) -> u64 {
        HostCache::budget(self)
    }
    fn used(&self) -> u64 {
        HostCache::used(self)
    }
    fn set_budget(&self, bytes: u64) {
        HostCache::set_budget(self, bytes)
    }
    fn tick(&self) {
        self.rebalance();
        // Write buffers freed after a burst of writes stay in malloc's arenas (see `malloc`).
        super::malloc::give_back_free_heap_now_and_then();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_caches_stay_within_one_budget() {
        let c = HostCache::new(64 << 20);
        let fill = |c: &HostCache, seed: u32, n: u32| {
            for i in 0..n {
                let mut data = vec![0u8; 4096];
                data[..8].copy_from_slice(&(u64::from(seed) << 32 | u64::from(i)).to_le_bytes());
                c.blocks()
                    .insert(*blake3::hash(&data).as_bytes(), &data)
                    .unwrap();
                c.block_inserted();
            }
        };
        assert_eq!(c.stats().blocks.budget_bytes, 48 << 20, "3/4 of the budget");
        assert_eq!(
            c.stats().rocksdb.capacity_bytes,
            64 << 20,
            "all of it while unused"
        );
        // 8192 blocks of 4 KiB = 32 MiB in the block cache: RocksDB's share follows.
        fill(&c, 1, 8192);
        c.rebalance();
        let s = c.stats();
        assert!(s.blocks.used_bytes >= 31 << 20, "{s:?}");
        assert_eq!(s.rocksdb.capacity_bytes, (64 << 20) - s.blocks.used_bytes);
        // More than 3/4: the block cache evicts, RocksDB keeps its quarter.
        fill(&c, 2, 8192);
        c.rebalance();
        let s = c.stats();
        assert!(s.blocks.used_bytes <= 48 << 20, "{s:?}");
        assert!(s.rocksdb.capacity_bytes >= 16 << 20, "{s:?}");
        c.set_budget(16 << 20);
        assert!(c.used() <= 16 << 20);
        assert!(c.stats().blocks.budget_bytes <= 12 << 20);
    }

    #[test]
    fn release_gives_memory_back() {
        let c = HostCache::new(64 << 20);
        for i in 0..2000u32 {
            let data = vec![(i % 251) as u8; 16384];
            let mut h = *blake3::hash(&data).as_bytes();
            h[..4].copy_from_slice(&i.to_le_bytes());
            c.blocks().insert(h, &data).unwrap();
            if i % 100 == 0 {
                c.rebalance();
            }
        }
        let used = c.used();
        assert!(used > 8 << 20, "{used}");
        let released = c.release(4 << 20);
        assert!(released >= 4 << 20, "{released}");
        assert!(c.used() <= used - (4 << 20));
    }
}
