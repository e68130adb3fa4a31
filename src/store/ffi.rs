//! The boundary between RocksDB (C++ shim, `shim.cc`) and Rust.
//!
//! The shim calls the `extern "C"` functions below: to write a new file header, to open one into
//! a cipher, to apply a cipher to a whole buffer, and to free what it was given. It owns two
//! kinds of Rust objects through raw pointers: the tenant key (one per encrypted Env, freed when
//! RocksDB drops the provider) and one `FileCipher` per open file (freed with the file's stream).
//! Nothing here panics across the boundary: errors become non-zero return codes that the shim
//! turns into RocksDB `Status` values.
//!
//! It reports each store's health: a listener the shim puts on the store's options holds one
//! `Arc<StoreHealth>` count and calls back when the store stops taking writes or takes them
//! again; [`resume`] is RocksDB's `DB::Resume`.
//!
//! It attaches the host's RocksDB block cache (`cache::rocks_lru`, made by the shim) to a
//! store's options: the WriteBufferManager charged to it and the table options (rust-rocksdb
//! has no way to take a `Cache` made elsewhere).

use std::ffi::c_void;
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use librocksdb_sys as sys;
use rocksdb::AsRawPtr;

use crate::cache::SlabLruCache;
use crate::crypto::{FileCipher, Keyring};

use super::file_ids::{self, CachedFile, FileIds};
use super::file_key::{self, PREFIX_LEN};
use super::health::StoreHealth;

extern "C" {
    fn tenantfs_encrypted_env_new(key: *mut c_void) -> *mut librocksdb_sys::rocksdb_env_t;
    fn tenantfs_env_rep(env: *const librocksdb_sys::rocksdb_env_t) -> *const c_void;
    fn tenantfs_env_wrapper_size() -> usize;
    fn tenantfs_prefix_length() -> usize;
    fn tenantfs_pipelined_files() -> u64;
    fn tenantfs_options_add_health_listener(
        opts: *mut sys::rocksdb_options_t,
        health: *const c_void,
    );
    fn tenantfs_db_resume(db: *mut sys::rocksdb_t) -> *mut c_char;
    fn tenantfs_db_rewrite_identity(db: *mut sys::rocksdb_t) -> *mut c_char;
    fn tenantfs_db_rewrite_options(db: *mut sys::rocksdb_t) -> *mut c_char;
    #[cfg(test)]
    fn tenantfs_db_max_manifest_file_size(db: *mut sys::rocksdb_t) -> u64;
    fn tenantfs_db_manifest_number(db: *mut sys::rocksdb_t) -> u64;
    fn tenantfs_blob_cache_new(
        host: *const sys::rocksdb_cache_t,
        ids: *const c_void,
    ) -> *mut sys::rocksdb_cache_t;
    fn tenantfs_blob_cache_start(
        cache: *const sys::rocksdb_cache_t,
        db: *mut sys::rocksdb_t,
    ) -> i32;
    #[cfg(test)]
    fn tenantfs_blob_cache_key_for(
        cache: *const sys::rocksdb_cache_t,
        db: *mut sys::rocksdb_t,
        number: u64,
        offset: u64,
        out: *mut c_char,
    ) -> usize;
    fn tenantfs_db_delete_orphan_blob_files(
        db: *mut sys::rocksdb_t,
        bytes: *mut u64,
        err: *mut *mut c_char,
    ) -> i32;
}

/// A WriteBufferManager whose memtable memory is charged to a [`SlabLruCache`].
pub(crate) struct CacheChargedWriteBuffers {
    raw: NonNull<sys::rocksdb_write_buffer_manager_t>,
}

// SAFETY: the WriteBufferManager is internally synchronised; the pointer lives until Drop.
unsafe impl Send for CacheChargedWriteBuffers {}
// SAFETY: as above.
unsafe impl Sync for CacheChargedWriteBuffers {}

impl CacheChargedWriteBuffers {
    pub(crate) fn new(bytes: usize, cache: &SlabLruCache) -> Self {
        // SAFETY: `cache` is live; the manager copies its shared_ptr.
        let raw = unsafe {
            sys::rocksdb_write_buffer_manager_create_with_cache(bytes, cache.raw(), false)
        };
        Self {
            raw: NonNull::new(raw).expect("the C API returns a manager or throws"),
        }
    }
}

