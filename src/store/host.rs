//! What every tenant store in one process shares: one RocksDB block cache (its blocks in slab
//! memory, see `block_cache`), one WriteBufferManager (memtables are charged to that cache, so
//! the host has one memory budget, not one per tenant), and the direct-I/O policy with its
//! one-time fallback warning.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rocksdb::{DBCompressionType, LogLevel, Options};

use crate::cache::SlabAllocator;

use super::ffi::{CacheChargedWriteBuffers, TableSettings};
use crate::cache::RocksBlockCache;

/// Disk a store's WAL is extended by at a time (at most this much is allocated ahead).
pub const WAL_PREALLOCATION_STEP: usize = 256 << 10;
/// Disk a store's MANIFEST is extended by at a time.
pub const MANIFEST_PREALLOCATION_STEP: usize = 64 << 10;
/// Extent values this long or longer (file data: whole and most partial blocks) live in blob
/// files; shorter ones (small file tails, base references) stay in the SSTs beside their key.
pub const MIN_BLOB_BYTES: u64 = 2048;

/// Whether stores read and write with O_DIRECT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIo {
    /// Use O_DIRECT where the data dir's filesystem supports it (probed), else buffered I/O.
    #[default]
    Auto,
    /// Always buffered I/O (through the page cache).
    Off,
}

/// Builder for [`StoreHost`].
#[derive(Clone)]
pub struct StoreHostBuilder {
    block_cache_bytes: usize,
    block_cache: Option<RocksBlockCache>,
    write_buffer_bytes: usize,
    direct_io: DirectIo,
}

impl Default for StoreHostBuilder {
    fn default() -> Self {
        Self {
            block_cache_bytes: 256 << 20,
            block_cache: None,
            write_buffer_bytes: 64 << 20,
            direct_io: DirectIo::Auto,
        }
    }
}

impl StoreHostBuilder {
    /// Capacity of the block cache shared by all tenant stores (memtables are charged to it),
    /// when the builder makes the cache itself (on slabs of its own).
    pub fn block_cache_bytes(mut self, bytes: usize) -> Self {
        self.block_cache_bytes = bytes;
        self
    }

    /// Uses `cache` (e.g. one whose slabs the host cache budget also covers).
    pub fn block_cache(mut self, cache: RocksBlockCache) -> Self {
        self.block_cache = Some(cache);
        self
    }

    /// Memtable memory across all tenant stores.
    pub fn write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.write_buffer_bytes = bytes;
        self
    }

    pub fn direct_io(mut self, mode: DirectIo) -> Self {
        self.direct_io = mode;
        self
    }

    pub fn build(self) -> StoreHost {
        let cache = self
            .block_cache
            .unwrap_or_else(|| RocksBlockCache::new(self.block_cache_bytes, &SlabAllocator::new()));
        let write_buffers = CacheChargedWriteBuffers::new(self.write_buffer_bytes, cache.lru());
        StoreHost {
            cache,
            write_buffers,
            direct_io: self.direct_io,
            direct_io_by_fs: Mutex::default(),
            warned_fallback: AtomicBool::new(false),
        }
    }
}

/// Shared resources of all tenant stores in this process.
pub struct StoreHost {
    cache: RocksBlockCache,
    write_buffers: CacheChargedWriteBuffers,
    direct_io: DirectIo,
    /// O_DIRECT support by filesystem (st_dev), as probed.
    direct_io_by_fs: Mutex<HashMap<u64, bool>>,
    warned_fallback: AtomicBool,
}

impl StoreHost {
    pub fn builder() -> StoreHostBuilder {
        StoreHostBuilder::default()
    }

    pub fn block_cache(&self) -> &RocksBlockCache {
        &self.cache
    }

    pub fn block_cache_capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Bytes in use in the shared block cache (blocks plus charged memtables).
    pub fn block_cache_usage(&self) -> usize {
        self.cache.usage()
    }

