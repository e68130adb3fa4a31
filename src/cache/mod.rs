//! Memory for the host-wide caches.
//!
//! `slab`: an allocator over mmap'd slabs that gives freed memory back to the kernel at once,
//! so a cache that shrinks shrinks the process (RSS), unlike one built on malloc.
//! `blocks`: the host cache of decoded blocks keyed by content hash, on foyer's S3-FIFO cache
//! with slab-owned values. (The RocksDB block cache bridge and the pressure governor are the
//! next steps of issue 4.)

pub mod blocks;
pub mod slab;

pub use blocks::{BlockCache, BlockCacheBuilder, BlockCacheStats, BlockHash, BlockRef, CacheError};
pub use slab::{SlabAllocator, SlabBox, SlabStats, SLAB_SIZE};