impl Drop for CacheChargedWriteBuffers {
    fn drop(&mut self) {
        // SAFETY: made by the C API above; drops only this wrapper's shared_ptr count.
        unsafe { sys::rocksdb_write_buffer_manager_destroy(self.raw.as_ptr()) }
    }
}

/// Block-based table settings of every tenant store.
pub(crate) struct TableSettings {
    pub bloom_bits_per_key: f64,
    pub format_version: i32,
    /// Target size of data blocks and of index/filter partitions.
    pub block_size: usize,
}

/// Puts a block-based table factory on `opts` that caches blocks (and index/filter blocks, L0's
/// pinned) in `cache`, and charges memtables to `cache` through `write_buffers`.
/// `BlockBasedTableOptions::PrepopulateBlockCache::kFlushAndCompaction` (the C API takes the
/// enum's value).
const PREPOPULATE_FLUSH_AND_COMPACTION: i32 = 2;

pub(crate) fn attach_cache(
    opts: &mut rocksdb::Options,
    cache: &SlabLruCache,
    write_buffers: &CacheChargedWriteBuffers,
    table: &TableSettings,
) {
    // SAFETY: every pointer is live for the call; the C API copies the shared_ptrs of the cache
    // and the manager into the options, takes ownership of the filter policy, and copies the
    // table options, which are destroyed right after.
    unsafe {
        let t = sys::rocksdb_block_based_options_create();
        sys::rocksdb_block_based_options_set_block_cache(t, cache.raw());
        sys::rocksdb_block_based_options_set_cache_index_and_filter_blocks(t, 1);
        sys::rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(t, 1);
        sys::rocksdb_block_based_options_set_filter_policy(
            t,
            sys::rocksdb_filterpolicy_create_bloom_full(table.bloom_bits_per_key),
        );
        sys::rocksdb_block_based_options_set_format_version(t, table.format_version);
        sys::rocksdb_block_based_options_set_block_size(t, table.block_size);
        // Cut a block early when the next entry would overflow it and it is half full, so
        // blocks stay under the target (one slab slot) instead of overshooting by an entry.
        sys::rocksdb_block_based_options_set_block_size_deviation(t, 50);
        // Partitioned index and filters: cached in block-size pieces (the top level pinned)
        // instead of one index and one filter block of hundreds of KiB per file, which a
        // small cache would thrash and a slab would hold in a large slot.
        sys::rocksdb_block_based_options_set_index_type(
            t,
            sys::rocksdb_block_based_table_index_type_two_level_index_search as i32,
        );
        sys::rocksdb_block_based_options_set_partition_filters(t, 1);
        sys::rocksdb_block_based_options_set_metadata_block_size(t, table.block_size as u64);
        sys::rocksdb_block_based_options_set_pin_top_level_index_and_filter(t, 1);
        sys::rocksdb_block_based_options_set_cache_index_and_filter_blocks_with_high_priority(t, 1);
        // Blocks a flush or compaction writes go into the cache as they are written: a
        // compaction gives the keys it rewrites new blocks under new cache keys, so without
        // this every block it touched was cold again, read from the disk by the next lookup
        // (metadata and extent references read moments before: a git checkout, writing its
        // work tree while reading its objects, missed on 1,927 object reads of 12,766, and
        // on 285 with it). The outputs hold keys, metadata and blob references, not file data.
        sys::rocksdb_block_based_options_set_prepopulate_block_cache(
            t,
            PREPOPULATE_FLUSH_AND_COMPACTION,
        );
        sys::rocksdb_options_set_block_based_table_factory(opts.as_raw_ptr(), t);
        sys::rocksdb_block_based_options_destroy(t);
        sys::rocksdb_options_set_write_buffer_manager(
            opts.as_raw_ptr(),
            write_buffers.raw.as_ptr(),
        );
    }
}

/// Puts a listener on `opts` that reports the store's stops and resumes to `health`.
pub(crate) fn add_health_listener(opts: &mut rocksdb::Options, health: Arc<StoreHealth>) {
    let health = Arc::into_raw(health).cast::<c_void>();
    // SAFETY: `opts` is alive and exclusively borrowed; the shim's listener takes the count
    // `Arc::into_raw` handed over and gives it back once, through `tenantfs_health_release`,
    // when RocksDB drops the listener (with the last copy of these options or the store).
    unsafe { tenantfs_options_add_health_listener(opts.as_raw_ptr(), health) }
}

