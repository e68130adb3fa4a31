//! FUSE requests <-> [`Volume`] calls: attribute conversion, errno mapping, lookup counts and
//! directory handles. No filesystem logic lives here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::metrics::{MountMetrics, Op};
use crate::volume::{
    Attr, DirEntry, Fallocate, FileKind, Owner, RenameMode, SetAttr, Volume, VolumeError, XattrMode,
};

/// How long the kernel may cache attributes and entries. Every change goes through this
/// process, so the kernel's cache cannot go stale behind its back.
const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

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

/// The FUSE filesystem of one tenant.
pub struct TenantFs {
    volume: Arc<Volume>,
    cache: CacheMode,
    /// Kernel references per inode (lookups minus forgets): a removed file is freed at zero.
    lookups: Mutex<HashMap<u64, u64>>,
    /// Open directory snapshots, by handle.
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next_fh: AtomicU64,
    metrics: Arc<MountMetrics>,
}

fn errno(e: VolumeError) -> Errno {
    if let VolumeError::Store(ref err) = e {
        if err.is_no_space() {
            // Expected while the disk is full: the store's state change was logged once.
            tracing::debug!(error = %err, "store error");
        } else {
            tracing::error!(error = %err, "store error");
        }
    }
    Errno::from_i32(e.errno())
}

