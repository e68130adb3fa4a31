//! Memory for the host-wide caches.
//!
//! `slab`: an allocator over mmap'd slabs that gives freed memory back to the kernel at once,
//! so a cache that shrinks shrinks the process (RSS), unlike one built on malloc. The host block
//! cache and the RocksDB block cache bridge build on it (issue 4, next steps).

pub mod slab;

pub use slab::{SlabAllocator, SlabBox, SlabStats, SLAB_SIZE};