/// `DB::Resume`: Ok when the store takes writes (at once if it never stopped).
pub(crate) fn resume(db: &rocksdb::DB) -> Result<(), String> {
    // SAFETY: `db` is open for the call; Resume is thread-safe in RocksDB.
    owned_error(unsafe { tenantfs_db_resume(db.as_raw_ptr()) })
}

/// Writes the store's IDENTITY file again, under the ring's writing key (RocksDB writes it
/// only when it creates the store).
pub(crate) fn rewrite_identity(db: &rocksdb::DB) -> Result<(), String> {
    // SAFETY: `db` is open for the call; the shim reads its id and writes one file through its
    // Env, as RocksDB does at creation.
    owned_error(unsafe { tenantfs_db_rewrite_identity(db.as_raw_ptr()) })
}

/// The store's `max_manifest_file_size` as it is now.
#[cfg(test)]
pub(crate) fn max_manifest_file_size(db: &rocksdb::DB) -> u64 {
    // SAFETY: `db` is open for the call; the shim reads its options.
    unsafe { tenantfs_db_max_manifest_file_size(db.as_raw_ptr()) }
}

/// The number of the MANIFEST the store appends to now (None if RocksDB cannot tell).
pub(crate) fn manifest_number(db: &rocksdb::DB) -> Option<u64> {
    // SAFETY: `db` is open for the call; the shim lists its live files.
    let n = unsafe { tenantfs_db_manifest_number(db.as_raw_ptr()) };
    (n != 0).then_some(n)
}

/// Writes the store's OPTIONS files again (through its Env: under the writing key).
pub(crate) fn rewrite_options(db: &rocksdb::DB) -> Result<(), String> {
    // SAFETY: `db` is open for the call; the shim sets an option to the value it has.
    owned_error(unsafe { tenantfs_db_rewrite_options(db.as_raw_ptr()) })
}

/// Ok for null, else the message of an error the shim allocated with strdup (freed here).
fn owned_error(err: *mut c_char) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated string the shim allocated with strdup; freed once, here.
    unsafe {
        let message = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
        libc::free(err.cast());
        Err(message)
    }
}

/// Deletes the blob files no version of the store references (the partial output of a flush
/// or compaction killed mid-way, which RocksDB keeps forever); returns (files, bytes).
pub(crate) fn delete_orphan_blob_files(db: &rocksdb::DB) -> Result<(u32, u64), String> {
    let mut bytes = 0u64;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: `db` is open for the call; the shim pauses and resumes its background work and
    // only writes the two out-pointers, which are valid locals.
    let n = unsafe { tenantfs_db_delete_orphan_blob_files(db.as_raw_ptr(), &mut bytes, &mut err) };
    if n >= 0 {
        return Ok((n as u32, bytes));
    }
    // SAFETY: a NUL-terminated string the shim allocated with strdup; freed once, here.
    unsafe {
        let message = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
        libc::free(err.cast());
        Err(message)
    }
}

/// Calls `f` with the store health a listener callback passes (nothing when null); no panic
/// leaves the extern "C" function (it would abort the process). A panic in `f` leaves nothing
/// half-changed that the store reads: unwind-safe.
fn with_health(health: *const c_void, f: impl FnOnce(&StoreHealth)) {
    if health.is_null() {
        return;
    }
    // SAFETY: the shim's listener passes the count it holds (handed over by
    // `add_health_listener`, released only with the listener), so the value is alive.
    let health = unsafe { &*health.cast::<StoreHealth>() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(health)));
}

#[no_mangle]
extern "C" fn tenantfs_store_stopped(
    health: *const c_void,
    no_space: i32,
    detail: *const c_char,
    len: usize,
) {
    if detail.is_null() {
        return;
    }
    // SAFETY: the shim passes a buffer of `len` bytes that stays alive for the call.
    let detail = unsafe { std::slice::from_raw_parts(detail.cast::<u8>(), len) };
    with_health(health, |h| {
        h.stopped(no_space != 0, &String::from_utf8_lossy(detail))
    });
}

#[no_mangle]
extern "C" fn tenantfs_store_resumed(health: *const c_void) {
    with_health(health, StoreHealth::resumed);
}

