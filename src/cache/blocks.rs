//! The host cache of decoded blocks, keyed by content hash.
//!
//! Tenants created from one base image read the same blocks; keying by BLAKE3 hash makes N
//! tenants share one copy in RAM. Eviction and sharding are foyer's in-memory `Cache` (S3-FIFO,
//! weighed in bytes). Each value owns a slot of the [`SlabAllocator`], so when an entry leaves
//! the cache and its last handle drops, its memory goes back to the kernel: shrinking the
//! budget ([`BlockCache::set_budget`], [`BlockCache::release`]) shrinks the process.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use foyer_common::event::{Event, EventListener};
use foyer_memory::{Cache, CacheBuilder, CacheEntry, S3FifoConfig};

use super::slab::{SlabAllocator, SlabBox, SlabStats};

/// A block's identity: the BLAKE3 hash of its decoded bytes.
pub type BlockHash = [u8; 32];

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("the kernel refused memory for a {0}-byte cache block")]
    OutOfMemory(usize),
    #[error("cannot set the cache budget to {bytes} bytes: {detail}")]
    Budget { bytes: usize, detail: String },
}

/// Counters of the block cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockCacheStats {
    pub budget_bytes: u64,
    /// Bytes of cached blocks (slot sizes), as the cache weighs them.
    pub used_bytes: u64,
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Bytes mapped and live in the slab allocator, and given back to the kernel.
    pub mapped_bytes: u64,
    pub live_bytes: u64,
    pub released_bytes: u64,
}

/// Hashes a [`BlockHash`] to its first 8 bytes. The key is already a uniformly random BLAKE3
/// digest, so hashing it again (foyer's default is XxHash64) is wasted work on every lookup.
#[derive(Clone, Copy, Debug, Default)]
struct BlockHashBuilder;

impl BuildHasher for BlockHashBuilder {
    type Hasher = BlockHasher;
    fn build_hasher(&self) -> BlockHasher {
        BlockHasher(0)
    }
}

/// The hasher of [`BlockHashBuilder`].
#[derive(Clone, Copy, Debug, Default)]
struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// A `[u8; 32]` hashes as its length (`write_usize`, ignored below) then one write of its
    /// bytes: keep 8 of them. Shorter writes are folded in so other keys still hash.
    fn write(&mut self, bytes: &[u8]) {
        let mut word = [0u8; 8];
        let n = bytes.len().min(8);
        word[..n].copy_from_slice(&bytes[..n]);
        self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
    }

    fn write_usize(&mut self, _len: usize) {}
}

/// Stripes of the hit counter (a power of two).
const HIT_STRIPES: usize = 16;

