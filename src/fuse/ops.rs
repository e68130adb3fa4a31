//! The FUSE operations of one mount, apart from how requests arrive: each takes a request's
//! arguments and returns a typed answer or an errno. Both transports reach them through
//! one dispatcher (`fuse::dispatch`): the /dev/fuse workers and the io_uring ring.
//! Attribute conversion, errno mapping, lookup counts and directory handles live here; no
//! filesystem logic does.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType, FopenFlags, INodeNo};

use super::caller::CapabilityRemovals;
use super::dormancy::ServedVolume;
use super::listing_prefetch::{self, ListingPrefetch};
use super::notify::KernelNotifier;
use crate::fair_share::Turn;
use crate::io_limits::{IoLimits, LiveLimits, Paid};
use crate::metrics::{MountMetrics, Op};
use crate::volume::{
    Attr, Clearing, DirEntry, Fallocate, FileKind, Owner, RenameMode, SetAttr, StatFs, Volume,
    VolumeError, XattrMode,
};

/// How long the kernel may cache attributes and entries. Every change goes through this
/// process, so the kernel's cache cannot go stale behind its back.
pub(crate) const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel sends in one request (and largest read it asks for): 2 MiB, so
/// that the kernel may use 512 pages per request. A 1 MiB write from a buffer that is not
/// page-aligned (malloc's large buffers start 16 bytes into a page) spans 257 pages: with 256
/// (what 1 MiB alone asks for) the kernel sends it as 1 MiB - 16 bytes and then 16 bytes, two
/// requests that each end in a partial block to read, patch and rewrite (the suite's
/// overwrite job: p50 708 -> 264 us per 1 MiB write with whole requests). The kernel caps the
/// pages at `fs.fuse.max_pages_limit` (256 unless root raises it; see README.md).
pub(crate) const MAX_WRITE: u32 = 2 << 20;

/// Most bytes one COPY_FILE_RANGE copies (a bound on how long it holds its queue), and how
/// many at a time (a bulk write: see `Volume::write`).
pub(crate) const COPY_MAX: u64 = 64 << 20;
const COPY_PIECE: u64 = 1 << 20;

/// Where file data is cached in RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// FOPEN_DIRECT_IO: no page cache for tenant files; the daemon's caches are the only RAM
    /// copy. mmap still works (FUSE_DIRECT_IO_ALLOW_MMAP).
    #[default]
    Direct,
    /// The kernel page cache holds file data (faster re-reads, a second copy in RAM).
    Kernel,
}

/// An opened file or directory: its handle and how the kernel should treat its data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Opened {
    pub fh: u64,
    pub flags: FopenFlags,
}

/// The answer to getxattr/listxattr: the size asked for by a zero-sized buffer, or the bytes.
#[derive(Debug)]
pub(crate) enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// How a rename treats an existing target (RENAME_* flags).
pub(crate) fn rename_mode(flags: u32) -> Result<RenameMode, Errno> {
    const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
    const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
    match flags {
        0 => Ok(RenameMode::Replace),
        f if f & EXCHANGE != 0 => Ok(RenameMode::Exchange),
        f if f & NOREPLACE != 0 => Ok(RenameMode::NoReplace),
        _ => Err(Errno::EINVAL),
    }
}

/// The FUSE operations of one tenant's mount.
pub(crate) struct Operations {
    volume: Arc<ServedVolume>,
    cache: CacheMode,
    /// Kernel references per inode (lookups minus forgets): a removed file is freed at zero.
    lookups: Mutex<HashMap<u64, u64>>,
    /// Open directory snapshots, by handle.
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    /// Recent listings' small files, warmed when their files are read in order.
    listed: ListingPrefetch,
    next_fh: AtomicU64,
    pub(crate) metrics: Arc<MountMetrics>,
    /// Notifications to the kernel (through /dev/fuse, once mounted).
    notifier: KernelNotifier,
    /// The tenant's I/O limits on this mount and their buckets: reads, writes and copies
    /// wait on them. Changed while mounted (`set_limits`); a request takes the buckets that
    /// are current when it comes.
    limits: Arc<LiveLimits>,
    /// The kernel's capability removals not yet followed by their SETATTR (see `dispatch`).
    pub(crate) capability_removals: CapabilityRemovals,
}

