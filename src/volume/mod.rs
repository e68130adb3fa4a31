//! The filesystem model over one tenant store: inodes, directory entries, extents, xattrs.
//!
//! It knows nothing about FUSE (the adapter in `fuse` translates requests into these calls), so
//! it is tested directly against a reference model. Every operation's changes go into one
//! RocksDB write batch, so a crash leaves each operation either whole or absent. File data is
//! cut into fixed-size blocks (the volume's block size, set at creation): a write that covers a
//! whole block never reads it; a partial write reads, patches and writes that one block; a block
//! that becomes all zeros is stored as a hole.

mod blob_gc;
mod chunk;
mod codec;
mod data;
mod extent_gc;
mod fold;
mod graft;
mod locks;
mod readahead;
#[cfg(test)]
mod testing;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::store::{Family, StoreError};
use crate::tenants::Tenant;

use codec::*;
use fold::Folds;
pub use graft::GraftNode;
use locks::InodeLocks;
use readahead::Readahead;
#[cfg(test)]
pub(crate) use testing::TestStore;

/// Where a volume reads the blocks it shares with a base image (extents tagged as base
/// references). The volume treats a reference as opaque bytes.
pub trait BaseBlocks: Send + Sync {
    /// Fills `out` (one block) with the block `reference` names, or says why it cannot.
    fn read(&self, reference: &[u8], out: &mut [u8]) -> std::result::Result<(), String>;

    /// Several blocks at once (the base blocks of one read request), so an engine can fetch
    /// neighbouring blocks in one I/O: `outs[i]` gets `refs[i]`.
    fn read_many(&self, refs: &[&[u8]], outs: &mut [&mut [u8]]) -> std::result::Result<(), String> {
        for (r, out) in refs.iter().zip(outs.iter_mut()) {
            self.read(r, out)?;
        }
        Ok(())
    }
}

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
const UNLOGGED_WRITE_MIN: usize = 256 << 10;
const XATTR_SIZE_MAX: usize = 64 * 1024;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FileKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl FileKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// An inode's attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (no file type bits).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    /// For directories, the parent directory (the root is its own parent).
    pub parent: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    /// 512-byte units allocated (computed, not stored).
    pub blocks: u64,
}

/// A directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: FileKind,
}

/// Attribute changes of a setattr call; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
    pub ctime: Option<SystemTime>,
}

/// Who creates a node: its owner and initial permissions.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// How rename treats an existing target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace the target if it exists (plain rename(2)).
    Replace,
    /// Fail with EEXIST if the target exists.
    NoReplace,
    /// Swap source and target atomically; both must exist.
    Exchange,
}

/// xattr set semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrMode {
    Any,
    Create,
    Replace,
}

/// fallocate modes the volume supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallocate {
    /// Make `[offset, offset+len)` part of the file (extends the size unless `keep_size`).
    /// Space is not reserved: the volume is sparse.
    Allocate { keep_size: bool },
    /// Deallocate `[offset, offset+len)`: it reads as zeros, its extents are freed.
    PunchHole,
    /// Zero `[offset, offset+len)` (extends the size unless `keep_size`).
    ZeroRange { keep_size: bool },
}

