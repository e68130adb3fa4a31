//! What every tenant store in one process shares: one RocksDB block cache, one
//! WriteBufferManager (memtables are charged to that cache, so the host has one memory budget,
//! not one per tenant), and the direct-I/O policy with its one-time fallback warning.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rocksdb::{BlockBasedOptions, Cache, DBCompressionType, LogLevel, Options, WriteBufferManager};

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
#[derive(Clone, Debug)]
pub struct StoreHostBuilder {
    block_cache_bytes: usize,
    write_buffer_bytes: usize,
    direct_io: DirectIo,
}

impl Default for StoreHostBuilder {
    fn default() -> Self {
        Self {
            block_cache_bytes: 256 << 20,
            write_buffer_bytes: 64 << 20,
            direct_io: DirectIo::Auto,
        }
    }
}

impl StoreHostBuilder {
    /// Capacity of the block cache shared by all tenant stores (memtables are charged to it).
    pub fn block_cache_bytes(mut self, bytes: usize) -> Self {
        self.block_cache_bytes = bytes;
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
        let cache = Cache::new_lru_cache(self.block_cache_bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            self.write_buffer_bytes,
            false,
            cache.clone(),
        );
        StoreHost {
            cache,
            write_buffers,
            direct_io: self.direct_io,
            block_cache_bytes: self.block_cache_bytes,
            warned_fallback: AtomicBool::new(false),
        }
    }
}

/// Shared resources of all tenant stores in this process.
pub struct StoreHost {
    cache: Cache,
    write_buffers: WriteBufferManager,
    direct_io: DirectIo,
    block_cache_bytes: usize,
    warned_fallback: AtomicBool,
}

impl StoreHost {
    pub fn builder() -> StoreHostBuilder {
        StoreHostBuilder::default()
    }

    pub fn block_cache_capacity(&self) -> usize {
        self.block_cache_bytes
    }

    /// Bytes in use in the shared block cache (blocks plus charged memtables).
    pub fn block_cache_usage(&self) -> usize {
        self.cache.get_usage()
    }

    /// Decides direct I/O for a store under `dir`: on if configured and the filesystem takes it.
    pub(crate) fn use_direct_io(&self, dir: &Path) -> bool {
        if self.direct_io == DirectIo::Off {
            return false;
        }
        match super::direct_io::probe(dir) {
            Ok(()) => true,
            Err(e) => {
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
        }
    }

    /// Options for one tenant store (DB-wide and for each column family).
    pub(crate) fn options(&self, direct_io: bool) -> Options {
        let mut opts = Options::default();
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_bloom_filter(10.0, false);
        table.set_format_version(6);
        opts.set_block_based_table_factory(&table);
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
        opts.set_write_buffer_manager(&self.write_buffers);
        opts.set_max_background_jobs(2);
        opts.set_bytes_per_sync(1 << 20);
        // RocksDB's info LOG is plaintext: never write it to disk, route warnings to tracing.
        opts.set_info_logger(rocksdb::InfoLogger::new_callback_logger(
            LogLevel::Warn,
            |level, msg| match level {
                LogLevel::Warn => tracing::warn!(target: "rocksdb", "{}", msg.trim_end()),
                LogLevel::Error | LogLevel::Fatal => {
                    tracing::error!(target: "rocksdb", "{}", msg.trim_end())
                }
                // Header lines (the options dump at open) arrive whatever the level.
                _ => tracing::trace!(target: "rocksdb", "{}", msg.trim_end()),
            },
        ));
        opts.set_keep_log_file_num(1);
        if direct_io {
            opts.set_use_direct_reads(true);
            opts.set_use_direct_io_for_flush_and_compaction(true);
            super::ffi::set_direct_io_for_compaction_reads(&mut opts);
        }
        opts
    }
}
