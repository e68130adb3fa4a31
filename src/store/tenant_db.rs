//! One tenant's RocksDB instance, encrypted at rest.
//!
//! Every file RocksDB writes for the tenant (SST, WAL, MANIFEST, OPTIONS, CURRENT, IDENTITY)
//! goes through the tenant's encrypted Env (`ffi::encrypted_env`). The store has four column
//! families for the filesystem model built on top of it; every error names the tenant.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, WriteBatch, DB};

use super::activity::{FirstPut, WriteActivity};
use super::extent_io::EnvPtr;
use super::extent_span::ExtentSpan;
use super::extents::{ExtentFileStats, ExtentFiles};
use super::ffi::BlobCacheKeys;
use super::file_ids::FileIds;
use super::health::{StoreHealth, StoreState};
use super::host::StoreHost;
use super::StoreError;
use crate::crypto::Keyring;

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// The column families of a tenant store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// inode number -> attributes
    Inodes,
    /// (parent inode, name) -> child inode and type
    Dirents,
    /// (inode, block index) -> private block or base block reference
    Extents,
    /// counters, volume settings, format version
    Meta,
}

impl Family {
    pub const ALL: [Family; 4] = [
        Family::Inodes,
        Family::Dirents,
        Family::Extents,
        Family::Meta,
    ];

    fn name(self) -> &'static str {
        match self {
            Family::Inodes => "inodes",
            Family::Dirents => "dirents",
            Family::Extents => "extents",
            Family::Meta => "meta",
        }
    }
}

/// How the store's files are protected at rest.
pub enum Encryption {
    /// Every file sealed under a key of this ring, new ones under its writing key (the only
    /// mode tenants use; the ring may change while the store is open: a rotation).
    Tenant(Arc<Keyring>),
    /// No encryption: exists only so benchmarks can measure what encryption costs.
    PlaintextForBenchmarks,
}

impl Encryption {
    /// Every file sealed under `key` alone (a ring of one key: stores no tenant record
    /// describes, such as a benchmark's).
    pub fn of_key(key: crate::crypto::TenantKey) -> Self {
        Encryption::Tenant(Arc::new(Keyring::single(crate::crypto::KeyId::FIRST, key)))
    }
}

/// Whether to create the store if it does not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    Create,
    Existing,
}

/// A stopped store is resumed only when its filesystem has room for its unflushed writes (the
/// recovery flush writes them out) plus this margin (a new WAL, the MANIFEST). An attempt with
/// less would fail again, and each failed one leaves another memtable behind.
const RESUME_MARGIN: u64 = 2 << 20;

/// An open tenant store.
pub struct TenantDb {
    db: DB,
    tenant: String,
    path: PathBuf,
    direct_io: bool,
    health: Arc<StoreHealth>,
    /// A write skipped the WAL since the last sync (see [`TenantDb::write_unlogged`]).
    unlogged: AtomicBool,
    /// Writes since open: the put before the first, when the last was (see `activity`).
    activity: WriteActivity,
    /// Bulk data beside the store (declared before `env`: it is dropped first).
    extents: Arc<ExtentFiles>,
    /// The store's blob cache under file keys (none for plaintext benchmarks); the store's
    /// options hold a count of their own, this one is for tests.
    #[cfg_attr(not(test), allow(dead_code))]
    blob_keys: Option<BlobCacheKeys>,
    /// The encrypted Env the store and its extent files use (none for plaintext benchmarks).
    _env: Option<rocksdb::Env>,
    /// The MANIFEST's size limits while key rotations move the store to new files.
    manifest_roll: super::manifest_roll::ManifestRoll,
}

impl Drop for TenantDb {
    fn drop(&mut self) {
        // Before the store closes (and flushes what skipped the WAL): the bytes its values name.
        if let Err(e) = self.extents.close() {
            tracing::error!(error = %e, "cannot sync extent files at close");
        }
    }
}