#[no_mangle]
extern "C" fn tenantfs_store_flush_begins(health: *const c_void) {
    with_health(health, StoreHealth::flush_begins);
}

/// A flush or compaction moved `bytes` to or from the disk, in work that began `elapsed_us`
/// ago.
#[no_mangle]
extern "C" fn tenantfs_store_background_io(health: *const c_void, bytes: u64, elapsed_us: u64) {
    with_health(health, |h| {
        let now = std::time::Instant::now();
        let started = now
            .checked_sub(std::time::Duration::from_micros(elapsed_us))
            .unwrap_or(now);
        h.background().report(bytes, started);
    });
}

/// Whether a tenant waited on the disk lately (`foreground`): the store files' writer threads
/// then write in small pieces.
#[no_mangle]
extern "C" fn tenantfs_foreground_io_recent() -> i32 {
    i32::from(super::foreground::recent())
}

/// A lookup missed the block cache: the thread is about to read from the disk
/// ([`crate::serving::will_wait`]).
#[no_mangle]
extern "C" fn tenantfs_will_wait() {
    crate::serving::will_wait();
}

/// Holds a store file's next write while a WAL sync runs (`foreground`), briefly.
#[no_mangle]
extern "C" fn tenantfs_hold_for_syncs() {
    super::foreground::hold_for_syncs();
}

#[no_mangle]
extern "C" fn tenantfs_health_release(health: *const c_void) {
    if !health.is_null() {
        // SAFETY: the count `Arc::into_raw` handed over in `add_health_listener`, released
        // once, by the listener's destructor.
        drop(unsafe { Arc::from_raw(health.cast::<StoreHealth>()) });
    }
}

/// What an encrypted Env's provider holds: the ring its files open under, and the ids of the
/// files whose headers it writes or opens.
struct EnvKeys {
    ring: Arc<Keyring>,
    ids: Arc<FileIds>,
}

/// Builds a RocksDB Env whose files are all encrypted under `ring` (see `file_key`), noting the
/// id of each blob and extent file it writes or opens in `ids`.
pub(crate) fn encrypted_env(ring: Arc<Keyring>, ids: Arc<FileIds>) -> Option<rocksdb::Env> {
    let key = Box::into_raw(Box::new(EnvKeys { ring, ids })).cast::<c_void>();
    // SAFETY: `key` is a valid, uniquely owned Box<EnvKeys> pointer; the shim takes ownership
    // and releases it exactly once through `tenantfs_key_free`, also on its failure path.
    let raw = unsafe { tenantfs_encrypted_env_new(key) };
    if raw.is_null() {
        return None;
    }
    // SAFETY: `raw` is a freshly allocated `rocksdb_env_t` with the layout of RocksDB's c.cc
    // (guarded by tests/store_ffi.rs); ownership passes to the returned Env, which frees it with
    // rocksdb_env_destroy.
    Some(unsafe { rocksdb::Env::from_raw(raw) })
}

/// Sets `use_direct_io_for_compaction_reads`, which RocksDB 11.8's C API has and rust-rocksdb
/// does not wrap.
pub(crate) fn set_direct_io_for_compaction_reads(opts: &mut rocksdb::Options) {
    // SAFETY: `opts` is alive and exclusively borrowed for this call; the C API only sets a
    // bool field on the options it points to.
    unsafe {
        librocksdb_sys::rocksdb_options_set_use_direct_io_for_compaction_reads(
            opts.as_raw_ptr(),
            1,
        );
    }
}

/// Compacts `cf` fully and rewrites every blob file it references (blob GC forced with an age
/// cutoff of 1.0): live blobs move to new files and the old files go. rust-rocksdb's
/// `CompactOptions` does not wrap the blob GC settings. (The C API reports no error for a
/// manual compaction; a failed one shows in the store's health.)
pub(crate) fn compact_with_blob_gc(db: &rocksdb::DB, cf: &rocksdb::ColumnFamily) {
    use rocksdb::AsColumnFamilyRef;
    // BottommostLevelCompaction::kForce and BlobGarbageCollectionPolicy::kForce (options.h).
    const BOTTOMMOST_FORCE: u8 = 2;
    const BLOB_GC_FORCE: i32 = 0;
    // SAFETY: the options are created, used and destroyed here; `db` and `cf` are open for the
    // call, which only reads them.
    unsafe {
        let opts = sys::rocksdb_compactoptions_create();
        sys::rocksdb_compactoptions_set_bottommost_level_compaction(opts, BOTTOMMOST_FORCE);
        sys::rocksdb_compactoptions_set_blob_garbage_collection_policy(opts, BLOB_GC_FORCE);
        sys::rocksdb_compactoptions_set_blob_garbage_collection_age_cutoff(opts, 1.0);
        sys::rocksdb_compact_range_cf_opt(
            db.as_raw_ptr(),
            cf.inner(),
            opts,
            std::ptr::null(),
            0,
            std::ptr::null(),
            0,
        );
        sys::rocksdb_compactoptions_destroy(opts);
    }
}