    /// Decides direct I/O for a store under `dir`: on if configured and the filesystem takes
    /// it. The answer is remembered per filesystem (one probe, not one per tenant). Only a
    /// filesystem that refuses O_DIRECT falls back to buffered I/O; a probe that could not run
    /// (a full disk with nothing to read, an I/O error) is an error, never a fallback.
    pub(crate) fn use_direct_io(&self, dir: &Path) -> std::io::Result<bool> {
        use super::direct_io::{probe, Support};
        if self.direct_io == DirectIo::Off {
            return Ok(false);
        }
        let dev = std::fs::metadata(dir)?.dev();
        let mut known = self
            .direct_io_by_fs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(&on) = known.get(&dev) {
            return Ok(on);
        }
        let on = match probe(dir)? {
            Support::Supported => true,
            Support::Unsupported(e) => {
                if !self.warned_fallback.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        dir = %dir.display(),
                        error = %e,
                        "O_DIRECT is not supported here; tenant stores fall back to buffered I/O \
                         (the page cache will hold a second copy of their data)"
                    );
                }
                false
            }
        };
        known.insert(dev, on);
        Ok(on)
    }

    /// `store` (the store's options) with what file data needs: BlobDB. A block's value is
    /// written to the WAL, then once more into a blob file when its memtable is flushed, and
    /// never again by compaction (only the SSTs of keys and blob references are compacted, so
    /// a sequential write costs about two bytes on disk per byte). Blob files are encrypted by
    /// the store's Env like every other file, read with O_DIRECT, and their values cached in
    /// the shared block cache, one value per slab slot (a 4 KiB block in a 4 KiB slot), under
    /// keys naming their files (`blob_keys`, `file_ids`) if the store has them.
    pub(crate) fn extents_options(
        &self,
        mut store: Options,
        blob_keys: Option<&super::ffi::BlobCacheKeys>,
    ) -> Options {
        store.set_enable_blob_files(true);
        store.set_min_blob_size(MIN_BLOB_BYTES);
        store.set_blob_file_size(256 << 20);
        // File data is compressed by the deeper SST levels' LZ4 no more: blobs are written
        // once, at flush, and most file data does not compress.
        store.set_blob_compression_type(DBCompressionType::None);
        // No blob GC during compactions: it relocated the live values of the oldest blob
        // files whenever a compaction met their keys, which a streaming overwrite does all the
        // time (values it is about to overwrite), and a whole-file overwrite needs none (an
        // old blob file all garbage is deleted as it is). Measured, four 1 GiB write + fsync
        // passes over one file: 409-598 MiB/s after the first with it, 808-885 without, and
        // less disk used (1.16-1.22 GiB against 1.53-1.64). Garbage left in partly live blob
        // files is collected where it warrants it (`volume::blob_gc`).
        store.set_enable_blob_gc(false);
        store.set_blob_compaction_readahead_size(2 << 20);
        let cache = match blob_keys {
            Some(keys) => super::ffi::BlobCache::ByFileId(keys),
            None => super::ffi::BlobCache::Host(self.cache.lru()),
        };
        super::ffi::set_blob_cache(&mut store, &cache);
        store
    }

    /// Options for one tenant store (DB-wide and for each column family).
    pub(crate) fn options(&self, direct_io: bool) -> Options {
        let mut opts = Options::default();
        // Index and filter blocks cached (and charged) too, partitioned, L0's and the top
        // levels pinned; full bloom filters.
        super::ffi::attach_cache(
            &mut opts,
            self.cache.lru(),
            &self.write_buffers,
            &TableSettings {
                bloom_bits_per_key: 10.0,
                format_version: 6,
                // A block plus its 5-byte trailer and the cut-off slack should fit one 4 KiB
                // slab slot (4096 would make most blocks 4.1-5 KiB: 8 KiB slots).
                block_size: 4096 - 160,
            },
        );
        // No compression in L0 and L1: they are rewritten soonest (flush, first compaction),
        // and compressing there costs the write path most (file data is often incompressible).
        // Deeper levels, where data settles, use LZ4 (before encryption, so it still works).
        opts.set_compression_type(DBCompressionType::Lz4);
        opts.set_compression_per_level(&[
            DBCompressionType::None,
            DBCompressionType::None,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
        ]);
        // Table files are loaded at open by the opening thread: with RocksDB's default of 16,
        // each open of a store started and ended about 60 threads (15 per column family),
        // most of a mount's and a wake's cost for a tenant's few files.
        opts.set_max_file_opening_threads(1);
        opts.set_max_background_jobs(2);
        // Two flushes at once (RocksDB gives 2 jobs one flush): a bulk write fills a memtable
        // while the last one is still being encrypted and written, and a single flush thread
        // made the writer stop at two immutable memtables. Measured on a 1 GiB write + fsync:
        // 685-919 MiB/s against 539-644, three runs each. The pools are the process's, shared
        // by every tenant: one more thread in all. Only the legacy pair of settings gives two
        // flushes without more compactions.
        #[allow(deprecated)]
        {
            opts.set_max_background_flushes(2);
            opts.set_max_background_compactions(1);
        }
        // Preallocation sized for many small tenants: RocksDB preallocates the WAL in steps
        // of the memtable budget (64 MiB: an idle tenant held 68 MiB of disk for 92 KiB of
        // files) and the MANIFEST in 4 MiB steps. With a WriteBufferManager given,
        // `db_write_buffer_size` only caps the WAL's step.
        opts.set_db_write_buffer_size(WAL_PREALLOCATION_STEP);
        opts.set_manifest_preallocation_size(MANIFEST_PREALLOCATION_STEP);
        opts.set_bytes_per_sync(1 << 20);
        // RocksDB's info LOG is plaintext: never write it to disk, route warnings to tracing.
        // The callback runs under an `extern "C"` frame, where a panic would abort the whole
        // process: none may leave it (the log writer itself never fails, see `logging`).
        opts.set_info_logger(rocksdb::InfoLogger::new_callback_logger(
            LogLevel::Warn,
            |level, msg| {
                let _ = std::panic::catch_unwind(|| match level {
                    LogLevel::Warn => tracing::warn!(target: "rocksdb", "{}", msg.trim_end()),
                    LogLevel::Error | LogLevel::Fatal => {
                        tracing::error!(target: "rocksdb", "{}", msg.trim_end())
                    }
                    // Header lines (the options dump at open) arrive whatever the level.
                    _ => tracing::trace!(target: "rocksdb", "{}", msg.trim_end()),
                });
            },
        ));
        opts.set_keep_log_file_num(1);
        opts.set_direct_io(direct_io);
        opts
    }
}

trait DirectIoOptions {
    fn set_direct_io(&mut self, on: bool);
}

impl DirectIoOptions for Options {
    fn set_direct_io(&mut self, direct_io: bool) {
        if direct_io {
            self.set_use_direct_reads(true);
            self.set_use_direct_io_for_flush_and_compaction(true);
            super::ffi::set_direct_io_for_compaction_reads(self);
        }
    }
}