fn errno(e: VolumeError) -> Errno {
    if let VolumeError::Store(ref err) = e {
        if err.is_no_space() {
            // Expected while the disk is full: the store's state change was logged once.
            tracing::debug!(error = %err, "store error");
        } else if err.is_deferred() {
            // Not a failure: the request is answered again (`serving::deferring`).
        } else {
            tracing::error!(error = %err, "store error");
        }
    }
    Errno::from_i32(e.errno())
}

pub(crate) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

fn kind_from_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileKind::File,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev,
        libc::S_IFBLK => FileKind::BlockDev,
        _ => return None,
    })
}

/// POSIX ACLs are not supported: without FUSE_POSIX_ACL the kernel hands their xattrs to the
/// daemon, and storing them as plain values would report success while changing neither the
/// mode nor any permission check (`cp -a` sets a directory's mode through
/// system.posix_acl_access and would leave it at 0700). EOPNOTSUPP makes tools fall back to
/// chmod, as on any filesystem mounted without ACLs.
fn is_acl_xattr(name: &[u8]) -> bool {
    name.starts_with(b"system.posix_acl_")
}

fn xattr_reply(size: u32, r: Result<Vec<u8>, VolumeError>) -> Result<Xattr, Errno> {
    match r {
        Ok(v) if size == 0 => Ok(Xattr::Size(v.len() as u32)),
        Ok(v) if v.len() > size as usize => Err(Errno::ERANGE),
        Ok(v) => Ok(Xattr::Data(v)),
        Err(e) => Err(errno(e)),
    }
}

impl Operations {
    pub(crate) fn new(
        volume: Arc<ServedVolume>,
        cache: CacheMode,
        metrics: Arc<MountMetrics>,
    ) -> Self {
        let limits = Arc::new(LiveLimits::default());
        volume.set_background_sink(crate::io_limits::background_sink(&limits, &metrics));
        Self {
            volume,
            cache,
            lookups: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            listed: ListingPrefetch::default(),
            next_fh: AtomicU64::new(1),
            metrics,
            notifier: KernelNotifier::default(),
            limits,
            capability_removals: CapabilityRemovals::default(),
        }
    }

    /// The same, answering data requests within `limits`.
    pub(crate) fn with_limits(self, limits: IoLimits) -> Self {
        self.set_limits(limits);
        self
    }

    /// From now on, data requests are answered within `limits` (new, empty buckets) and take
    /// their turns by its weight (which engages the process's fair queue).
    pub(crate) fn set_limits(&self, limits: IoLimits) {
        self.limits.set(limits);
    }

    /// The limits in force.
    pub(crate) fn limits(&self) -> IoLimits {
        self.limits.get()
    }

    /// Takes what is there of a data request's tokens without waiting (see
    /// `LiveLimits::pay_ahead`): `None` once paid, else how long until more are there.
    pub(crate) fn pay_ahead(&self, bytes: u64, paid: &mut Paid) -> Option<Duration> {
        self.limits.pay_ahead(bytes, paid)
    }