/// A store's MANIFEST size limits, held lowered ([`TenantDb::lower_manifest_limits`]) until
/// this is dropped (after [`TenantDb::start_new_files`] has switched the memtable).
#[must_use = "lowered for start_new_files"]
pub struct ManifestLimitsLowered<'a> {
    db: &'a TenantDb,
    switched: bool,
}

impl Drop for ManifestLimitsLowered<'_> {
    fn drop(&mut self) {
        self.db.manifest_roll.release(&self.db.db, self.switched);
    }
}

/// What a store's blob files hold ([`TenantDb::blob_space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobSpace {
    pub bytes: u64,
    pub garbage: u64,
}

/// Free and total bytes of the filesystem holding `tenant`'s store at `path` (see
/// [`TenantDb::disk_space`]; also for a store that is closed).
pub fn disk_space_at(tenant: &str, path: &Path) -> Result<(u64, u64), StoreError> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| StoreError::Io {
        tenant: tenant.to_owned(),
        path: path.to_owned(),
        source: e.into(),
    })?;
    let frag = st.fragment_size() as u64;
    Ok((
        st.blocks_available() as u64 * frag,
        st.blocks() as u64 * frag,
    ))
}

impl TenantDb {
    /// Opens (or creates) the store at `path` for `tenant`.
    pub fn open(
        host: &StoreHost,
        tenant: &str,
        path: &Path,
        encryption: Encryption,
        mode: OpenMode,
    ) -> Result<Self, StoreError> {
        let err = |source: rocksdb::Error| StoreError::from_rocksdb(tenant, "open", source);
        if mode == OpenMode::Existing && !path.join("CURRENT").exists() {
            return Err(StoreError::Missing {
                tenant: tenant.to_owned(),
                path: path.to_owned(),
            });
        }
        if mode == OpenMode::Create {
            std::fs::create_dir_all(path).map_err(|source| StoreError::io(tenant, path, source))?;
        }
        let direct_io = host
            .use_direct_io(path)
            .map_err(|source| StoreError::io(tenant, path, source))?;
        let mut opts = host.options(direct_io);
        // Blob and extent files are cached under their ids (`file_ids`), which only encrypted
        // files have: a store of plaintext caches them under keys of its own.
        let ids = Arc::new(FileIds::default());
        let (env, key, blob_keys) = match encryption {
            Encryption::Tenant(key) => {
                let extents_key = Arc::clone(&key);
                let env = super::ffi::encrypted_env(key, Arc::clone(&ids)).ok_or_else(|| {
                    StoreError::Env {
                        tenant: tenant.to_owned(),
                    }
                })?;
                opts.set_env(&env);
                let blob_keys = BlobCacheKeys::new(host.block_cache().lru(), &ids);
                (Some(env), Some(extents_key), blob_keys)
            }
            Encryption::PlaintextForBenchmarks => (None, None, None),
        };
        let extents = Arc::new(ExtentFiles::open(
            tenant,
            path.join("extents"),
            EnvPtr::of(env.as_ref()),
            key.map(|k| (k, ids)),
            direct_io,
            host.block_cache().clone(),
        )?);
        let health = Arc::new(StoreHealth::new(tenant));
        let barrier = Arc::downgrade(&extents);
        health.set_flush_barrier(move || {
            if let Some(extents) = barrier.upgrade() {
                if let Err(e) = extents.sync() {
                    tracing::error!(error = %e, "cannot sync extent files before a flush");
                }
            }
        });
        super::ffi::add_health_listener(&mut opts, health.clone());
        opts.create_if_missing(mode == OpenMode::Create);
        opts.create_missing_column_families(mode == OpenMode::Create);
        let families = Family::ALL.iter().map(|f| {
            let family_opts = match f {
                Family::Extents => host.extents_options(opts.clone(), blob_keys.as_ref()),
                _ => opts.clone(),
            };
            ColumnFamilyDescriptor::new(f.name(), family_opts)
        });
        let db = DB::open_cf_descriptors(&opts, path, families).map_err(err)?;
        tracing::debug!(tenant, direct_io, path = %path.display(), "opened tenant store");
        if blob_keys.as_ref().is_some_and(|k| !k.start(&db)) {
            tracing::warn!(
                tenant,
                "RocksDB's blob cache keys are not of the shape tenantfs knows (a RocksDB \
                 upgrade?): this store's blob values are cached for it alone, not shared \
                 with its forks"
            );
        }
        // A flush or compaction killed mid-way leaves a blob file nothing references.
        match super::ffi::delete_orphan_blob_files(&db) {
            Ok((0, _)) => {}
            Ok((files, bytes)) => tracing::info!(
                tenant,
                files,
                bytes,
                "deleted the partial blob files of an interrupted flush or compaction"
            ),
            Err(e) => tracing::warn!(tenant, error = %e, "cannot look for orphaned blob files"),
        }
        Ok(Self {
            db,
            tenant: tenant.to_owned(),
            path: path.to_owned(),
            direct_io,
            health,
            unlogged: AtomicBool::new(false),
            activity: WriteActivity::new(),
            extents,
            blob_keys,
            _env: env,
            manifest_roll: Default::default(),
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this store reads and writes with O_DIRECT (false after a fallback).
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    fn cf(&self, family: Family) -> &ColumnFamily {
        self.db
            .cf_handle(family.name())
            .expect("every family is created at open")
    }

    pub fn get(&self, family: Family, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db
            .get_cf(self.cf(family), key)
            .map_err(|e| StoreError::from_rocksdb(&self.tenant, "read", e))
    }

    /// Point lookups of several keys (sorted ascending) in one batched call: each key uses the
    /// bloom filters, unlike an iterator, which must visit every overlapping file. `f` gets each
    /// key's index and value, for the keys that exist.
    pub fn multi_get(
        &self,
        family: Family,
        sorted_keys: &[impl AsRef<[u8]>],
        mut f: impl FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        let results = self.db.batched_multi_get_cf(
            self.cf(family),
            sorted_keys.iter().map(AsRef::as_ref),
            true,
        );
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(Some(v)) => f(i, &v),
                Ok(None) => {}
                Err(e) => return Err(StoreError::from_rocksdb(&self.tenant, "read", e)),
            }
        }
        Ok(())
    }

    /// False when `key` is surely absent from `family`; true when it may exist. Memtables,
    /// bloom filters and the block cache only: never a disk read.
    pub fn may_exist(&self, family: Family, key: &[u8]) -> bool {
        self.db.key_may_exist_cf(self.cf(family), key)
    }

    pub fn put(&self, family: Family, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let mut batch = self.batch();
        batch.put(family, key, value);
        self.write(batch)
    }

    /// Up to `limit` entries of `family` from `start` in key order.
    pub fn scan(
        &self,
        family: Family,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.db
            .iterator_cf(
                self.cf(family),
                IteratorMode::From(start, Direction::Forward),
            )
            .take(limit)
            .map(|item| {
                item.map(|(k, v)| (k.into_vec(), v.into_vec()))
                    .map_err(|e| StoreError::from_rocksdb(&self.tenant, "read", e))
            })
            .collect()
    }

    /// Calls `f` for each entry of `family` with `start <= key < end`, in key order, until `f`
    /// returns false.
    pub fn range(
        &self,
        family: Family,
        start: &[u8],
        end: &[u8],
        f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.range_with_readahead(family, start, end, 0, f)
    }

    /// [`Self::range`] for a caller that knows it will read about `readahead` bytes: the
    /// store fetches that much in one read instead of growing readahead from 8 KiB (each call
    /// is a new iterator, so RocksDB's automatic readahead would start over every time).
    pub fn range_with_readahead(
        &self,
        family: Family,
        start: &[u8],
        end: &[u8],
        readahead: usize,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_iterate_upper_bound(end.to_vec());
        if readahead > 0 {
            opts.set_readahead_size(readahead);
        }
        let mut it = self.db.raw_iterator_cf_opt(self.cf(family), opts);
        it.seek(start);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !f(k, v) {
                return Ok(());
            }
            it.next();
        }
        it.status()
            .map_err(|e| StoreError::from_rocksdb(&self.tenant, "read", e))
    }

