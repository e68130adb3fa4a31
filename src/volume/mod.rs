//! The filesystem model over one tenant store: inodes, directory entries, extents, xattrs.
//!
//! It knows nothing about FUSE (`fuse`'s dispatcher translates requests into these calls), so
//! it is tested directly against a reference model. Every operation's changes go into one
//! RocksDB write batch, so a crash leaves each operation either whole or absent. File data is
//! cut into fixed-size blocks (the volume's block size, set at creation): a write that covers a
//! whole block never reads it; a partial write reads, patches and writes that one block; a block
//! that becomes all zeros is stored as a hole.
//!
//! The operations are grouped by what they touch: `namespace` (names and links), `data` (file
//! bytes), `xattrs`, `orphans` (files freed after their last close); `privileges` (setuid and
//! setgid cleared as the kernel's rules say); `usage` (what the files take, against the
//! quota); `types` holds the values they take and return, `error` the one error type. Layout and background upkeep: `codec`,
//! `chunk`, `fold`, `readahead`, `neighbours`, `blob_gc`, `extent_gc`, `graft`.

mod blob_gc;
#[cfg(test)]
mod checkpoints;
mod chunk;
mod codec;
mod data;
mod error;
mod extent_gc;
mod fold;
mod graft;
mod inode_cache;
mod key_rewrite;
mod locks;
mod namespace;
mod neighbours;
mod orphans;
mod privileges;
mod readahead;
#[cfg(test)]
pub(crate) mod testing;
mod types;
mod usage;
mod xattrs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::quota::{Quota, Usage};
use crate::store::Family;
use crate::tenants::Tenant;

use codec::*;
use error::Result;
pub use error::VolumeError;
use fold::Folds;
pub use graft::GraftNode;
use inode_cache::InodeCache;
pub use key_rewrite::KeyRewrite;
use locks::InodeLocks;
use neighbours::Neighbours;
pub(crate) use neighbours::SMALL as SMALL_FILE;
pub use privileges::{Caller, Clearing, CAPABILITY_XATTR};
use readahead::Readahead;
#[cfg(test)]
pub(crate) use testing::{noise, TestStore};
pub use types::{
    Attr, BaseBlocks, DirEntry, Fallocate, FileKind, Owner, RenameMode, SetAttr, StatFs, XattrMode,
};

/// The root directory's inode number.
pub const ROOT_INO: u64 = 1;
/// Longest name in a directory, in bytes.
pub const NAME_MAX: usize = 255;
/// Largest file size (offsets stay within i64 for lseek).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
const XATTR_NAME_MAX: usize = 255;
/// Reads of up to this many blocks (1 MiB at 4 KiB: every FUSE read) use batched point lookups.
const MULTI_GET_BLOCKS: u64 = 256;
/// Writes this large are bulk: their whole chunks go into extent files (blocks of 64 KiB and
/// more: the memtable without the WAL), durable at fsync, not at return. Small writes stay WAL
/// appends, durable as soon as the WAL reaches the disk.
pub(crate) const UNLOGGED_WRITE_MIN: usize = 256 << 10;
const XATTR_SIZE_MAX: usize = 64 * 1024;

/// A mounted-or-mountable tenant filesystem.
pub struct Volume {
    /// Shared with read-ahead jobs while they run (see `readahead`).
    tenant: Arc<Tenant>,
    block_size: u64,
    /// Blocks per chunk value (1: blocks are as large as chunks, none are written).
    chunk_blocks: u64,
    next_ino: AtomicU64,
    /// Serialises namespace changes (create, unlink, rename, link), which check and then change
    /// several keys.
    namespace: Mutex<()>,
    /// Shared with the fold thread, which takes an inode's lock to fold its chunks.
    inodes: Arc<InodeLocks>,
    base: Option<Arc<dyn BaseBlocks>>,
    readahead: Readahead,
    neighbours: Neighbours,
    /// Recently read and written inode records (see `inode_cache`).
    records: Arc<InodeCache>,
    folds: Folds,
    blob_gc: blob_gc::BlobGc,
    /// What the files take, and the quota they are charged against.
    counts: usage::Counts,
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// Whether a volume opens for a new session or for one that goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// No session serves it: files unlinked while open in the last one are freed.
    Fresh,
    /// A mount whose store closed while idle and opens again: the kernel may still hold files
    /// unlinked while open, and frees them by its forgets as usual.
    Woken,
}