fn file_type(kind: FileKind) -> FileType {
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
fn is_acl_xattr(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b"system.posix_acl_")
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl TenantFs {
    pub fn new(volume: impl Into<Arc<Volume>>, cache: CacheMode) -> Self {
        Self {
            volume: volume.into(),
            cache,
            lookups: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            metrics: MountMetrics::new(),
        }
    }

    /// Counts operations into `metrics` (shared with whoever reports them).
    pub fn with_metrics(mut self, metrics: Arc<MountMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// Runs one request's call into the volume. A panic in it becomes EIO for that request
    /// (logged), so the mount's worker thread, the mount and the daemon keep serving.
    fn vol<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Volume) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&self.volume))).unwrap_or_else(
            |panic| {
                let detail = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(
                    tenant = %self.volume.tenant().info().name,
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

    fn reply_entry(&self, reply: ReplyEntry, r: Result<Attr, VolumeError>) {
        match r {
            Ok(a) => {
                self.remember(a.ino);
                reply.entry(&TTL, &self.attr(&a), Generation(0));
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open_flags(&self) -> FopenFlags {
        match self.cache {
            CacheMode::Direct => FopenFlags::FOPEN_DIRECT_IO,
            CacheMode::Kernel => FopenFlags::FOPEN_KEEP_CACHE,
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), VolumeError>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn xattr_reply(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, VolumeError>) {
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for TenantFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        // FUSE_HANDLE_KILLPRIV: the volume clears setuid/setgid on write, truncate and chown
        // itself, so the kernel does not fetch the attributes before each chown.
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_HANDLE_KILLPRIV;
        let supported = config.capabilities() & wanted;
        if let Err(missing) = config.add_capabilities(supported) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        if self.cache == CacheMode::Direct
            && !supported.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        {
            tracing::warn!(
                "kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: shared mmap of tenant files will fail"
            );
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.vol("fsync", |v| v.fsync()) {
            tracing::error!(error = %e, "final sync failed");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = Instant::now();
        let r = self.vol("lookup", |v| v.lookup(parent.0, name.as_bytes()));
        // A missing name is an answer, not an error.
        let ok = r.is_ok() || matches!(r, Err(VolumeError::NotFound));
        self.reply_entry(reply, r);
        self.metrics.record(Op::Lookup, t, ok);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let gone = {
            let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
            match l.get_mut(&ino.0) {
                Some(n) if *n > nlookup => {
                    *n -= nlookup;
                    false
                }
                Some(_) => {
                    l.remove(&ino.0);
                    true
                }
                None => true,
            }
        };
        if gone {
            if let Err(e) = self.vol("forget", |v| v.forget(ino.0)) {
                tracing::error!(ino = ino.0, error = %e, "cannot free a removed file");
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let t = Instant::now();
        let r = self.vol("getattr", |v| v.getattr(ino.0));
        self.metrics.record(Op::Getattr, t, r.is_ok());
        match r {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
            ctime,
        };
        match self.vol("setattr", |v| v.setattr(ino.0, &set)) {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.vol("readlink", |v| v.readlink(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = kind_from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let owner = Owner {
            uid: req.uid(),
            gid: req.gid(),
        };
        let r = self.vol("mknod", |v| {
            v.mknod(
                parent.0,
                name.as_bytes(),
                kind,
                (mode & 0o7777) as u16,
                owner,
                rdev,
            )
        });
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let owner = Owner {
            uid: req.uid(),
            gid: req.gid(),
        };
        let r = self
            .volume
            .mkdir(parent.0, name.as_bytes(), (mode & 0o7777) as u16, owner);
        self.reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = Instant::now();
        let r = self.vol("unlink", |v| v.unlink(parent.0, name.as_bytes()));
        self.metrics.record(Op::Unlink, t, r.is_ok());
        Self::empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            reply,
            self.vol("rmdir", |v| v.rmdir(parent.0, name.as_bytes())),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let owner = Owner {
            uid: req.uid(),
            gid: req.gid(),
        };
        let r = self.vol("symlink", |v| {
            v.symlink(
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                owner,
            )
        });
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else if flags.is_empty() {
            RenameMode::Replace
        } else {
            return reply.error(Errno::EINVAL);
        };
        Self::empty(
            reply,
            self.vol("rename", |v| {
                v.rename(
                    parent.0,
                    name.as_bytes(),
                    newparent.0,
                    newname.as_bytes(),
                    mode,
                )
            }),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(
            reply,
            self.vol("link", |v| v.link(ino.0, newparent.0, newname.as_bytes())),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.vol("getattr", |v| v.getattr(ino.0)) {
            Ok(a) if a.kind == FileKind::Dir => reply.error(Errno::EISDIR),
            Ok(_) => reply.opened(FileHandle(0), self.open_flags()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            // One reply buffer per worker, reused: a fresh 1 MiB buffer per request faulted
            // in all its pages again (one minor fault per 4 KiB read).
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let t = Instant::now();
        BUFFER.with_borrow_mut(|out| {
            let r = self.vol("read", |v| v.read_into(ino.0, offset, size, out));
            self.metrics.record(Op::Read, t, r.is_ok());
            match r {
                Ok(()) => {
                    self.metrics.add_read_bytes(out.len() as u64);
                    reply.data(out)
                }
                Err(e) => reply.error(errno(e)),
            }
            // A buffer grown by an unusually large request is not kept.
            if out.capacity() > 2 * MAX_WRITE as usize {
                *out = Vec::new();
            }
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let t = Instant::now();
        let r = self.vol("write", |v| v.write(ino.0, offset, data));
        self.metrics.record(Op::Write, t, r.is_ok());
        match r {
            Ok(n) => {
                self.metrics.add_written_bytes(n.into());
                reply.written(n)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes go straight to the store; nothing is buffered here. ENOSYS tells the kernel
        // so once: it stops sending FLUSH on every close (one round trip less per file).
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let t = Instant::now();
        let r = self.vol("fsync", |v| v.fsync());
        self.metrics.record(Op::Fsync, t, r.is_ok());
        Self::empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let listing = self
            .vol("readdir", |v| v.readdir(ino.0))
            .and_then(|entries| {
                let attr = self.vol("getattr", |v| v.getattr(ino.0))?;
                let mut all = Vec::with_capacity(entries.len() + 2);
                all.push(DirEntry {
                    name: b".".to_vec(),
                    ino: ino.0,
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
        match listing {
            Ok(all) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(fh, all);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entries) = dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(e.ino),
                (i + 1) as u64,
                file_type(e.kind),
                OsStr::from_bytes(&e.name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries: Vec<(usize, DirEntry)> = {
            let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
            let Some(entries) = dirs.get(&fh.0) else {
                return reply.error(Errno::EBADF);
            };
            entries
                .iter()
                .cloned()
                .enumerate()
                .skip(offset as usize)
                .collect()
        };
        for (i, e) in entries {
            // An entry removed since opendir is skipped.
            let Ok(a) = self.vol("getattr", |v| v.getattr(e.ino)) else {
                continue;
            };
            let dot = e.name == b"." || e.name == b"..";
            if reply.add(
                INodeNo(e.ino),
                (i + 1) as u64,
                OsStr::from_bytes(&e.name),
                &TTL,
                &self.attr(&a),
                Generation(0),
            ) {
                break;
            }
            if !dot {
                self.remember(e.ino);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let t = Instant::now();
        let r = self.vol("fsync", |v| v.fsync());
        self.metrics.record(Op::Fsync, t, r.is_ok());
        Self::empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.vol("statfs", |v| v.statfs()) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_free,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if is_acl_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        Self::empty(
            reply,
            self.vol("setxattr", |v| {
                v.setxattr(ino.0, name.as_bytes(), value, mode)
            }),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if is_acl_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        Self::xattr_reply(
            reply,
            size,
            self.vol("getxattr", |v| v.getxattr(ino.0, name.as_bytes())),
        );
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = self.vol("listxattr", |v| v.listxattr(ino.0)).map(|list| {
            list.split_inclusive(|&b| b == 0)
                .filter(|n| !is_acl_xattr(OsStr::from_bytes(n.strip_suffix(&[0]).unwrap_or(n))))
                .flatten()
                .copied()
                .collect()
        });
        Self::xattr_reply(reply, size, names);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if is_acl_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        Self::empty(
            reply,
            self.vol("removexattr", |v| v.removexattr(ino.0, name.as_bytes())),
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are enforced by the kernel (default_permissions); this only says
        // whether the inode exists.
        Self::empty(reply, self.vol("getattr", |v| v.getattr(ino.0)).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let owner = Owner {
            uid: req.uid(),
            gid: req.gid(),
        };
        let t = Instant::now();
        let r = self.vol("mknod", |v| {
            v.mknod(
                parent.0,
                name.as_bytes(),
                FileKind::File,
                (mode & 0o7777) as u16,
                owner,
                0,
            )
        });
        self.metrics.record(Op::Create, t, r.is_ok());
        match r {
            Ok(a) => {
                self.remember(a.ino);
                reply.created(
                    &TTL,
                    &self.attr(&a),
                    Generation(0),
                    FileHandle(0),
                    self.open_flags(),
                );
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let op = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Fallocate::Allocate { keep_size },
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Fallocate::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Fallocate::ZeroRange { keep_size },
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        Self::empty(
            reply,
            self.vol("fallocate", |v| v.fallocate(ino.0, offset, length, op)),
        );
    }

    /// No ioctl is supported: ENOTTY, the answer of a file that is not a terminal, which is
    /// what `isatty()` asks (Python does on every open()). fuser's default logged a warning
    /// for each and answered ENOSYS, which the kernel does not remember for ioctl.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    /// Not supported, without fuser's warning: the kernel remembers ENOSYS and stops asking
    /// (files then poll as always ready, as on a local filesystem).
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// Not supported, without fuser's warning: the kernel remembers ENOSYS and copies through
    /// read and write.
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        if offset < 0 {
            return reply.error(Errno::ENXIO);
        }
        let r = match whence {
            libc::SEEK_DATA => self.vol("seek_data", |v| v.seek_data(ino.0, offset as u64)),
            libc::SEEK_HOLE => self.vol("seek_hole", |v| v.seek_hole(ino.0, offset as u64)),
            libc::SEEK_SET => Ok(offset as u64),
            _ => return reply.error(Errno::EINVAL),
        };
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(e)),
        }
    }
}

#[cfg(test)]
mod panic_tests {
    use super::*;

    #[test]
    fn a_panicking_request_is_eio_and_the_volume_keeps_serving() {
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = tmp.path().join("data");
        crate::data_dir::DataDir::init(&root, None).unwrap();
        let data = crate::data_dir::DataDir::open(&root, None).unwrap();
        let host = crate::store::StoreHost::builder()
            .block_cache_bytes(8 << 20)
            .build();
        crate::tenants::create(&data, &host, "p", None).unwrap();
        let volume = Volume::open(crate::tenants::open(&data, &host, "p").unwrap()).unwrap();
        let fs = TenantFs::new(volume, CacheMode::Direct);
        let r: Result<(), VolumeError> = fs.vol("test", |_| panic!("injected"));
        let e = r.unwrap_err();
        assert!(matches!(e, VolumeError::Panicked("test")), "{e}");
        assert_eq!(e.errno(), libc::EIO);
        // The same volume answers the next request.
        let a = fs
            .vol("getattr", |v| v.getattr(crate::volume::ROOT_INO))
            .unwrap();
        assert_eq!(a.kind, FileKind::Dir);
    }
}