/// Filesystem statistics.
#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("invalid argument")]
    Invalid,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value does not fit the buffer")]
    Range,
    #[error("file too large")]
    TooBig,
    #[error("argument list too long")]
    ArgTooBig,
    #[error("operation not supported")]
    NotSupported,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("no data or hole at or after this offset")]
    NoMoreData,
    #[error("no space left on the tenant's disk")]
    NoSpace,
    #[error("tenant {tenant}: inode {ino} record is damaged")]
    Damaged { tenant: String, ino: u64 },
    #[error("tenant {tenant}: a base image block of inode {ino} cannot be read: {detail}")]
    BaseBlock {
        tenant: String,
        ino: u64,
        detail: String,
    },
    #[error(
        "tenant {tenant} was being created from a base image when that was interrupted; \
         delete it and create it again"
    )]
    Incomplete { tenant: String },
    #[error("tenant {tenant} holds its files in data format {found}, {}", format_advice(*found))]
    Format { tenant: String, found: u32 },
    #[error("internal error while serving {0} (a bug: see the log)")]
    Panicked(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What to do with a store of a data format this tenantfs does not read.
fn format_advice(found: u32) -> String {
    let reads = format!(
        "it reads formats {} to {}",
        codec::FORMAT_MIGRATES_FROM,
        codec::FORMAT_VERSION
    );
    if found > codec::FORMAT_VERSION {
        format!(
            "written by a newer tenantfs ({reads}); open it with the tenantfs that wrote it or \
             a newer one"
        )
    } else {
        format!(
            "which this tenantfs does not read ({reads}, written since tenantfs 0.3); copy the \
             files out with the tenantfs that wrote them, then into a tenant created by this one"
        )
    }
}

impl VolumeError {
    /// The errno a POSIX caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            VolumeError::NotFound => libc::ENOENT,
            VolumeError::Exists => libc::EEXIST,
            VolumeError::NotDir => libc::ENOTDIR,
            VolumeError::IsDir => libc::EISDIR,
            VolumeError::NotEmpty => libc::ENOTEMPTY,
            VolumeError::NameTooLong => libc::ENAMETOOLONG,
            VolumeError::Invalid => libc::EINVAL,
            VolumeError::NoAttr => libc::ENODATA,
            VolumeError::Range => libc::ERANGE,
            VolumeError::TooBig => libc::EFBIG,
            VolumeError::ArgTooBig => libc::E2BIG,
            VolumeError::NotSupported => libc::EOPNOTSUPP,
            VolumeError::NotPermitted => libc::EPERM,
            VolumeError::NoMoreData => libc::ENXIO,
            VolumeError::NoSpace => libc::ENOSPC,
            VolumeError::Damaged { .. } => libc::EIO,
            VolumeError::BaseBlock { .. }
            | VolumeError::Format { .. }
            | VolumeError::Incomplete { .. }
            | VolumeError::Panicked(_) => libc::EIO,
            VolumeError::Store(e) if e.is_no_space() => libc::ENOSPC,
            VolumeError::Store(_) => libc::EIO,
        }
    }
}

type Result<T> = std::result::Result<T, VolumeError>;

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
    folds: Folds,
    blob_gc: blob_gc::BlobGc,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(VolumeError::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(VolumeError::NameTooLong);
    }
    Ok(())
}

/// Clears setuid, and setgid when group-executable, as a write, truncate or chown by an
/// unprivileged caller does. The mount handles this itself (FUSE_HANDLE_KILLPRIV), which
/// spares the kernel a GETATTR before every chown.
fn kill_privileges(attr: &mut Attr) {
    attr.perm &= !0o4000;
    if attr.perm & 0o010 != 0 {
        attr.perm &= !0o2000;
    }
}

fn now() -> SystemTime {
    SystemTime::now()
}