impl Volume {
    /// Opens the filesystem in a tenant's store, creating the root directory on first use and
    /// freeing files that were unlinked while open when the last session ended.
    pub fn open(tenant: Tenant) -> Result<Self> {
        Self::open_as(tenant, Opening::Fresh)
    }

    /// [`Self::open`], for a new session or one that goes on (`opening`).
    pub fn open_as(tenant: Tenant, opening: Opening) -> Result<Self> {
        let block_size = u64::from(tenant.info().block_size);
        let db = tenant.db();
        match db.get(Family::Meta, VOLUME_KEY)? {
            Some(v) if v.len() == 8 => {
                let format = u32::from_be_bytes(v[..4].try_into().unwrap());
                let stored = u32::from_be_bytes(v[4..8].try_into().unwrap());
                if u64::from(stored) != block_size {
                    return Err(VolumeError::Damaged {
                        tenant: tenant.info().name.clone(),
                        ino: 0,
                    });
                }
                match format {
                    FORMAT_VERSION => {}
                    FORMAT_MIGRATES_FROM..FORMAT_VERSION => {
                        // Its keys read as they are in this format: the new version number is
                        // the whole migration (and keeps an older tenantfs, which would not
                        // read chunk keys, from opening the store afterwards).
                        let mut meta = FORMAT_VERSION.to_be_bytes().to_vec();
                        meta.extend_from_slice(&stored.to_be_bytes());
                        db.put(Family::Meta, VOLUME_KEY, &meta)?;
                        db.sync()?;
                        tracing::info!(
                            tenant = %tenant.info().name,
                            from = format,
                            to = FORMAT_VERSION,
                            "data format migrated"
                        );
                    }
                    _ => {
                        return Err(VolumeError::Format {
                            tenant: tenant.info().name.clone(),
                            found: format,
                        })
                    }
                }
            }
            Some(_) => {
                return Err(VolumeError::Damaged {
                    tenant: tenant.info().name.clone(),
                    ino: 0,
                })
            }
            None => {
                let t = now();
                let root = Attr {
                    ino: ROOT_INO,
                    kind: FileKind::Dir,
                    perm: 0o755,
                    uid: 0,
                    gid: 0,
                    nlink: 2,
                    size: 0,
                    rdev: 0,
                    parent: ROOT_INO,
                    atime: t,
                    mtime: t,
                    ctime: t,
                    crtime: t,
                    blocks: 0,
                };
                let mut b = db.batch();
                let mut meta = FORMAT_VERSION.to_be_bytes().to_vec();
                meta.extend_from_slice(&(block_size as u32).to_be_bytes());
                b.put(Family::Meta, VOLUME_KEY, &meta);
                b.put(
                    Family::Inodes,
                    &ino_key(ROOT_INO),
                    &encode_attr(&root, None),
                );
                db.write(b)?;
                db.sync()?;
            }
        }
        let max_ino = db
            .last_key(Family::Inodes)?
            .and_then(|k| {
                k.get(..8)
                    .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
            })
            .unwrap_or(ROOT_INO);
        let tenant_quota = tenant.info().quota;
        let tenant = Arc::new(tenant);
        let inodes = Arc::new(InodeLocks::new());
        let chunk_blocks = chunk::chunk_blocks(block_size);
        let volume = Self {
            blob_gc: blob_gc::BlobGc::new(Arc::clone(&inodes)),
            folds: Folds::new(
                Arc::clone(&tenant),
                Arc::clone(&inodes),
                block_size,
                chunk_blocks,
            ),
            tenant,
            block_size,
            chunk_blocks,
            next_ino: AtomicU64::new(max_ino + 1),
            namespace: Mutex::new(()),
            inodes,
            base: None,
            readahead: Readahead::default(),
            neighbours: Neighbours::default(),
            records: Arc::default(),
            counts: usage::Counts::new(tenant_quota),
        };
        if volume.db().get(Family::Meta, GRAFTING_KEY)?.is_some() {
            return Err(VolumeError::Incomplete {
                tenant: volume.tenant.info().name.clone(),
            });
        }
        volume.open_usage()?;
        if opening == Opening::Fresh {
            volume.purge_orphans()?;
        }
        Ok(volume)
    }

