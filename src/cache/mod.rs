//! Memory for the host-wide caches.
//!
//! `slab`: an allocator over mmap'd slabs that gives freed memory back to the kernel at once,
//! so a cache that shrinks shrinks the process (RSS), unlike one built on malloc.
//! `blocks`: the host cache of decoded blocks keyed by content hash, on foyer's S3-FIFO cache
//! with slab-owned values.
//! `rocks`: the RocksDB block cache that every tenant store shares, its blocks in the same
//! slabs (`rocks_lru`: its raw handles, built by the store's C++ shim).
//! `host`: the one budget over both host caches.
//! `recent_misses`: which raw entries were missed in part lately (read whole on a second).

pub mod blocks;
pub mod host;
pub mod malloc;
mod recent_misses;
pub mod rocks;
mod rocks_lru;
pub mod slab;

pub use blocks::{BlockCache, BlockCacheBuilder, BlockCacheStats, BlockHash, BlockRef, CacheError};
pub use host::{HostCache, HostCacheStats};
pub use rocks::{RocksBlockCache, RocksBlockCacheStats};
pub(crate) use rocks_lru::{thread_misses, SlabLruCache};
pub use slab::{SlabAllocator, SlabBox, SlabStats, SLAB_SIZE};

/// This process's resident set size in bytes (the `Rss:` line of /proc/self/smaps_rollup):
/// what the kernel charges to the process, the number a cache release must move.
pub fn process_rss_bytes() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup")?;
    text.lines()
        .find(|l| l.starts_with("Rss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| std::io::Error::other("no Rss line in /proc/self/smaps_rollup"))
}