/// Waits for the flushes and compactions running now to end (`PauseBackgroundWork`, then
/// `ContinueBackgroundWork`): files they opened are closed when it returns.
pub(crate) fn wait_for_running_background_work(db: &rocksdb::DB) -> Result<(), String> {
    for pause in [true, false] {
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `db` is open for the call; `err` is one writable pointer, set to a malloc'd
        // message on failure.
        unsafe {
            if pause {
                sys::rocksdb_pause_background_work(db.as_raw_ptr(), &mut err);
            } else {
                sys::rocksdb_continue_background_work(db.as_raw_ptr(), &mut err);
            }
        }
        if !err.is_null() {
            // SAFETY: a NUL-terminated message the C API malloc'd for us, freed once here.
            let message = unsafe {
                let m = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
                sys::rocksdb_free(err.cast());
                m
            };
            return Err(message);
        }
    }
    Ok(())
}

/// Sets mutable DB-wide options (`DB::SetDBOptions`), which rust-rocksdb does not wrap.
pub(crate) fn set_db_options(db: &rocksdb::DB, opts: &[(&str, &str)]) -> Result<(), String> {
    let owned: Vec<(std::ffi::CString, std::ffi::CString)> = opts
        .iter()
        .map(|(k, v)| {
            (
                std::ffi::CString::new(*k).expect("option names have no NUL"),
                std::ffi::CString::new(*v).expect("option values have no NUL"),
            )
        })
        .collect();
    let keys: Vec<*const c_char> = owned.iter().map(|(k, _)| k.as_ptr()).collect();
    let values: Vec<*const c_char> = owned.iter().map(|(_, v)| v.as_ptr()).collect();
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: `db` is open for the call; `keys` and `values` hold `len` pointers to
    // NUL-terminated strings that outlive the call (the C API copies them into a map);
    // `err` is one writable pointer, set to a malloc'd message on failure.
    unsafe {
        sys::rocksdb_set_db_options(
            db.as_raw_ptr(),
            keys.len() as i32,
            keys.as_ptr(),
            values.as_ptr(),
            &mut err,
        );
    }
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated message the C API malloc'd for us, freed once here.
    let message = unsafe {
        let m = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
        sys::rocksdb_free(err.cast());
        m
    };
    Err(message)
}

/// Makes `cache` the store's blob cache too (rust-rocksdb takes only its own cache type).
pub(crate) fn set_blob_cache(opts: &mut rocksdb::Options, cache: &BlobCache) {
    let raw = match cache {
        BlobCache::Host(c) => c.raw(),
        BlobCache::ByFileId(k) => k.raw.as_ptr(),
    };
    // SAFETY: both pointers are alive for the call; the C API copies the cache's shared_ptr
    // into the options.
    unsafe { sys::rocksdb_options_set_blob_cache(opts.as_raw_ptr(), raw) }
}