    /// Reads blocks shared with a base image through `base`.
    pub fn with_base(mut self, base: Arc<dyn BaseBlocks>) -> Self {
        self.base = Some(base);
        self
    }

    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    pub fn block_size(&self) -> u32 {
        self.block_size as u32
    }

    fn db(&self) -> &crate::store::TenantDb {
        self.tenant.db()
    }

    fn damaged(&self, ino: u64) -> VolumeError {
        damaged(&self.tenant, ino)
    }

    fn lock_namespace(&self) -> std::sync::MutexGuard<'_, ()> {
        self.namespace.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads an inode record: attributes and the symlink target (empty for others).
    fn load(&self, ino: u64) -> Result<(Attr, Vec<u8>)> {
        if let Some(record) = self.records.get(ino) {
            return Ok(record);
        }
        let before = self.records.generation(ino);
        let raw = self
            .db()
            .get(Family::Inodes, &ino_key(ino))?
            .ok_or(VolumeError::NotFound)?;
        let (mut attr, target) = decode_attr(ino, &raw).ok_or_else(|| self.damaged(ino))?;
        attr.blocks = self.allocated_blocks(&attr);
        let record = (attr, target.to_vec());
        self.records.fill(ino, before, record.clone());
        Ok(record)
    }

    /// `st_blocks`: what the file is charged (see `usage`), so `du` counts what the quota does.
    fn allocated_blocks(&self, attr: &Attr) -> u64 {
        usage::charged_bytes(attr, self.block_size) / 512
    }

    /// Puts an inode record; `target` (a symlink's target) is stored only for symlinks, so
    /// callers pass what they loaded without checking the kind.
    /// Callers hold the inode's lock until `b` is written, so records reach the cache in the
    /// order they reach the store.
    fn store_attr(&self, b: &mut crate::store::Batch<'_>, attr: &Attr, target: &[u8]) {
        let target = (attr.kind == FileKind::Symlink).then_some(target);
        b.put(
            Family::Inodes,
            &ino_key(attr.ino),
            &encode_attr(attr, target),
        );
        // The record as `load` reads it back (the encoding keeps every field:
        // `codec::tests::attr_round_trip`).
        let mut cached = attr.clone();
        cached.blocks = self.allocated_blocks(attr);
        let (ino, record) = (attr.ino, (cached, target.unwrap_or_default().to_vec()));
        let records = Arc::clone(&self.records);
        b.when_written(move || records.written(ino, record));
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.load(ino)?.0)
    }

    fn dir_attr(&self, ino: u64) -> Result<Attr> {
        let attr = self.getattr(ino)?;
        if attr.kind != FileKind::Dir {
            return Err(VolumeError::NotDir);
        }
        Ok(attr)
    }

    /// Sets what `set` names; setuid and setgid stay as they are unless `set.perm` says.
    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.setattr_clearing(ino, set, None)
    }

    /// As [`Self::setattr`], and clears setuid and setgid as `clearing` says (a truncate or a
    /// change of owner; see `privileges`), unless `set.perm` sets the mode itself.
    pub fn setattr_clearing(
        &self,
        ino: u64,
        set: &SetAttr,
        clearing: Option<Clearing<'_>>,
    ) -> Result<Attr> {
        let _g = self.inodes.lock(ino);
        let (mut attr, target) = self.load(ino)?;
        // By the file's group before a chgrp changes it, as the kernel decides.
        if let (Some(change), None) = (clearing, set.perm) {
            privileges::clear(&mut attr, change);
        }
        let t = now();
        let mut b = self.db().batch();
        // (bytes charged before, new size) of a truncate.
        let mut resized = None;
        if let Some(size) = set.size {
            match attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(VolumeError::IsDir),
                _ => return Err(VolumeError::Invalid),
            }
            if size > MAX_FILE_SIZE {
                return Err(VolumeError::TooBig);
            }
            if size < attr.size {
                self.zero_range(&mut b, ino, size, attr.size - size, attr.size)?;
            }
            resized = Some((usage::charged_bytes(&attr, self.block_size), size));
            attr.size = size;
            attr.mtime = t;
        }
        if let Some(p) = set.perm {
            attr.perm = p & 0o7777;
        }
        if let Some(u) = set.uid {
            attr.uid = u;
        }
        if let Some(g) = set.gid {
            attr.gid = g;
        }
        if let Some(a) = set.atime {
            attr.atime = a;
        }
        if let Some(m) = set.mtime {
            attr.mtime = m;
        }
        attr.ctime = set.ctime.unwrap_or(t);
        let after = usage::charged_bytes(&attr, self.block_size);
        let before = resized.map_or(after, |(before, _)| before);
        let charge = self.counts.charge(after.saturating_sub(before), 0)?;
        self.store_attr(&mut b, &attr, &target);
        self.db().write(b)?;
        charge.keep();
        self.counts.release(before.saturating_sub(after), 0);
        attr.blocks = self.allocated_blocks(&attr);
        Ok(attr)
    }

    /// Folds now every chunk that block writes landed on, instead of once writes leave it
    /// alone for a while (`fold`): for tests and benchmarks that look at the settled layout.
    pub fn fold_now(&self) {
        self.folds.fold_now();
    }

    /// Brings small files, `(ino, size)`, into the cache in the background: a hint that they
    /// are read next (see `fuse::listing_prefetch`); nothing is reported.
    pub fn warm_files(&self, files: Vec<(u64, u64)>) {
        if files.is_empty() {
            return;
        }
        self.readahead
            .fetch_files(&self.tenant, files, self.block_size, self.chunk_blocks);
    }

    /// Makes every change so far durable.
    pub fn fsync(&self) -> Result<()> {
        self.db().sync()?;
        self.blob_gc.poke(&self.tenant);
        Ok(())
    }

    /// The tenant's own numbers: what its files take as used, its quota as the size (where it
    /// has none, what it takes plus what the host has free); free is never more than the host
    /// has.
    pub fn statfs(&self) -> Result<StatFs> {
        let (host_free, host_total) = self.db().disk_space()?;
        Ok(statfs_of(
            self.counts.quota(),
            self.counts.usage(),
            self.block_size,
            host_free,
            host_total,
        ))
    }

    /// Whether background work for the volume is queued or runs (a fold, a collection):
    /// closing it now would wait for that work or drop it.
    pub fn has_background_work(&self) -> bool {
        self.folds.has_work() || self.blob_gc.is_running()
    }

    /// The next inode number this volume gives out.
    pub fn next_ino(&self) -> u64 {
        self.next_ino.load(Ordering::Relaxed)
    }

    /// Gives out no inode number below `ino` (an idle mount's store opened again goes on
    /// from where it was: a number freed before the rest is not given to a new file while
    /// the kernel may still know the old one).
    pub fn give_inodes_from(&self, ino: u64) {
        self.next_ino.fetch_max(ino, Ordering::Relaxed);
    }
}