    /// Calls `f` with each key of `family` with `start <= key < end`, in key order, until `f`
    /// returns false. Values are not read: a key whose value lives in a blob file costs no
    /// blob read (a scan of [`Self::range`] would fetch every block of a file it walks).
    pub fn keys(
        &self,
        family: Family,
        start: &[u8],
        end: &[u8],
        f: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let mut f = f;
        super::ffi::scan(&self.db, self.cf(family), start, end, false, |k, _| f(k))
            .map_err(|detail| StoreError::from_detail(&self.tenant, "read", detail))
    }

    /// The greatest key in `family`, if any.
    pub fn last_key(&self, family: Family) -> Result<Option<Vec<u8>>, StoreError> {
        let mut it = self.db.raw_iterator_cf(self.cf(family));
        it.seek_to_last();
        if it.valid() {
            return Ok(it.key().map(<[u8]>::to_vec));
        }
        it.status()
            .map(|()| None)
            .map_err(|e| StoreError::from_rocksdb(&self.tenant, "read", e))
    }

    /// Bytes of the extents family's blob files, and how many of them are garbage (values
    /// overwritten or deleted, as far as compaction has found).
    pub fn blob_space(&self) -> BlobSpace {
        let prop = |name: &str| {
            self.db
                .property_int_value_cf(self.cf(Family::Extents), name)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        BlobSpace {
            bytes: prop("rocksdb.live-blob-file-size"),
            garbage: prop("rocksdb.live-blob-file-garbage-size"),
        }
    }

    /// How many blob files the store's current version references (a blob file in its
    /// directory beyond these is an orphan).
    pub fn blob_file_count(&self) -> u64 {
        self.db
            .property_int_value_cf(self.cf(Family::Extents), "rocksdb.num-blob-files")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Bytes in memtables (active and immutable) that no SST holds yet.
    pub fn unflushed_bytes(&self) -> u64 {
        Family::ALL
            .iter()
            .filter_map(|f| {
                self.db
                    .property_int_value_cf(self.cf(*f), "rocksdb.cur-size-all-mem-tables")
                    .ok()
                    .flatten()
            })
            .sum()
    }

    /// Bytes of free space on the filesystem holding the store, and its total size.
    pub fn disk_space(&self) -> Result<(u64, u64), StoreError> {
        disk_space_at(&self.tenant, &self.path)
    }

    /// A batch of changes applied atomically by [`Self::write`].
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            db: self,
            inner: WriteBatch::default(),
            written: Vec::new(),
        }
    }