/// The blob cache a store's options get.
pub(crate) enum BlobCache<'a> {
    /// The host cache under RocksDB's own keys (the reading session's).
    Host(&'a SlabLruCache),
    /// The host cache under keys naming blob files by id.
    ByFileId(&'a BlobCacheKeys),
}

/// A store's blob cache under file keys (`shim.cc`'s BlobCacheKeys): the host cache, where a
/// blob value is keyed by its file's id (`file_ids`) once [`Self::start`] has run, so stores
/// that share a blob file share its cached values, and a store reopened finds its own again.
pub(crate) struct BlobCacheKeys {
    raw: NonNull<sys::rocksdb_cache_t>,
}

// SAFETY: the handle is only a shared_ptr holder; the cache behind it is internally synchronised
// and the pointer lives until Drop.
unsafe impl Send for BlobCacheKeys {}
// SAFETY: as above.
unsafe impl Sync for BlobCacheKeys {}

impl BlobCacheKeys {
    /// `host`'s view for a store whose file ids are in `ids`; `None` if the shim refused
    /// (`host` is not a cache it made).
    pub(crate) fn new(host: &SlabLruCache, ids: &Arc<FileIds>) -> Option<Self> {
        let count = Arc::into_raw(Arc::clone(ids)).cast::<c_void>();
        // SAFETY: `host` is alive for the call; `count` is one Arc count, which the shim takes
        // (released through `tenantfs_file_ids_release`) only when it returns a cache.
        let raw = unsafe { tenantfs_blob_cache_new(host.raw(), count) };
        match NonNull::new(raw) {
            Some(raw) => Some(Self { raw }),
            None => {
                // SAFETY: the count made above, not taken by the shim.
                drop(unsafe { Arc::from_raw(count.cast::<FileIds>()) });
                None
            }
        }
    }

    /// Keys blob values by file from now on, for the session of `db` (opened with this as its
    /// blob cache); false if RocksDB's keys are not of the shape the shim knows (values are
    /// then cached for this session alone).
    pub(crate) fn start(&self, db: &rocksdb::DB) -> bool {
        // SAFETY: both handles are alive for the call; the shim only reads the DB's ids.
        unsafe { tenantfs_blob_cache_start(self.raw.as_ptr(), db.as_raw_ptr()) == 1 }
    }

    /// The key the host cache is asked for in place of RocksDB's key of blob file `number` at
    /// `offset` in `db`'s session (16 bytes: RocksDB's own, unchanged).
    #[cfg(test)]
    pub(crate) fn key_for(&self, db: &rocksdb::DB, number: u64, offset: u64) -> Vec<u8> {
        let mut out = [0u8; 28];
        // SAFETY: both handles are alive for the call; `out` has the 28 bytes the shim writes
        // at most.
        let n = unsafe {
            tenantfs_blob_cache_key_for(
                self.raw.as_ptr(),
                db.as_raw_ptr(),
                number,
                offset,
                out.as_mut_ptr().cast(),
            )
        };
        out[..n.min(28)].to_vec()
    }
}

impl Drop for BlobCacheKeys {
    fn drop(&mut self) {
        // SAFETY: made by `tenantfs_blob_cache_new`, destroyed once; options that hold the
        // cache keep their own shared_ptr.
        unsafe { sys::rocksdb_cache_destroy(self.raw.as_ptr()) }
    }
}

#[no_mangle]
extern "C" fn tenantfs_blob_cache_key(
    ids: *const c_void,
    number: u64,
    offset: u64,
    out: *mut c_char,
) -> i32 {
    if ids.is_null() || out.is_null() {
        return -1;
    }
    // SAFETY: the shim's blob cache passes the count it holds (handed over in
    // `BlobCacheKeys::new`, released only with the cache), so the value is alive.
    let ids = unsafe { &*ids.cast::<FileIds>() };
    let Some(id) = ids.get(CachedFile::Blob, number) else {
        return 1;
    };
    let key = file_ids::cache_key(CachedFile::Blob, &id, offset);
    // SAFETY: the shim passes a buffer of 28 bytes (`kKeyLength`), exclusively ours.
    unsafe { std::ptr::copy_nonoverlapping(key.as_ptr(), out.cast::<u8>(), key.len()) };
    0
}

#[no_mangle]
extern "C" fn tenantfs_file_ids_release(ids: *const c_void) {
    if !ids.is_null() {
        // SAFETY: the count `Arc::into_raw` handed over in `BlobCacheKeys::new`, released
        // once, by the cache's destructor.
        drop(unsafe { Arc::from_raw(ids.cast::<FileIds>()) });
    }
}

/// Walks the keys of `cf` in `[start, end)` without reading values from blob files: the
/// iterator is made with `allow_unprepared_value`, so a blob value is never fetched
/// (rust-rocksdb's ReadOptions cannot set it). With `with_values`, `f` also gets each value
/// stored inline (`None` for one in a blob file).
pub(crate) fn scan(
    db: &rocksdb::DB,
    cf: &rocksdb::ColumnFamily,
    start: &[u8],
    end: &[u8],
    with_values: bool,
    mut f: impl FnMut(&[u8], Option<&[u8]>) -> bool,
) -> Result<(), String> {
    use rocksdb::AsColumnFamilyRef;
    struct Guard {
        opts: *mut sys::rocksdb_readoptions_t,
        iter: *mut sys::rocksdb_iterator_t,
    }
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: both were created below, are destroyed once, here, iterator first (it
            // refers to the options' upper bound).
            unsafe {
                if !self.iter.is_null() {
                    sys::rocksdb_iter_destroy(self.iter);
                }
                sys::rocksdb_readoptions_destroy(self.opts);
            }
        }
    }
    // SAFETY: the options and iterator are used only in this function and freed by `Guard`;
    // `end` outlives both (the C API keeps a pointer to the upper bound's bytes, not a copy);
    // `db` and `cf` are open for the call; key and value slices are used before the next step.
    unsafe {
        let mut g = Guard {
            opts: sys::rocksdb_readoptions_create(),
            iter: std::ptr::null_mut(),
        };
        sys::rocksdb_readoptions_set_allow_unprepared_value(g.opts, 1);
        sys::rocksdb_readoptions_set_iterate_upper_bound(g.opts, end.as_ptr().cast(), end.len());
        g.iter = sys::rocksdb_create_iterator_cf(db.as_raw_ptr(), g.opts, cf.inner());
        sys::rocksdb_iter_seek(g.iter, start.as_ptr().cast(), start.len());
        while sys::rocksdb_iter_valid(g.iter) != 0 {
            let mut len = 0usize;
            let k = sys::rocksdb_iter_key(g.iter, &mut len);
            let k = std::slice::from_raw_parts(k.cast::<u8>(), len);
            // With unprepared values, a value in a blob file reads as empty until prepared;
            // inline values are there at once (RocksDB's DBIter), and no stored value is empty.
            let mut vlen = 0usize;
            let v = if with_values {
                let v = sys::rocksdb_iter_value(g.iter, &mut vlen);
                Some(std::slice::from_raw_parts(v.cast::<u8>(), vlen)).filter(|v| !v.is_empty())
            } else {
                None
            };
            if !f(k, v) {
                break;
            }
            sys::rocksdb_iter_next(g.iter);
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        sys::rocksdb_iter_get_error(g.iter, &mut err);
        if !err.is_null() {
            let message = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
            libc::free(err.cast());
            return Err(message);
        }
    }
    Ok(())
}

/// Facts about the shim that the layout test checks against the C API.
pub(crate) struct ShimLayout {
    pub wrapper_size: usize,
    pub prefix_length: usize,
}

pub(crate) fn shim_layout() -> ShimLayout {
    // SAFETY: both functions only return constants.
    unsafe {
        ShimLayout {
            wrapper_size: tenantfs_env_wrapper_size(),
            prefix_length: tenantfs_prefix_length(),
        }
    }
}

/// Files written through `pipelined_writes.cc` since the process started (for tests).
pub(crate) fn pipelined_files() -> u64 {
    // SAFETY: reads an atomic counter.
    unsafe { tenantfs_pipelined_files() }
}

/// The `Env*` inside an env wrapper (for the layout test).
pub(crate) fn env_rep(env: &rocksdb::Env) -> *const c_void {
    // SAFETY: the pointer comes from a live Env and is only read by the shim.
    unsafe { tenantfs_env_rep(env.as_raw_ptr()) }
}

/// The path the shim passes (`len` bytes at `name`, alive for the call).
///
/// # Safety
/// `name` points to `len` readable bytes (or is null).
// SAFETY: an `unsafe fn` only for its callers' promise above; both callers pass the shim's
// file name buffer, alive for their call.
unsafe fn path_of<'a>(name: *const c_char, len: usize) -> &'a std::path::Path {
    use std::os::unix::ffi::OsStrExt;
    if name.is_null() {
        return std::path::Path::new("");
    }
    // SAFETY: as the caller promises.
    let bytes = unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) };
    std::path::Path::new(std::ffi::OsStr::from_bytes(bytes))
}