    /// A data request's turn among the busy tenants', without waiting (`LiveLimits::try_turn`).
    pub(crate) fn try_turn(&self, held: &mut bool) -> Option<Turn<'_>> {
        self.limits.try_turn(held)
    }

    /// A request held for its turn is given up.
    pub(crate) fn let_go_turn(&self) {
        self.limits.let_go()
    }

    /// Waits until a data request of `bytes` is within the mount's limits, then for its turn
    /// among the busy tenants' requests (see `LiveLimits::admit`).
    fn admit(&self, bytes: u64) -> Turn<'_> {
        self.limits.admit(bytes, &self.metrics)
    }

    /// The mount's /dev/fuse, which notifications to the kernel go to.
    pub(crate) fn set_device(&self, fd: Arc<OwnedFd>) {
        self.notifier.set_device(fd);
    }

    pub(crate) fn cache(&self) -> CacheMode {
        self.cache
    }

    /// Runs one request's call into the volume. A panic in it becomes EIO for that request
    /// (logged), so the mount's worker thread, the mount and the daemon keep serving.
    fn vol<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Volume) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        let volume = self.volume.get()?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&volume))).unwrap_or_else(
            |panic| {
                let detail = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(
                    tenant = %self.volume.tenant(),
                    op = what,
                    %detail,
                    "a request panicked; it fails with EIO, the mount keeps serving"
                );
                Err(VolumeError::Panicked(what))
            },
        )
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.crtime,
            kind: file_type(a.kind),
            perm: a.perm,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: self.volume.block_size(),
            flags: 0,
        }
    }

    fn remember(&self, ino: u64) {
        let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
        *l.entry(ino).or_insert(0) += 1;
    }

    /// An entry handed to the kernel counts as one lookup reference.
    fn entry(&self, r: Result<Attr, VolumeError>) -> Result<FileAttr, Errno> {
        let a = r.map_err(errno)?;
        self.remember(a.ino);
        Ok(self.attr(&a))
    }

    fn open_flags(&self) -> FopenFlags {
        match self.cache {
            CacheMode::Direct => FopenFlags::FOPEN_DIRECT_IO,
            CacheMode::Kernel => FopenFlags::FOPEN_KEEP_CACHE,
        }
    }

    /// Makes everything durable when the session ends (a dormant store is, and stays closed).
    pub(crate) fn destroy(&self) {
        if let Some(Err(e)) = self.volume.if_awake(|v| v.fsync()) {
            tracing::error!(error = %e, "final sync failed");
        }
    }

    pub(crate) fn lookup(&self, parent: u64, name: &[u8]) -> Result<FileAttr, Errno> {
        let t = Instant::now();
        let r = self.vol("lookup", |v| v.lookup(parent, name));
        // A missing name is an answer, not an error.
        let ok = r.is_ok() || matches!(r, Err(VolumeError::NotFound));
        let r = self.entry(r);
        self.metrics.record(Op::Lookup, t, ok);
        r
    }

    pub(crate) fn forget(&self, ino: u64, nlookup: u64) {
        let gone = {
            let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
            match l.get_mut(&ino) {
                Some(n) if *n > nlookup => {
                    *n -= nlookup;
                    false
                }
                Some(_) => {
                    l.remove(&ino);
                    true
                }
                None => true,
            }
        };
        if gone && self.volume.forget_needs_store(ino) {
            if let Err(e) = self.vol("forget", |v| v.forget(ino)) {
                tracing::error!(ino, error = %e, "cannot free a removed file");
            }
        }
    }

    pub(crate) fn getattr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let t = Instant::now();
        let r = self.vol("getattr", |v| v.getattr(ino));
        self.metrics.record(Op::Getattr, t, r.is_ok());
        r.map(|a| self.attr(&a)).map_err(errno)
    }

    pub(crate) fn setattr(
        &self,
        ino: u64,
        set: &SetAttr,
        clearing: Option<Clearing<'_>>,
    ) -> Result<FileAttr, Errno> {
        self.vol("setattr", |v| v.setattr_clearing(ino, set, clearing))
            .map(|a| self.attr(&a))
            .map_err(errno)
    }

    pub(crate) fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        self.vol("readlink", |v| v.readlink(ino)).map_err(errno)
    }

    pub(crate) fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        owner: Owner,
    ) -> Result<FileAttr, Errno> {
        let kind = kind_from_mode(mode).ok_or(Errno::EINVAL)?;
        let perm = (mode & 0o7777) as u16;
        self.entry(self.vol("mknod", |v| v.mknod(parent, name, kind, perm, owner, rdev)))
    }

    pub(crate) fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        owner: Owner,
    ) -> Result<FileAttr, Errno> {
        let perm = (mode & 0o7777) as u16;
        self.entry(self.vol("mkdir", |v| v.mkdir(parent, name, perm, owner)))
    }

    pub(crate) fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        let t = Instant::now();
        let r = self.vol("unlink", |v| v.unlink(parent, name));
        self.metrics.record(Op::Unlink, t, r.is_ok());
        r.map_err(errno)
    }

    pub(crate) fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.vol("rmdir", |v| v.rmdir(parent, name)).map_err(errno)
    }

    pub(crate) fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<FileAttr, Errno> {
        self.entry(self.vol("symlink", |v| v.symlink(parent, name, target, owner)))
    }

    pub(crate) fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        let mode = rename_mode(flags)?;
        self.vol("rename", |v| {
            v.rename(parent, name, new_parent, new_name, mode)
        })
        .map_err(errno)
    }

    pub(crate) fn link(
        &self,
        ino: u64,
        new_parent: u64,
        new_name: &[u8],
    ) -> Result<FileAttr, Errno> {
        self.entry(self.vol("link", |v| v.link(ino, new_parent, new_name)))
    }

    pub(crate) fn open(&self, ino: u64) -> Result<Opened, Errno> {
        match self.vol("getattr", |v| v.getattr(ino)) {
            Ok(a) if a.kind == FileKind::Dir => Err(Errno::EISDIR),
            Ok(_) => Ok(Opened {
                fh: 0,
                flags: self.open_flags(),
            }),
            Err(e) => Err(errno(e)),
        }
    }

    /// Reads into `out` (cleared first); counts the bytes.
    pub(crate) fn read(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Errno> {
        let turn = self.admit(size.into());
        // A read answered again (its disk reads made by the ring) counts from its first answer.
        let t = crate::serving::answering_since().unwrap_or_else(Instant::now);
        if offset == 0 {
            self.warm_after(ino);
        }
        let r = self.vol("read", |v| v.read_into(ino, offset, size, out));
        if matches!(&r, Err(VolumeError::Store(e)) if e.is_deferred()) {
            // Counted when it is answered again (its turn is the ring's: `connection`).
            drop(turn);
            return Err(Errno::EAGAIN);
        }
        self.metrics.record(Op::Read, t, r.is_ok());
        if r.is_ok() {
            self.metrics.add_read_bytes(out.len() as u64);
        }
        r.map_err(errno)
    }

    /// A read of `ino` from its start: warms the small files listed after it.
    fn warm_after(&self, ino: u64) {
        let files = self.listed.reading(ino);
        if !files.is_empty() {
            let _ = self.vol("read", |v| {
                v.warm_files(files);
                Ok(())
            });
        }
    }

    /// copy_file_range(2) within the mount (`cp` copies with it): the bytes go from file to
    /// file in the daemon, not through the kernel as a READ and a WRITE per piece. At most
    /// [`COPY_MAX`] per request (the caller asks again); a failure after some bytes were
    /// copied reports those, as a short write does.
    pub(crate) fn copy_range(
        &self,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u32, Errno> {
        let len = len.min(COPY_MAX);
        let _turn = self.admit(len);
        let t = Instant::now();
        if off_in == 0 {
            self.warm_after(ino_in);
        }
        let mut done = 0u64;
        let mut buf = Vec::new();
        let r = self.vol("copy_file_range", |v| {
            while done < len {
                let piece = (len - done).min(COPY_PIECE) as u32;
                v.read_into(ino_in, off_in + done, piece, &mut buf)?;
                if buf.is_empty() {
                    break;
                }
                done += u64::from(v.write_file(ino_out, off_out + done, &buf, None)?.0);
                if buf.len() < piece as usize {
                    break; // the source's end
                }
            }
            Ok(())
        });
        let ok = r.is_ok() || done > 0;
        self.metrics.record(Op::Write, t, ok);
        self.metrics.add_read_bytes(done);
        self.metrics.add_written_bytes(done);
        match r {
            Err(e) if done == 0 => Err(errno(e)),
            _ => Ok(done as u32),
        }
    }

    pub(crate) fn write(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        clearing: Option<Clearing<'_>>,
    ) -> Result<u32, Errno> {
        let _turn = self.admit(data.len() as u64);
        let t = Instant::now();
        let r = self.vol("write", |v| v.write_file(ino, offset, data, clearing));
        if let Ok((_, true)) = r {
            // Exec would still see the bit in the kernel's cached mode.
            self.notifier.forget_attributes(ino);
        }
        let r = r.map(|(n, _)| n);
        self.metrics.record(Op::Write, t, r.is_ok());
        if let Ok(n) = r {
            self.metrics.add_written_bytes(n.into());
        }
        r.map_err(errno)
    }

    /// fsync and fsyncdir: the store syncs as a whole.
    pub(crate) fn fsync(&self) -> Result<(), Errno> {
        let t = Instant::now();
        let r = self.vol("fsync", |v| v.fsync());
        self.metrics.record(Op::Fsync, t, r.is_ok());
        r.map_err(errno)
    }

    pub(crate) fn opendir(&self, ino: u64) -> Result<Opened, Errno> {
        let listing = self.vol("readdir", |v| v.readdir(ino)).and_then(|entries| {
            let attr = self.vol("getattr", |v| v.getattr(ino))?;
            let mut all = Vec::with_capacity(entries.len() + 2);
            all.push(DirEntry {
                name: b".".to_vec(),
                ino,
                kind: FileKind::Dir,
            });
            all.push(DirEntry {
                name: b"..".to_vec(),
                ino: attr.parent,
                kind: FileKind::Dir,
            });
            all.extend(entries);
            Ok(all)
        });
        let all = listing.map_err(errno)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, all);
        Ok(Opened {
            fh,
            flags: FopenFlags::empty(),
        })
    }

    /// Hands the directory's entries from `offset` on to `add(ino, next offset, type, name)`
    /// until it says the reply is full.
    pub(crate) fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, FileType, &[u8]) -> bool,
    ) -> Result<(), Errno> {
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let entries = dirs.get(&fh).ok_or(Errno::EBADF)?;
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if add(e.ino, (i + 1) as u64, file_type(e.kind), &e.name) {
                break;
            }
        }
        Ok(())
    }

    /// Like [`Self::readdir`] with each entry's attributes: `add(next offset, name, attr)`.
    /// An entry the kernel accepts counts as a lookup.
    pub(crate) fn readdirplus(
        &self,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, &[u8], &FileAttr) -> bool,
    ) -> Result<(), Errno> {
        let entries: Vec<(usize, DirEntry)> = {
            let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
            let entries = dirs.get(&fh).ok_or(Errno::EBADF)?;
            entries
                .iter()
                .cloned()
                .enumerate()
                .skip(offset as usize)
                .collect()
        };
        // Open a dormant store first: a store that does not open fails the request, rather
        // than each entry looking removed.
        drop(self.volume.get().map_err(errno)?);
        let mut small = Vec::new();
        for (i, e) in entries {
            // An entry removed since opendir is skipped.
            let Ok(a) = self.vol("getattr", |v| v.getattr(e.ino)) else {
                continue;
            };
            let dot = e.name == b"." || e.name == b"..";
            if add((i + 1) as u64, &e.name, &self.attr(&a)) {
                break;
            }
            if !dot {
                self.remember(e.ino);
            }
            if a.kind == FileKind::File && a.size > 0 && a.size <= listing_prefetch::SMALL {
                small.push((e.ino, a.size));
            }
        }
        self.listed.listed(fh, offset == 0, &small);
        Ok(())
    }

    pub(crate) fn releasedir(&self, fh: u64) {
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
    }

    pub(crate) fn statfs(&self) -> Result<StatFs, Errno> {
        self.volume.statfs().map_err(errno)
    }

    pub(crate) fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        if is_acl_xattr(name) {
            return Err(Errno::EOPNOTSUPP);
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return Err(Errno::EINVAL),
        };
        self.vol("setxattr", |v| v.setxattr(ino, name, value, mode))
            .map_err(errno)
    }

    pub(crate) fn getxattr(&self, ino: u64, name: &[u8], size: u32) -> Result<Xattr, Errno> {
        if is_acl_xattr(name) {
            return Err(Errno::EOPNOTSUPP);
        }
        xattr_reply(size, self.vol("getxattr", |v| v.getxattr(ino, name)))
    }

    pub(crate) fn listxattr(&self, ino: u64, size: u32) -> Result<Xattr, Errno> {
        let names = self.vol("listxattr", |v| v.listxattr(ino)).map(|list| {
            list.split_inclusive(|&b| b == 0)
                .filter(|n| !is_acl_xattr(n.strip_suffix(&[0]).unwrap_or(n)))
                .flatten()
                .copied()
                .collect()
        });
        xattr_reply(size, names)
    }

    pub(crate) fn removexattr(&self, ino: u64, name: &[u8]) -> Result<(), Errno> {
        if is_acl_xattr(name) {
            return Err(Errno::EOPNOTSUPP);
        }
        self.vol("removexattr", |v| v.removexattr(ino, name))
            .map_err(errno)
    }

    /// Permission bits are enforced by the kernel (default_permissions); this only says
    /// whether the inode exists.
    pub(crate) fn access(&self, ino: u64) -> Result<(), Errno> {
        self.vol("getattr", |v| v.getattr(ino))
            .map(drop)
            .map_err(errno)
    }

    pub(crate) fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        owner: Owner,
    ) -> Result<(FileAttr, Opened), Errno> {
        let t = Instant::now();
        let perm = (mode & 0o7777) as u16;
        let r = self.vol("mknod", |v| {
            v.mknod(parent, name, FileKind::File, perm, owner, 0)
        });
        self.metrics.record(Op::Create, t, r.is_ok());
        let attr = self.entry(r)?;
        Ok((
            attr,
            Opened {
                fh: 0,
                flags: self.open_flags(),
            },
        ))
    }

    pub(crate) fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let op = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Fallocate::Allocate { keep_size },
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Fallocate::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Fallocate::ZeroRange { keep_size },
            _ => return Err(Errno::EOPNOTSUPP),
        };
        self.vol("fallocate", |v| v.fallocate(ino, offset, length, op))
            .map_err(errno)
    }

    pub(crate) fn lseek(&self, ino: u64, offset: i64, whence: i32) -> Result<u64, Errno> {
        if offset < 0 {
            return Err(Errno::ENXIO);
        }
        let offset = offset as u64;
        match whence {
            libc::SEEK_DATA => self.vol("seek_data", |v| v.seek_data(ino, offset)),
            libc::SEEK_HOLE => self.vol("seek_hole", |v| v.seek_hole(ino, offset)),
            libc::SEEK_SET => Ok(offset),
            _ => return Err(Errno::EINVAL),
        }
        .map_err(errno)
    }
}

