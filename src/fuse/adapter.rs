//! fuser's requests (read from /dev/fuse) -> [`Operations`]: argument and reply conversion
//! only. At INIT it also offers the kernel FUSE over io_uring and, if the kernel takes it,
//! starts the [`Ring`] that serves requests from then on (forgets and interrupts stay on
//! /dev/fuse).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags,
    PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyPoll,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::ops::{Opened, Operations, Xattr, MAX_WRITE, TTL};
use super::ring::{Ring, Transport};
use crate::metrics::MountMetrics;
use crate::volume::{Owner, SetAttr, Volume};

pub use super::ops::CacheMode;

/// The FUSE filesystem of one tenant.
pub struct TenantFs {
    ops: Arc<Operations>,
    ring: Arc<Ring>,
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn entry(reply: ReplyEntry, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn attr(reply: ReplyAttr, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(a) => reply.attr(&TTL, &a),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn opened(reply: ReplyOpen, r: Result<Opened, Errno>) {
    match r {
        Ok(o) => reply.opened(FileHandle(o.fh), o.flags),
        Err(e) => reply.error(e),
    }
}

fn xattr(reply: ReplyXattr, r: Result<Xattr, Errno>) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(v)) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

impl TenantFs {
    /// The filesystem of `volume`, counting operations into `metrics` (shared with whoever
    /// reports them), served over `transport`.
    pub fn new(
        volume: impl Into<Arc<Volume>>,
        cache: CacheMode,
        metrics: Arc<MountMetrics>,
        transport: Transport,
    ) -> Self {
        Self {
            ops: Arc::new(Operations::new(volume.into(), cache, metrics)),
            ring: Arc::new(Ring::new(transport)),
        }
    }

    /// The ring of this filesystem: the mount hands it the session's device after mounting.
    pub(crate) fn ring(&self) -> Arc<Ring> {
        self.ring.clone()
    }

    pub fn volume(&self) -> &Volume {
        self.ops.volume()
    }
}

impl Filesystem for TenantFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        // FUSE_HANDLE_KILLPRIV: the volume clears setuid/setgid on write, truncate and chown
        // itself, so the kernel does not fetch the attributes before each chown.
        // FUSE_DO_READDIRPLUS with _AUTO: a directory listing that is followed by lookups
        // (tar c, cp -a, rm -rf, find) comes with every entry's attributes, so the kernel
        // fills its dentries from it instead of sending one LOOKUP per name.
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_HANDLE_KILLPRIV
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO;
        let mut supported = config.capabilities() & wanted;
        // FUSE over io_uring is a promise: once negotiated, the kernel holds every request
        // until each CPU's queue is registered. So the queues are set up (rings, buffers,
        // threads) before it is offered; they register as soon as this reply is in.
        if self.ring.wanted() {
            if !config
                .capabilities()
                .contains(InitFlags::FUSE_OVER_IO_URING)
            {
                tracing::warn!(
                    "the kernel does not offer FUSE over io_uring; serving over /dev/fuse"
                );
            } else {
                match self.ring.start(self.ops.clone()) {
                    Ok(queues) => {
                        tracing::info!(queues, "serving FUSE requests over io_uring");
                        supported |= InitFlags::FUSE_OVER_IO_URING;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "cannot set up the FUSE io_uring queues; serving over /dev/fuse"
                    ),
                }
            }
        }
        if let Err(missing) = config.add_capabilities(supported) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        if self.ops.cache() == CacheMode::Direct
            && !supported.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        {
            tracing::warn!(
                "kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: shared mmap of tenant files will fail"
            );
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.ring.stop();
        self.ops.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.ops.lookup(parent.0, name.as_bytes()));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ops.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(reply, self.ops.getattr(ino.0));
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
        attr(reply, self.ops.setattr(ino.0, &set));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.ops.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
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
        let r = self
            .ops
            .mknod(parent.0, name.as_bytes(), mode, rdev, owner(req));
        entry(reply, r);
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
        entry(
            reply,
            self.ops.mkdir(parent.0, name.as_bytes(), mode, owner(req)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.ops.unlink(parent.0, name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.ops.rmdir(parent.0, name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.ops.symlink(
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            owner(req),
        );
        entry(reply, r);
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
        let r = self.ops.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.ops.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        opened(reply, self.ops.open(ino.0));
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
        BUFFER.with_borrow_mut(|out| {
            match self.ops.read(ino.0, offset, size, out) {
                Ok(()) => reply.data(out),
                Err(e) => reply.error(e),
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
        match self.ops.write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
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
        empty(reply, self.ops.fsync());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        opened(reply, self.ops.opendir(ino.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.ops.readdir(fh.0, offset, |ino, next, kind, name| {
            reply.add(INodeNo(ino), next, kind, OsStr::from_bytes(name))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.ops.readdirplus(fh.0, offset, |next, name, a| {
            reply.add(a.ino, next, OsStr::from_bytes(name), &TTL, a, Generation(0))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.ops.releasedir(fh.0);
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
        empty(reply, self.ops.fsync());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.ops.statfs() {
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
            Err(e) => reply.error(e),
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
        empty(
            reply,
            self.ops.setxattr(ino.0, name.as_bytes(), value, flags),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr(reply, self.ops.getxattr(ino.0, name.as_bytes(), size));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(reply, self.ops.listxattr(ino.0, size));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.ops.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.ops.access(ino.0));
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
        match self.ops.create(parent.0, name.as_bytes(), mode, owner(req)) {
            Ok((a, o)) => reply.created(&TTL, &a, Generation(0), FileHandle(o.fh), o.flags),
            Err(e) => reply.error(e),
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
        empty(reply, self.ops.fallocate(ino.0, offset, length, mode));
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
        match self.ops.lseek(ino.0, offset, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(e),
        }
    }
}