#[no_mangle]
extern "C" fn tenantfs_prefix_create(
    key: *const c_void,
    name: *const c_char,
    name_len: usize,
    prefix: *mut c_char,
    len: usize,
) -> i32 {
    if key.is_null() || prefix.is_null() || len != PREFIX_LEN {
        return -1;
    }
    // SAFETY: the shim passes the EnvKeys it owns (alive for the provider's lifetime), the
    // file's name (`name_len` bytes, alive for the call) and a writable buffer of `len` bytes
    // that RocksDB allocated for the prefix.
    let (key, path, out) = unsafe {
        (
            &*key.cast::<EnvKeys>(),
            path_of(name, name_len),
            std::slice::from_raw_parts_mut(prefix.cast::<u8>(), len),
        )
    };
    match file_key::new_prefix(&key.ring, out) {
        Ok(_) => {
            key.ids.note_header(path, out);
            // Crash tests learn here that RocksDB started a new file (a flush or compaction).
            fail::fail_point!("store-file-created");
            0
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot create a file key header");
            -1
        }
    }
}

#[no_mangle]
extern "C" fn tenantfs_stream_open(
    key: *const c_void,
    name: *const c_char,
    name_len: usize,
    prefix: *const c_char,
    len: usize,
    cipher_out: *mut *mut c_void,
) -> i32 {
    if key.is_null() || prefix.is_null() || cipher_out.is_null() {
        return -1;
    }
    // SAFETY: as in `tenantfs_prefix_create`; `prefix` points to `len` readable bytes that
    // RocksDB read from (or just wrote to) the file, and `cipher_out` to one writable pointer.
    let (key, path, prefix) = unsafe {
        (
            &*key.cast::<EnvKeys>(),
            path_of(name, name_len),
            std::slice::from_raw_parts(prefix.cast::<u8>(), len),
        )
    };
    match file_key::open_prefix(&key.ring, prefix) {
        Ok(cipher) => {
            key.ids.note_header(path, prefix);
            // SAFETY: `cipher_out` is valid for one write (checked non-null above).
            unsafe { *cipher_out = Box::into_raw(Box::new(cipher)).cast() };
            0
        }
        Err(e) => {
            tracing::warn!(error = %e, "a store file's key header did not open");
            -1
        }
    }
}