    /// [`Self::batch`] with room for `bytes` of keys and values, so that a batch of bulk data
    /// is built in one allocation instead of growing (and copying itself) as it fills.
    pub fn batch_with_capacity(&self, bytes: usize) -> Batch<'_> {
        Batch {
            db: self,
            inner: WriteBatch::with_capacity_bytes(bytes),
            written: Vec::new(),
        }
    }

    pub fn write(&self, batch: Batch<'_>) -> Result<(), StoreError> {
        self.resume_if_stopped()?;
        self.before_write()?;
        let Batch { inner, written, .. } = batch;
        self.db
            .write(inner)
            .map_err(|e| self.write_error("write", e))?;
        self.activity.wrote();
        written.into_iter().for_each(|f| f());
        Ok(())
    }

    /// Puts `value` at `key` of `family` in a logged write of its own just before the next
    /// write of any kind (see `activity`): nothing written after it is durable without it.
    pub fn put_before_first_write(&self, family: Family, key: &[u8], value: &[u8]) {
        self.activity.put_before_first_write(FirstPut {
            family,
            key: key.to_vec(),
            value: value.to_vec(),
        });
    }

    /// Whether anything was written since the store opened.
    pub fn written_since_open(&self) -> bool {
        self.activity.written_since_open()
    }

    fn before_write(&self) -> Result<(), StoreError> {
        self.activity.before_write(|first| {
            let mut b = rocksdb::WriteBatch::default();
            b.put_cf(self.cf(first.family), &first.key, &first.value);
            self.db.write(b).map_err(|e| self.write_error("write", e))
        })
    }

    /// Flushes the memtables, without waiting, if the store wrote and then nothing for
    /// `idle`: what they hold goes to disk and their charge to the host cache is given back.
    /// Whether it started a flush.
    pub fn flush_if_idle(&self, idle: std::time::Duration) -> bool {
        if !self.activity.take_idle(idle) {
            return false;
        }
        let cfs: Vec<_> = Family::ALL.iter().map(|f| self.cf(*f)).collect();
        let mut opts = rocksdb::FlushOptions::default();
        opts.set_wait(false);
        match self.db.flush_cfs_opt(&cfs, &opts) {
            Ok(()) => true,
            Err(e) => {
                self.activity.flush_failed();
                tracing::warn!(tenant = %self.tenant, error = %e, "idle flush failed");
                false
            }
        }
    }

    /// [`Self::write`] without the WAL: for bulk data, which would otherwise be written twice
    /// (WAL, then blob file at flush). The batch is durable once its memtable is flushed:
    /// [`Self::sync`] flushes when such a write came since the last one, and a clean close
    /// flushes too. A crash before either loses the batch whole, never part of it (a batch
    /// lands in one memtable, and a flush takes whole memtables); callers keep such a batch
    /// to one family, whose state may then trail the others' after a crash.
    pub fn write_unlogged(&self, batch: Batch<'_>) -> Result<(), StoreError> {
        self.write_without_wal(batch)?;
        // Marked after the write: a sync that clears the mark before this write landed sees
        // it set again, so the write is never left out of both that flush and the next.
        self.unlogged.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes a batch that changes how data is laid out but not what it reads as (a merge of
    /// block keys into their chunk): without the WAL, like [`Self::write_unlogged`], and
    /// without making the next sync flush for it. A crash before the next flush loses the
    /// batch whole, and the layout it replaced, still in the WAL or on disk, reads the same;
    /// so a logged write after it must not leave out a delete because this batch had done it
    /// (the volume's writes delete unconditionally).
    pub fn write_relayout(&self, batch: Batch<'_>) -> Result<(), StoreError> {
        self.write_without_wal(batch)
    }

    fn write_without_wal(&self, batch: Batch<'_>) -> Result<(), StoreError> {
        self.resume_if_stopped()?;
        self.before_write()?;
        let mut opts = rocksdb::WriteOptions::default();
        opts.disable_wal(true);
        let Batch { inner, written, .. } = batch;
        self.db
            .write_opt(inner, &opts)
            .map_err(|e| self.write_error("write", e))?;
        self.activity.wrote();
        written.into_iter().for_each(|f| f());
        Ok(())
    }

    /// Makes every write so far durable: syncs the WAL, after flushing the memtables if a
    /// write skipped the WAL since the last sync.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.resume_if_stopped()?;
        if self.unlogged.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.flush() {
                self.unlogged.store(true, Ordering::Release);
                return Err(e);
            }
        }
        super::foreground::note();
        crate::serving::will_wait();
        // Spans before the WAL that names them (see `extents`).
        self.extents.sync()?;
        let _syncing = super::foreground::syncing();
        self.db
            .flush_wal(true)
            .map_err(|e| self.write_error("sync", e))
    }

    /// Hands bulk bytes to the store's extent files (see [`ExtentFiles::append`]); a full disk
    /// makes the store read-only until there is room again, as a failed write does.
    pub fn write_extents(&self, data: &[u8], piece: usize) -> Result<Vec<ExtentSpan>, StoreError> {
        self.resume_if_stopped()?;
        self.extents.append(data, piece).inspect_err(|e| {
            if let StoreError::NoSpace { detail, .. } = e {
                self.health.stopped(true, detail);
            }
        })
    }

    /// Writes a checkpoint of the store into `target` (a new directory on the store's
    /// filesystem): the store as it is, sharing its immutable files (`checkpoint`). It opens
    /// as a store of its own, under the same key.
    pub fn checkpoint(&self, target: &Path) -> Result<(), StoreError> {
        // A write that skipped the WAL is in a memtable only: the checkpoint must flush it
        // rather than copy the WAL.
        let unlogged = self.unlogged.load(Ordering::Acquire);
        super::checkpoint::create(&self.db, &self.tenant, &self.extents, target, unlogged)
    }

    /// Writes a copy of the checkpoint at `source` (one [`Self::checkpoint`] wrote, never
    /// opened) into `target`: a store of its own that shares the checkpoint's immutable
    /// files, for tenant `tenant` (named in errors). `source` is not changed.
    pub fn copy_checkpoint(tenant: &str, source: &Path, target: &Path) -> Result<(), StoreError> {
        super::checkpoint::copy(tenant, source, target)
    }

    /// This store's extent files: bulk data written beside RocksDB (see `extents`).
    pub fn extent_files(&self) -> &ExtentFiles {
        &self.extents
    }

    pub fn extent_file_stats(&self) -> ExtentFileStats {
        self.extents.stats()
    }

    /// Calls `f` with each entry of `family` with `start <= key < end` in key order, until
    /// `f` returns false, with the value if it is stored inline in an SST or memtable (`None`
    /// for a value in a blob file, which is not read).
    pub fn inline_values(
        &self,
        family: Family,
        start: &[u8],
        end: &[u8],
        f: impl FnMut(&[u8], Option<&[u8]>) -> bool,
    ) -> Result<(), StoreError> {
        super::ffi::scan(&self.db, self.cf(family), start, end, true, f)
            .map_err(|detail| StoreError::from_detail(&self.tenant, "read", detail))
    }

    /// A failed write's error; a full disk also marks the store (the listener may not have:
    /// RocksDB reports some write failures to the caller only).
    fn write_error(&self, op: &'static str, e: rocksdb::Error) -> StoreError {
        let err = StoreError::from_rocksdb(&self.tenant, op, e);
        if let StoreError::NoSpace { detail, .. } = &err {
            self.health.stopped(true, detail);
        }
        err
    }

    /// A store stopped for lack of space takes writes again once there is room; until then
    /// every write and sync is refused (extent files fail their own writes with ENOSPC while
    /// RocksDB may still take a small one).
    fn resume_if_stopped(&self) -> Result<(), StoreError> {
        if self.health.is_no_space() && !self.try_resume() {
            return Err(StoreError::NoSpace {
                tenant: self.tenant.clone(),
                detail: "the store is read-only until its filesystem has room again".into(),
            });
        }
        Ok(())
    }

    /// Where the disk work done for the tenant in the background is reported (its flushes
    /// and compactions report there by themselves).
    pub fn background(&self) -> &super::BackgroundWork {
        self.health.background()
    }

    /// Whether the store takes writes: writable, read-only for lack of space, or failed.
    pub fn state(&self) -> StoreState {
        self.health.state()
    }

    /// Resumes a store that stopped because its filesystem filled up, once that filesystem
    /// has room again (at most one attempt a second). True if the store takes writes now.
    /// Writes call it on a stopped store, and the daemon calls it for its idle mounts.
    pub fn try_resume(&self) -> bool {
        if !self.health.is_no_space() {
            return matches!(self.health.state(), StoreState::Writable);
        }
        if !self.health.resume_due() {
            return false;
        }
        let Ok((free, _)) = self.disk_space() else {
            return false;
        };
        let needs = self.unflushed_bytes() + RESUME_MARGIN;
        self.health.space(free, needs);
        if free < needs {
            return false;
        }
        match super::ffi::resume(&self.db) {
            Ok(()) => {
                self.health.resumed();
                true
            }
            Err(e) => {
                tracing::debug!(tenant = %self.tenant, error = %e, "resume failed; will retry");
                false
            }
        }
    }

    /// Lowers the MANIFEST's size limits, so that its next edit starts a new MANIFEST, for
    /// [`Self::start_new_files`] (`manifest_roll`). They are raised back by
    /// [`Self::raise_manifest_limits`] once the returned value is gone and the store has
    /// moved to a new MANIFEST. (About 5 ms: RocksDB writes its OPTIONS file again; a fork
    /// does it while its checkpoint is taken.)
    pub fn lower_manifest_limits(&self) -> Result<ManifestLimitsLowered<'_>, StoreError> {
        self.manifest_roll
            .lower(&self.db)
            .map_err(|detail| StoreError::from_detail(&self.tenant, "set options", detail))?;
        Ok(ManifestLimitsLowered {
            db: self,
            switched: false,
        })
    }

    /// Raises the MANIFEST's size limits back to RocksDB's defaults once no key rotation
    /// holds them lowered and the store has moved to a new MANIFEST (the daemon calls this
    /// every second, [`Self::flush`] after flushing); until then every edit starts a new
    /// MANIFEST, which costs a few KiB written and is never wrong.
    pub fn raise_manifest_limits(&self) {
        if let Err(e) = self.manifest_roll.raise_if_rolled(&self.db) {
            tracing::warn!(
                tenant = %self.tenant,
                error = %e,
                "cannot raise the MANIFEST limits; will retry"
            );
        }
    }

    /// Starts new files for everything written from now on (`lowered`: this store's
    /// MANIFEST limits, lowered): the flushes and compactions running now waited for; a
    /// marker (`marker`, under a key of its own in `Meta`) written and that memtable
    /// switched, so RocksDB moves to a new WAL at once (it does so only with a memtable that
    /// holds something) and flushes the old one in the background (its edit is the
    /// MANIFEST's next: a new MANIFEST, after which [`Self::raise_manifest_limits`] raises
    /// the limits back);
    /// and the open extent file closed. After a key rotation, every file the store writes or
    /// appends to afterwards is under the new key.
    pub fn start_new_files(
        &self,
        marker: &[u8],
        mut lowered: ManifestLimitsLowered<'_>,
    ) -> Result<(), StoreError> {
        assert!(
            std::ptr::eq(lowered.db, self),
            "the MANIFEST limits of another store"
        );
        // A flush or compaction running now writes files it opened under the old key.
        super::ffi::wait_for_running_background_work(&self.db)
            .map_err(|detail| StoreError::from_detail(&self.tenant, "wait", detail))?;
        self.put(Family::Meta, b"!files-started", marker)?;
        // A MANIFEST other than this one was started by an edit made after the switch.
        self.manifest_roll.switching(&self.db);
        let mut switch = rocksdb::FlushOptions::default();
        switch.set_wait(false);
        match self.db.flush_cf_opt(self.cf(Family::Meta), &switch) {
            Ok(()) => {}
            // Writes stopped (a stall): a flush that does not wait is refused; one that
            // waits switches once they go on.
            Err(e) if e.kind() == rocksdb::ErrorKind::TryAgain => self
                .db
                .flush_cf(self.cf(Family::Meta))
                .map_err(|e| self.write_error("flush", e))?,
            Err(e) => return Err(self.write_error("flush", e)),
        }
        lowered.switched = true;
        drop(lowered);
        self.extents.close_if_idle(std::time::Duration::ZERO)?;
        Ok(())
    }

    /// The MANIFEST's size limit now: RocksDB's default but while the store moves to new
    /// files ([`Self::start_new_files`]).
    #[cfg(test)]
    pub(crate) fn manifest_size_limit(&self) -> u64 {
        super::ffi::max_manifest_file_size(&self.db)
    }

    /// Flushes all memtables to SST files.
    pub fn flush(&self) -> Result<(), StoreError> {
        let cfs: Vec<_> = Family::ALL.iter().map(|f| self.cf(*f)).collect();
        self.db
            .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())
            .map_err(|e| self.write_error("flush", e))?;
        self.raise_manifest_limits();
        Ok(())
    }

    /// Compacts the extents family fully and garbage-collects every blob file: live file data
    /// moves into new blob files, the space of overwritten and deleted data comes back.
    pub fn collect_blob_garbage(&self) {
        super::ffi::compact_with_blob_gc(&self.db, self.cf(Family::Extents));
    }

    /// Writes every file RocksDB keeps of the store again (under the ring's writing key):
    /// each family compacted fully, the extents family with every blob file collected, and
    /// the IDENTITY and OPTIONS files (written once, at creation, and when options change).
    pub fn rewrite_files(&self) -> Result<(), StoreError> {
        self.flush()?;
        self.collect_blob_garbage();
        let mut opts = rocksdb::CompactOptions::default();
        opts.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        for f in Family::ALL.into_iter().filter(|f| *f != Family::Extents) {
            self.db
                .compact_range_cf_opt(self.cf(f), None::<&[u8]>, None::<&[u8]>, &opts);
        }
        super::ffi::rewrite_identity(&self.db)
            .and_then(|()| super::ffi::rewrite_options(&self.db))
            .map_err(|detail| StoreError::from_detail(&self.tenant, "rewrite", detail))?;
        match self.state() {
            StoreState::Writable => Ok(()),
            _ => Err(StoreError::from_detail(
                &self.tenant,
                "rewrite",
                "the store stopped taking writes during the rewrite".into(),
            )),
        }
    }

    /// Compacts every family fully (rewrites every SST).
    pub fn compact(&self) -> Result<(), StoreError> {
        let mut opts = rocksdb::CompactOptions::default();
        opts.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        for f in Family::ALL {
            self.db
                .compact_range_cf_opt(self.cf(f), None::<&[u8]>, None::<&[u8]>, &opts);
        }
        Ok(())
    }
}