/// One stripe of the hit counter, alone on its cache line.
#[derive(Default)]
#[repr(align(64))]
struct HitStripe(AtomicU64);

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's hit stripe (`usize::MAX` until its first hit), the same in every cache.
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The hit counter, striped by thread: each thread adds to its own stripe (threads are dealt
/// stripes in turn), so reader threads do not all write one cache line, and `sum` adds the
/// stripes up. Hits are the hot path of every read.
#[derive(Default)]
struct HitCounter([HitStripe; HIT_STRIPES]);

impl HitCounter {
    #[inline]
    fn add(&self) {
        let mut stripe = STRIPE.get();
        if stripe == usize::MAX {
            stripe = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % HIT_STRIPES;
            STRIPE.set(stripe);
        }
        self.0[stripe % HIT_STRIPES]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    fn sum(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

#[derive(Default)]
struct Evictions(AtomicU64);

impl EventListener for Evictions {
    type Key = BlockHash;
    type Value = SlabBox;
    fn on_leave(&self, reason: Event, _key: &BlockHash, _value: &SlabBox) {
        if reason == Event::Evict {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A handle to a cached block: derefs to its bytes; keeps them alive while held.
pub struct BlockRef(CacheEntry<BlockHash, SlabBox, BlockHashBuilder>);

impl Deref for BlockRef {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.value()
    }
}

/// Builder for [`BlockCache`].
pub struct BlockCacheBuilder {
    budget: usize,
    shards: usize,
    slabs: Option<SlabAllocator>,
}

impl BlockCacheBuilder {
    /// Number of independently locked shards (default 8).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Allocates blocks from `slabs` (shared with the RocksDB block cache), not slabs of its own.
    pub fn slabs(mut self, slabs: SlabAllocator) -> Self {
        self.slabs = Some(slabs);
        self
    }

    pub fn build(self) -> BlockCache {
        let evictions = Arc::new(Evictions::default());
        let cache = CacheBuilder::new(self.budget)
            .with_shards(self.shards)
            .with_eviction_config(S3FifoConfig::default())
            .with_weighter(|_: &BlockHash, v: &SlabBox| v.footprint())
            .with_event_listener(evictions.clone())
            .with_hash_builder(BlockHashBuilder)
            .build();
        BlockCache {
            cache,
            slab: self.slabs.unwrap_or_default(),
            budget: AtomicU64::new(self.budget as u64),
            hits: HitCounter::default(),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions,
        }
    }
}

/// The host-wide cache of decoded blocks.
pub struct BlockCache {
    cache: Cache<BlockHash, SlabBox, BlockHashBuilder>,
    slab: SlabAllocator,
    budget: AtomicU64,
    hits: HitCounter,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: Arc<Evictions>,
}

impl BlockCache {
    /// A cache that holds up to `budget` bytes of blocks.
    pub fn builder(budget: usize) -> BlockCacheBuilder {
        BlockCacheBuilder {
            budget,
            shards: 8,
            slabs: None,
        }
    }

    pub fn get(&self, hash: &BlockHash) -> Option<BlockRef> {
        match self.cache.get(hash) {
            Some(e) => {
                self.hits.add();
                Some(BlockRef(e))
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Caches a block of `len` bytes that `fill` writes in place (decrypt/decompress straight
    /// into the cache's memory: no intermediate buffer).
    pub fn insert_with(
        &self,
        hash: BlockHash,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<BlockRef, CacheError> {
        let mut slot = self.slab.alloc(len).ok_or(CacheError::OutOfMemory(len))?;
        fill(&mut slot);
        self.inserts.fetch_add(1, Ordering::Relaxed);
        Ok(BlockRef(self.cache.insert(hash, slot)))
    }

    /// Caches a copy of `data`.
    pub fn insert(&self, hash: BlockHash, data: &[u8]) -> Result<BlockRef, CacheError> {
        self.insert_with(hash, data.len(), |slot| slot.copy_from_slice(data))
    }

    /// Changes the budget; shrinking evicts at once.
    pub fn set_budget(&self, bytes: usize) -> Result<(), CacheError> {
        // foyer's resize starts a thread per shard: skip it when nothing changes (the host
        // cache re-splits its budget on every governor tick).
        // (foyer's own `capacity()` keeps the construction value, so the budget we recorded
        // after the last successful resize is what is compared.)
        if self.budget.load(Ordering::Relaxed) == bytes as u64 {
            return Ok(());
        }
        self.cache.resize(bytes).map_err(|e| CacheError::Budget {
            bytes,
            detail: e.to_string(),
        })?;
        self.budget.store(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Evicts about `bytes` of blocks now, keeping the budget (the cache may refill).
    /// Returns the bytes the slab allocator gave back to the kernel meanwhile; blocks still
    /// held by a reader are freed when their last handle drops.
    pub fn release(&self, bytes: usize) -> Result<u64, CacheError> {
        let before = self.slab.stats().released_bytes;
        let budget = self.budget.load(Ordering::Relaxed) as usize;
        let target = self.cache.usage().saturating_sub(bytes);
        self.cache.resize(target).map_err(|e| CacheError::Budget {
            bytes: target,
            detail: e.to_string(),
        })?;
        self.cache.resize(budget).map_err(|e| CacheError::Budget {
            bytes: budget,
            detail: e.to_string(),
        })?;
        Ok(self.slab.stats().released_bytes - before)
    }

    pub fn stats(&self) -> BlockCacheStats {
        let SlabStats {
            mapped_bytes,
            live_bytes,
            released_bytes,
            ..
        } = self.slab.stats();
        BlockCacheStats {
            budget_bytes: self.budget.load(Ordering::Relaxed),
            used_bytes: self.cache.usage() as u64,
            entries: self.cache.entries() as u64,
            hits: self.hits.sum(),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.0.load(Ordering::Relaxed),
            mapped_bytes,
            live_bytes,
            released_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(i: u32) -> (BlockHash, Vec<u8>) {
        let data: Vec<u8> = (0..4096u32)
            .map(|j| (i.wrapping_mul(31) ^ j) as u8)
            .collect();
        (*blake3::hash(&data).as_bytes(), data)
    }

    #[test]
    fn hit_miss_insert_evict() {
        let c = BlockCache::builder(64 * 4096).shards(1).build();
        let (h, d) = block(1);
        assert!(c.get(&h).is_none());
        c.insert(h, &d).unwrap();
        assert_eq!(&*c.get(&h).unwrap(), &d[..]);
        for i in 2..200 {
            let (h, d) = block(i);
            c.insert(h, &d).unwrap();
        }
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.inserts), (1, 1, 199));
        assert!(s.evictions > 0, "{s:?}");
        assert!(s.used_bytes <= 64 * 4096, "{s:?}");
        assert_eq!(s.live_bytes, s.used_bytes, "evicted blocks keep no memory");
    }

    #[test]
    fn a_block_hash_hashes_to_its_first_8_bytes() {
        let (h, _) = block(3);
        let first = u64::from_le_bytes(h[..8].try_into().unwrap());
        assert_eq!(BlockHashBuilder.hash_one(h), first);
    }

    #[test]
    fn hits_from_many_threads_add_up() {
        let c = BlockCache::builder(64 * 4096).build();
        let blocks: Vec<_> = (0..16).map(block).collect();
        for (h, d) in &blocks {
            c.insert(*h, d).unwrap();
        }
        std::thread::scope(|s| {
            for t in 0..20 {
                let (c, blocks) = (&c, &blocks);
                s.spawn(move || {
                    for i in 0..1000 {
                        let (h, d) = &blocks[(t + i) % blocks.len()];
                        assert_eq!(&*c.get(h).unwrap(), &d[..]);
                    }
                });
            }
        });
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (20 * 1000, 0, 16), "{s:?}");
    }

    #[test]
    fn held_block_outlives_eviction() {
        let c = BlockCache::builder(8 * 4096).shards(1).build();
        let (h, d) = block(7);
        let held = c.insert(h, &d).unwrap();
        c.set_budget(0).unwrap();
        assert!(c.get(&h).is_none());
        assert_eq!(&*held, &d[..], "a reader's block changed under it");
        drop(held);
        assert_eq!(c.stats().live_bytes, 0);
    }
}