/// `statfs` of a tenant with `quota` and `used`, on a host filesystem with `host_free` of
/// `host_total` bytes (see [`Volume::statfs`]).
pub fn statfs_of(quota: Quota, used: Usage, bs: u64, host_free: u64, host_total: u64) -> StatFs {
    let (blocks, blocks_free) = match quota.bytes {
        Some(q) => (
            q.get() / bs,
            q.get().saturating_sub(used.bytes).min(host_free) / bs,
        ),
        // The space it could have: what it holds and what the host has free.
        None => (
            used.bytes
                .saturating_add(host_free)
                .min(host_total.max(used.bytes))
                / bs,
            host_free / bs,
        ),
    };
    let files = quota
        .inodes
        .map_or(u64::from(u32::MAX), std::num::NonZeroU64::get);
    StatFs {
        block_size: bs as u32,
        blocks,
        blocks_free,
        files,
        files_free: files.saturating_sub(used.inodes),
        name_max: NAME_MAX as u32,
    }
}

/// The error for a record of `ino` that does not decode, logged.
fn damaged(tenant: &Tenant, ino: u64) -> VolumeError {
    tracing::error!(tenant = %tenant.info().name, ino, "damaged inode record");
    VolumeError::Damaged {
        tenant: tenant.info().name.clone(),
        ino,
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // The fold thread holds the store too; what it has not folded stays readable.
        self.folds.close();
        self.blob_gc.close();
        // Read-ahead jobs hold the store while they run: none may outlive the volume.
        self.readahead.close();
        if let Err(e) = self.close_usage() {
            tracing::error!(tenant = %self.tenant.info().name, error = %e, "usage not stored");
        }
        // Unmount or shutdown: make the WAL durable before the store closes.
        if let Err(e) = self.fsync() {
            tracing::error!(tenant = %self.tenant.info().name, error = %e, "final sync failed");
        }
    }
}