impl Volume {
    /// Opens the filesystem in a tenant's store, creating the root directory on first use and
    /// freeing files that were unlinked while open when the last session ended.
    pub fn open(tenant: Tenant) -> Result<Self> {
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
        };
        if volume.db().get(Family::Meta, GRAFTING_KEY)?.is_some() {
            return Err(VolumeError::Incomplete {
                tenant: volume.tenant.info().name.clone(),
            });
        }
        volume.purge_orphans()?;
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
        let raw = self
            .db()
            .get(Family::Inodes, &ino_key(ino))?
            .ok_or(VolumeError::NotFound)?;
        let (mut attr, target) = decode_attr(ino, &raw).ok_or_else(|| self.damaged(ino))?;
        attr.blocks = self.allocated_blocks(&attr);
        Ok((attr, target.to_vec()))
    }

    fn allocated_blocks(&self, attr: &Attr) -> u64 {
        // An estimate from the size (exact accounting would need a scan of the extents).
        match attr.kind {
            FileKind::File | FileKind::Dir => attr.size.div_ceil(512),
            _ => 0,
        }
    }

    /// Puts an inode record; `target` (a symlink's target) is stored only for symlinks, so
    /// callers pass what they loaded without checking the kind.
    fn store_attr(&self, b: &mut crate::store::Batch<'_>, attr: &Attr, target: &[u8]) {
        let target = (attr.kind == FileKind::Symlink).then_some(target);
        b.put(
            Family::Inodes,
            &ino_key(attr.ino),
            &encode_attr(attr, target),
        );
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

    fn find(&self, parent: u64, name: &[u8]) -> Result<Option<(u64, FileKind)>> {
        match self.db().get(Family::Dirents, &dirent_key(parent, name))? {
            Some(v) => Ok(Some(decode_dirent(&v).ok_or_else(|| self.damaged(parent))?)),
            None => Ok(None),
        }
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(VolumeError::NameTooLong);
        }
        match self.find(parent, name)? {
            Some((child, _)) => self.getattr(child),
            None => {
                self.dir_attr(parent)?;
                Err(VolumeError::NotFound)
            }
        }
    }

    /// Creates a node of any kind under `parent`.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        check_name(name)?;
        let _ns = self.lock_namespace();
        let _g = self.inodes.lock(parent);
        let mut pattr = self.dir_attr(parent)?;
        if pattr.nlink == 0 {
            return Err(VolumeError::NotFound); // a removed directory takes no new entries
        }
        if self.find(parent, name)?.is_some() {
            return Err(VolumeError::Exists);
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let t = now();
        // BSD group semantics under a setgid directory.
        let setgid_dir = pattr.perm & 0o2000 != 0;
        let gid = if setgid_dir { pattr.gid } else { owner.gid };
        let mut perm = perm & 0o7777;
        if kind == FileKind::Dir && setgid_dir {
            perm |= 0o2000;
        }
        let attr = Attr {
            ino,
            kind,
            perm,
            uid: owner.uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: target.map_or(0, |t| t.len() as u64),
            rdev,
            parent: if kind == FileKind::Dir { parent } else { 0 },
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            blocks: 0,
        };
        if kind == FileKind::Dir {
            pattr.nlink += 1;
        }
        pattr.mtime = t;
        pattr.ctime = t;
        let mut b = self.db().batch();
        self.store_attr(&mut b, &attr, target.unwrap_or_default());
        self.store_attr(&mut b, &pattr, &[]);
        b.put(
            Family::Dirents,
            &dirent_key(parent, name),
            &dirent_value(ino, kind),
        );
        self.db().write(b)?;
        Ok(attr)
    }

    /// Creates a regular file, device node, fifo or socket.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(VolumeError::Invalid);
        }
        self.create_node(parent, name, kind, perm, owner, rdev, None)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u16, owner: Owner) -> Result<Attr> {
        self.create_node(parent, name, FileKind::Dir, perm, owner, 0, None)
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], owner: Owner) -> Result<Attr> {
        if target.is_empty() {
            return Err(VolumeError::NotFound);
        }
        if target.len() > 4095 {
            return Err(VolumeError::NameTooLong);
        }
        self.create_node(
            parent,
            name,
            FileKind::Symlink,
            0o777,
            owner,
            0,
            Some(target),
        )
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let (attr, target) = self.load(ino)?;
        if attr.kind != FileKind::Symlink {
            return Err(VolumeError::Invalid);
        }
        Ok(target)
    }

    /// Drops one link of `attr` in batch `b`; an inode left with no links becomes an orphan
    /// (its data stays until [`Self::forget`] says no one has it open).
    fn drop_link(
        &self,
        b: &mut crate::store::Batch<'_>,
        attr: &mut Attr,
        target: &[u8],
        t: SystemTime,
    ) {
        attr.nlink = if attr.kind == FileKind::Dir {
            0
        } else {
            attr.nlink.saturating_sub(1)
        };
        attr.ctime = t;
        self.store_attr(b, attr, target);
        if attr.nlink == 0 {
            b.put(Family::Meta, &orphan_key(attr.ino), b"");
        }
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(VolumeError::Invalid);
        }
        if name == b".." {
            return Err(VolumeError::NotEmpty);
        }
        self.remove(parent, name, true)
    }

    fn is_empty_dir(&self, ino: u64) -> Result<bool> {
        let (start, end) = dirent_range(ino);
        let mut empty = true;
        self.db().range(Family::Dirents, &start, &end, |_, _| {
            empty = false;
            false
        })?;
        Ok(empty)
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(VolumeError::NameTooLong);
        }
        let _ns = self.lock_namespace();
        self.dir_attr(parent)?;
        let (child, kind) = self.find(parent, name)?.ok_or(VolumeError::NotFound)?;
        let _g = self.inodes.lock_many(&[parent, child]);
        // Read under the lock: a setattr on the parent meanwhile must not be overwritten.
        let mut pattr = self.dir_attr(parent)?;
        match (dir, kind == FileKind::Dir) {
            (false, true) => return Err(VolumeError::IsDir),
            (true, false) => return Err(VolumeError::NotDir),
            (true, true) if !self.is_empty_dir(child)? => return Err(VolumeError::NotEmpty),
            _ => {}
        }
        let (mut cattr, target) = self.load(child)?;
        let t = now();
        let mut b = self.db().batch();
        b.delete(Family::Dirents, &dirent_key(parent, name));
        self.drop_link(&mut b, &mut cattr, &target, t);
        if dir {
            pattr.nlink = pattr.nlink.saturating_sub(1);
        }
        pattr.mtime = t;
        pattr.ctime = t;
        self.store_attr(&mut b, &pattr, &[]);
        self.db().write(b)?;
        Ok(())
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        check_name(newname)?;
        let _ns = self.lock_namespace();
        let _g = self.inodes.lock_many(&[ino, newparent]);
        let mut pattr = self.dir_attr(newparent)?;
        if pattr.nlink == 0 {
            return Err(VolumeError::NotFound); // a removed directory takes no new entries
        }
        // Linux's order: an existing target first, then what is wrong with the source.
        if self.find(newparent, newname)?.is_some() {
            return Err(VolumeError::Exists);
        }
        let (mut attr, target) = self.load(ino)?;
        if attr.kind == FileKind::Dir {
            return Err(VolumeError::NotPermitted);
        }
        if attr.nlink == 0 {
            return Err(VolumeError::NotFound);
        }
        let t = now();
        attr.nlink += 1;
        attr.ctime = t;
        pattr.mtime = t;
        pattr.ctime = t;
        let mut b = self.db().batch();
        self.store_attr(&mut b, &attr, &target);
        self.store_attr(&mut b, &pattr, &[]);
        b.put(
            Family::Dirents,
            &dirent_key(newparent, newname),
            &dirent_value(ino, attr.kind),
        );
        self.db().write(b)?;
        Ok(attr)
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_within(&self, dir: u64, ancestor: u64) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = self.getattr(cur)?.parent;
        }
        Err(self.damaged(dir))
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        if name.len() > NAME_MAX || newname.len() > NAME_MAX {
            return Err(VolumeError::NameTooLong);
        }
        check_name(newname)?;
        let _ns = self.lock_namespace();
        let (src, skind) = self
            .find(parent, name)?
            .ok_or_else(|| match self.dir_attr(parent) {
                Err(e) => e,
                Ok(_) => VolumeError::NotFound,
            })?;
        if self.dir_attr(newparent)?.nlink == 0 {
            return Err(VolumeError::NotFound); // a removed directory takes no new entries
        }
        let dst = self.find(newparent, newname)?;
        if mode == RenameMode::NoReplace && dst.is_some() {
            return Err(VolumeError::Exists);
        }
        if mode == RenameMode::Exchange && dst.is_none() {
            return Err(VolumeError::NotFound);
        }
        if let Some((d, _)) = dst {
            if d == src {
                return Ok(()); // same inode: nothing to do (POSIX)
            }
        }
        // A directory cannot move into its own subtree (for exchange: either way round).
        if skind == FileKind::Dir && parent != newparent && self.is_within(newparent, src)? {
            return Err(VolumeError::Invalid);
        }
        // Nor can the target be an ancestor of the source: Linux says ENOTEMPTY (EINVAL for
        // exchange) before looking at the source's type.
        if let Some((d, FileKind::Dir)) = dst {
            if parent != newparent && self.is_within(parent, d)? {
                return Err(match mode {
                    RenameMode::Exchange => VolumeError::Invalid,
                    _ => VolumeError::NotEmpty,
                });
            }
        }
        let mut involved = vec![parent, newparent, src];
        if let Some((d, _)) = dst {
            involved.push(d);
        }
        let _g = self.inodes.lock_many(&involved);
        let t = now();
        let mut b = self.db().batch();
        let (mut sattr, starget) = self.load(src)?;

        if mode == RenameMode::Exchange {
            let (d, dkind) = dst.expect("checked above");
            let (mut dattr, dtarget) = self.load(d)?;
            b.put(
                Family::Dirents,
                &dirent_key(parent, name),
                &dirent_value(d, dkind),
            );
            b.put(
                Family::Dirents,
                &dirent_key(newparent, newname),
                &dirent_value(src, skind),
            );
            if parent != newparent {
                let mut pa = self.getattr(parent)?;
                let mut npa = self.getattr(newparent)?;
                if skind == FileKind::Dir {
                    sattr.parent = newparent;
                    pa.nlink -= 1;
                    npa.nlink += 1;
                }
                if dkind == FileKind::Dir {
                    dattr.parent = parent;
                    npa.nlink -= 1;
                    pa.nlink += 1;
                }
                pa.mtime = t;
                pa.ctime = t;
                npa.mtime = t;
                npa.ctime = t;
                self.store_attr(&mut b, &pa, &[]);
                self.store_attr(&mut b, &npa, &[]);
            } else {
                let mut pa = self.getattr(parent)?;
                pa.mtime = t;
                pa.ctime = t;
                self.store_attr(&mut b, &pa, &[]);
            }
            sattr.ctime = t;
            dattr.ctime = t;
            self.store_attr(&mut b, &sattr, &starget);
            self.store_attr(&mut b, &dattr, &dtarget);
            self.db().write(b)?;
            return Ok(());
        }

        let mut pa = self.getattr(parent)?;
        let mut npa_separate = (parent != newparent)
            .then(|| self.getattr(newparent))
            .transpose()?;
        if let Some((d, dkind)) = dst {
            match (skind == FileKind::Dir, dkind == FileKind::Dir) {
                (true, false) => return Err(VolumeError::NotDir),
                (false, true) => return Err(VolumeError::IsDir),
                (true, true) if !self.is_empty_dir(d)? => return Err(VolumeError::NotEmpty),
                _ => {}
            }
            let (mut dattr, dtarget) = self.load(d)?;
            self.drop_link(&mut b, &mut dattr, &dtarget, t);
            if dkind == FileKind::Dir {
                // The replaced directory's ".." no longer links the new parent.
                match npa_separate.as_mut() {
                    Some(npa) => npa.nlink -= 1,
                    None => pa.nlink -= 1,
                }
            }
        }
        b.delete(Family::Dirents, &dirent_key(parent, name));
        b.put(
            Family::Dirents,
            &dirent_key(newparent, newname),
            &dirent_value(src, skind),
        );
        if skind == FileKind::Dir && parent != newparent {
            sattr.parent = newparent;
            pa.nlink -= 1;
            if let Some(npa) = npa_separate.as_mut() {
                npa.nlink += 1;
            }
        }
        sattr.ctime = t;
        self.store_attr(&mut b, &sattr, &starget);
        pa.mtime = t;
        pa.ctime = t;
        self.store_attr(&mut b, &pa, &[]);
        if let Some(mut npa) = npa_separate {
            npa.mtime = t;
            npa.ctime = t;
            self.store_attr(&mut b, &npa, &[]);
        }
        self.db().write(b)?;
        Ok(())
    }

    /// The entries of a directory, sorted by name (without "." and "..").
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        self.dir_attr(ino)?;
        let (start, end) = dirent_range(ino);
        let mut out = Vec::new();
        let mut bad = false;
        self.db().range(Family::Dirents, &start, &end, |k, v| {
            match decode_dirent(v) {
                Some((child, kind)) => out.push(DirEntry {
                    name: k[8..].to_vec(),
                    ino: child,
                    kind,
                }),
                None => bad = true,
            }
            true
        })?;
        if bad {
            return Err(self.damaged(ino));
        }
        Ok(out)
    }

    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        let _g = self.inodes.lock(ino);
        let (mut attr, target) = self.load(ino)?;
        let t = now();
        let mut b = self.db().batch();
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
        let changes_owner_or_size = set.size.is_some() || set.uid.is_some() || set.gid.is_some();
        if attr.kind == FileKind::File && changes_owner_or_size && set.perm.is_none() {
            kill_privileges(&mut attr);
        }
        attr.ctime = set.ctime.unwrap_or(t);
        self.store_attr(&mut b, &attr, &target);
        self.db().write(b)?;
        attr.blocks = self.allocated_blocks(&attr);
        Ok(attr)
    }

    /// Folds now every chunk that block writes landed on, instead of once writes leave it
    /// alone for a while (`fold`): for tests and benchmarks that look at the settled layout.
    pub fn fold_now(&self) {
        self.folds.fold_now();
    }

    /// Makes every change so far durable.
    pub fn fsync(&self) -> Result<()> {
        self.db().sync()?;
        self.blob_gc.poke(&self.tenant);
        Ok(())
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let (free, total) = self.db().disk_space()?;
        Ok(StatFs {
            block_size: self.block_size as u32,
            blocks: total / self.block_size,
            blocks_free: free / self.block_size,
            files: u64::from(u32::MAX),
            files_free: u64::from(u32::MAX)
                - self.next_ino.load(Ordering::Relaxed).min(u32::MAX.into()),
            name_max: NAME_MAX as u32,
        })
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        if name.is_empty() {
            return Err(VolumeError::Invalid);
        }
        if name.len() > XATTR_NAME_MAX {
            return Err(VolumeError::Range);
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(VolumeError::ArgTooBig);
        }
        let _g = self.inodes.lock(ino);
        let (mut attr, target) = self.load(ino)?;
        let key = xattr_key(ino, name);
        let exists = self.db().get(Family::Meta, &key)?.is_some();
        match mode {
            XattrMode::Create if exists => return Err(VolumeError::Exists),
            XattrMode::Replace if !exists => return Err(VolumeError::NoAttr),
            _ => {}
        }
        attr.ctime = now();
        let mut b = self.db().batch();
        b.put(Family::Meta, &key, value);
        self.store_attr(&mut b, &attr, &target);
        self.db().write(b)?;
        Ok(())
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.getattr(ino)?;
        self.db()
            .get(Family::Meta, &xattr_key(ino, name))?
            .ok_or(VolumeError::NoAttr)
    }

    /// Attribute names, each followed by a NUL (the listxattr(2) format).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        self.getattr(ino)?;
        let prefix = xattr_prefix(ino);
        let end = xattr_prefix(ino + 1);
        let mut out = Vec::new();
        self.db().range(Family::Meta, &prefix, &end, |k, _| {
            out.extend_from_slice(&k[prefix.len()..]);
            out.push(0);
            true
        })?;
        Ok(out)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _g = self.inodes.lock(ino);
        let (mut attr, target) = self.load(ino)?;
        let key = xattr_key(ino, name);
        if self.db().get(Family::Meta, &key)?.is_none() {
            return Err(VolumeError::NoAttr);
        }
        attr.ctime = now();
        let mut b = self.db().batch();
        b.delete(Family::Meta, &key);
        self.store_attr(&mut b, &attr, &target);
        self.db().write(b)?;
        Ok(())
    }

    /// The kernel no longer references `ino`: if it has no links left, free it now.
    pub fn forget(&self, ino: u64) -> Result<()> {
        let _g = self.inodes.lock(ino);
        if self.db().get(Family::Meta, &orphan_key(ino))?.is_none() {
            return Ok(());
        }
        match self.load(ino) {
            Ok((attr, _)) if attr.nlink > 0 => Ok(()), // re-linked meanwhile
            Ok(_) | Err(VolumeError::NotFound) => self.purge(ino),
            Err(e) => Err(e),
        }
    }

    /// Deletes the keys in `[start, end)` of `family` in batch `b`: point deletes when there
    /// are few (the common case: small files, no xattrs), one range tombstone otherwise. Range
    /// tombstones are cheap to write but every later read in their range pays for them, so
    /// thousands of small files created and removed must not leave thousands of them behind.
    fn delete_keys(
        &self,
        b: &mut crate::store::Batch<'_>,
        family: Family,
        start: &[u8],
        end: &[u8],
    ) -> Result<()> {
        self.delete_keys_where(b, family, start, end, |_| true)
    }

    /// [`Self::delete_keys`] of the keys `which` picks (the range tombstone, when there are
    /// many, takes all: callers put back what must stay later in the same batch).
    fn delete_keys_where(
        &self,
        b: &mut crate::store::Batch<'_>,
        family: Family,
        start: &[u8],
        end: &[u8],
        which: impl Fn(&[u8]) -> bool,
    ) -> Result<()> {
        const POINT_DELETES_MAX: usize = 256;
        let mut keys = Vec::new();
        self.db().keys(family, start, end, |k| {
            if which(k) {
                keys.push(k.to_vec());
            }
            keys.len() <= POINT_DELETES_MAX
        })?;
        if keys.len() > POINT_DELETES_MAX {
            b.delete_range(family, start, end);
        } else {
            for k in keys {
                b.delete(family, &k);
            }
        }
        Ok(())
    }

    fn purge(&self, ino: u64) -> Result<()> {
        let mut b = self.db().batch();
        b.delete(Family::Inodes, &ino_key(ino));
        self.delete_keys(
            &mut b,
            Family::Extents,
            &extent_key(ino, 0),
            &extent_key(ino + 1, 0),
        )?;
        self.delete_keys(
            &mut b,
            Family::Meta,
            &xattr_prefix(ino),
            &xattr_prefix(ino + 1),
        )?;
        b.delete(Family::Meta, &orphan_key(ino));
        self.db().write(b)?;
        Ok(())
    }

    /// Frees every orphan: at open no process can still have one open.
    fn purge_orphans(&self) -> Result<()> {
        let mut orphans = Vec::new();
        self.db().range(Family::Meta, b"O", b"P", |k, _| {
            if k.len() == 9 {
                orphans.push(u64::from_be_bytes(k[1..9].try_into().unwrap()));
            }
            true
        })?;
        for ino in orphans {
            self.purge(ino)?;
        }
        Ok(())
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
        // Unmount or shutdown: make the WAL durable before the store closes.
        if let Err(e) = self.fsync() {
            tracing::error!(tenant = %self.tenant.info().name, error = %e, "final sync failed");
        }
    }
}