#[no_mangle]
extern "C" fn tenantfs_cipher_apply(
    cipher: *const c_void,
    offset: u64,
    data: *mut c_char,
    len: usize,
) -> i32 {
    if cipher.is_null() || (data.is_null() && len > 0) {
        return -1;
    }
    if len == 0 {
        return 0;
    }
    // SAFETY: `cipher` is a FileCipher created by `tenantfs_stream_open` and not yet freed (the
    // stream that owns it is alive); `data` is RocksDB's buffer of `len` bytes, exclusively ours
    // for this call.
    let (cipher, data) = unsafe {
        (
            &*cipher.cast::<FileCipher>(),
            std::slice::from_raw_parts_mut(data.cast::<u8>(), len),
        )
    };
    // Crash tests stop a process here: in the middle of a store file's read or write.
    fail::fail_point!("store-cipher");
    cipher.apply(offset, data);
    0
}

#[no_mangle]
extern "C" fn tenantfs_cipher_free(cipher: *mut c_void) {
    if !cipher.is_null() {
        // SAFETY: created by Box::into_raw in `tenantfs_stream_open`; the shim frees it once.
        drop(unsafe { Box::from_raw(cipher.cast::<FileCipher>()) });
    }
}

#[no_mangle]
extern "C" fn tenantfs_key_free(key: *mut c_void) {
    if !key.is_null() {
        // SAFETY: created by Box::into_raw in `encrypted_env`; the shim frees it once.
        drop(unsafe { Box::from_raw(key.cast::<EnvKeys>()) });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn compaction_reads_direct_io_is_set() {
        use rocksdb::AsRawPtr;
        let mut opts = rocksdb::Options::default();
        let get = |o: &rocksdb::Options| {
            // SAFETY: `o` is alive for the call; the getter only reads a bool.
            unsafe {
                librocksdb_sys::rocksdb_options_get_use_direct_io_for_compaction_reads(
                    o.as_raw_ptr(),
                )
            }
        };
        assert_eq!(get(&opts), 0);
        super::set_direct_io_for_compaction_reads(&mut opts);
        assert_eq!(get(&opts), 1);
    }
}