/// Changes to one tenant store that land together or not at all.
pub struct Batch<'a> {
    db: &'a TenantDb,
    inner: WriteBatch,
    /// Run in order once the batch is written, never if the write fails.
    written: Vec<Box<dyn FnOnce()>>,
}

impl Batch<'_> {
    /// Runs `f` once this batch is in the store (before the write returns), not if the write
    /// fails: what a caller keeps in step with what it wrote, such as a cache of its records,
    /// changes only with the store.
    pub fn when_written(&mut self, f: impl FnOnce() + 'static) {
        self.written.push(Box::new(f));
    }

    pub fn put(&mut self, family: Family, key: &[u8], value: &[u8]) {
        self.inner.put_cf(self.db.cf(family), key, value);
    }

    pub fn delete(&mut self, family: Family, key: &[u8]) {
        self.inner.delete_cf(self.db.cf(family), key);
    }

    /// Deletes every key of `family` with `start <= key < end`.
    pub fn delete_range(&mut self, family: Family, start: &[u8], end: &[u8]) {
        self.inner.delete_range_cf(self.db.cf(family), start, end);
    }

    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

#[cfg(test)]
impl TenantDb {
    /// The key the host cache is asked for in place of RocksDB's key of blob file `number` at
    /// `offset` in this store's session (see `ffi::BlobCacheKeys`).
    fn blob_cache_key_for(&self, number: u64, offset: u64) -> Vec<u8> {
        let keys = self.blob_keys.as_ref().expect("an encrypted store");
        keys.key_for(&self.db, number, offset)
    }
}

#[cfg(test)]
mod tests;