/// Turns a FUSE time argument (seconds, nanoseconds since the epoch) into a SystemTime.
pub(crate) fn system_time(secs: u64, nanos: u32) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
}

/// Operations over a fresh tenant in a temporary data dir (kept alive by the guard).
#[cfg(test)]
pub(crate) fn test_operations() -> (crate::volume::TestStore, Arc<Operations>) {
    let store = crate::volume::TestStore::new();
    let volume = ServedVolume::new(store.open(), None);
    let ops = Operations::new(Arc::new(volume), CacheMode::Direct, MountMetrics::new());
    (store, Arc::new(ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_request_is_eio_and_the_volume_keeps_serving() {
        let (_tmp, ops) = test_operations();
        let r: Result<(), VolumeError> = ops.vol("test", |_| panic!("injected"));
        let e = r.unwrap_err();
        assert!(matches!(e, VolumeError::Panicked("test")), "{e}");
        assert_eq!(e.errno(), libc::EIO);
        // The same volume answers the next request.
        let a = ops.getattr(crate::volume::ROOT_INO).unwrap();
        assert_eq!(a.kind, FileType::Directory);
    }

    #[test]
    fn rename_flags_map_to_modes_and_unknown_ones_are_refused() {
        assert!(matches!(rename_mode(0), Ok(RenameMode::Replace)));
        assert!(matches!(
            rename_mode(libc::RENAME_NOREPLACE),
            Ok(RenameMode::NoReplace)
        ));
        assert!(matches!(
            rename_mode(libc::RENAME_EXCHANGE),
            Ok(RenameMode::Exchange)
        ));
        assert_eq!(
            rename_mode(libc::RENAME_WHITEOUT).unwrap_err(),
            Errno::EINVAL
        );
    }
}
