//! The kernel's FUSE wire format (include/uapi/linux/fuse.h, protocol 7.42), as both
//! transports carry it: byte offsets of the request structs tenantfs serves, the size of each
//! op's fixed in-struct (where /dev/fuse puts names and data after it), and encoders for the
//! replies. Little-endian fields read and written at fixed offsets, so no struct is ever
//! transmuted from bytes the kernel wrote.

use std::time::{SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType};

use crate::volume::StatFs;

/// Opcodes tenantfs reads (everything else is answered ENOSYS).
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
}

/// `struct fuse_in_header` and `struct fuse_out_header`.
pub const IN_HEADER_SIZE: usize = 40;
pub const OUT_HEADER_SIZE: usize = 16;

/// The size of an op's fixed in-struct (its first argument): over /dev/fuse a request is the
/// in-header, this struct, then the op's names or data; over the ring the kernel puts the
/// struct in the entry header's op area itself. Ops without one (LOOKUP, UNLINK, ...: names
/// only; STATFS, READLINK: nothing) and ops tenantfs does not read are 0. The sizes are those
/// of protocol 7.9 and later with the init flags tenantfs negotiates (no FUSE_SETXATTR_EXT).
pub fn fixed_in_size(op: u32) -> usize {
    use opcode::*;
    match op {
        FORGET | MKDIR | RENAME | LINK | OPEN | OPENDIR | SETXATTR | GETXATTR | LISTXATTR
        | ACCESS | INTERRUPT | BATCH_FORGET => 8,
        GETATTR | MKNOD | FSYNC | FSYNCDIR | CREATE | RENAME2 => 16,
        RELEASE | RELEASEDIR | FLUSH | LSEEK => 24,
        FALLOCATE | IOCTL => 32,
        READ | WRITE | READDIR | READDIRPLUS => 40,
        COPY_FILE_RANGE => 56,
        SETATTR => 88,
        _ => 0,
    }
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
    /// Clear setuid/setgid (FUSE_HANDLE_KILLPRIV_V2): on a chown always, on a truncate when
    /// the caller lacks CAP_FSETID.
    pub const KILL_SUIDGID: u32 = 1 << 11;
    /// Fields that name no attribute to set (a file handle, a lock owner).
    pub const NOT_ATTRIBUTES: u32 = (1 << 6) | (1 << 9);
}

/// `fuse_write_in.write_flags`: the caller lacks CAP_FSETID, so the write clears setuid and
/// setgid (FUSE_HANDLE_KILLPRIV_V2, and every write to a FOPEN_DIRECT_IO file).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// A little-endian field reader over a request's bytes; reading past the end is a malformed
/// request (EINVAL), never a panic.
#[derive(Clone, Copy)]
pub struct Fields<'a>(pub &'a [u8]);

impl Fields<'_> {
    pub fn u32(&self, at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(self.0.get(at..at + 4)?.try_into().ok()?))
    }

    pub fn u64(&self, at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(self.0.get(at..at + 8)?.try_into().ok()?))
    }
}

/// `struct fuse_in_header`, the fields the operations use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    /// The calling thread (0 for requests the kernel sends on its own).
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<Self> {
        let f = Fields(b);
        Some(Self {
            opcode: f.u32(4)?,
            unique: f.u64(8)?,
            nodeid: f.u64(16)?,
            uid: f.u32(24)?,
            gid: f.u32(28)?,
            pid: f.u32(32)?,
        })
    }
}

/// Splits `n` NUL-terminated strings off the front of a payload; the rest follows them.
pub fn names<const N: usize>(payload: &[u8]) -> Option<([&[u8]; N], &[u8])> {
    let mut out = [&payload[..0]; N];
    let mut rest = payload;
    for slot in &mut out {
        let end = rest.iter().position(|&b| b == 0)?;
        *slot = &rest[..end];
        rest = &rest[end + 1..];
    }
    Some((out, rest))
}

/// `fuse_out_header` (16 bytes) into the header's first bytes. The kernel ignores `len` on
/// the ring (the payload size is in `fuse_uring_ent_in_out`); it is set as /dev/fuse would.
pub fn put_out_header(header: &mut [u8], unique: u64, error: i32, payload: usize) {
    header[0..4].copy_from_slice(&(16 + payload as u32).to_le_bytes());
    header[4..8].copy_from_slice(&error.to_le_bytes());
    header[8..16].copy_from_slice(&unique.to_le_bytes());
}

/// FUSE_NOTIFY_INVAL_INODE for `ino`'s attributes only (offset -1: no page of its data),
/// whole, to write to /dev/fuse: an out-header with unique 0 and the notification's code in
/// place of an error, then `fuse_notify_inval_inode_out`.
pub fn inval_inode_attributes(ino: u64) -> [u8; 40] {
    const NOTIFY_INVAL_INODE: i32 = 2;
    let mut msg = [0u8; 40];
    put_out_header(&mut msg, 0, NOTIFY_INVAL_INODE, 24);
    let mut out = Out::new(&mut msg[16..]);
    out.u64(ino).u64(-1i64 as u64).u64(0);
    msg
}

/// Appends little-endian fields to a reply.
pub struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Out<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn room(&self) -> usize {
        self.buf.len() - self.len
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    fn zeros(&mut self, n: usize) -> &mut Self {
        self.buf[self.len..self.len + n].fill(0);
        self.len += n;
        self
    }
}

const FUSE_ATTR_SIZE: usize = 88;
pub const ENTRY_OUT_SIZE: usize = 40 + FUSE_ATTR_SIZE;
const DIRENT_HEADER: usize = 24;

fn mode_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// A time as (seconds, nanoseconds) since the epoch; times before it become the epoch.
fn epoch(t: SystemTime) -> (u64, u32) {
    t.duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs(), d.subsec_nanos()))
        .unwrap_or((0, 0))
}

/// `struct fuse_attr`.
fn attr(out: &mut Out, a: &FileAttr) {
    let (at, atn) = epoch(a.atime);
    let (mt, mtn) = epoch(a.mtime);
    let (ct, ctn) = epoch(a.ctime);
    out.u64(a.ino.0)
        .u64(a.size)
        .u64(a.blocks)
        .u64(at)
        .u64(mt)
        .u64(ct);
    out.u32(atn).u32(mtn).u32(ctn);
    out.u32(mode_bits(a.kind) | u32::from(a.perm))
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u32(a.rdev)
        .u32(a.blksize)
        .u32(a.flags);
}

/// `struct fuse_entry_out` (generation 0, entry and attributes valid for `ttl`).
pub fn entry_out(out: &mut Out, a: &FileAttr, ttl: std::time::Duration) {
    out.u64(a.ino.0)
        .u64(0)
        .u64(ttl.as_secs())
        .u64(ttl.as_secs());
    out.u32(ttl.subsec_nanos()).u32(ttl.subsec_nanos());
    attr(out, a);
}

/// `struct fuse_entry_out` for a name that does not exist: node id 0, which the kernel keeps
/// as a negative entry for `ttl` (an ENOENT reply it forgets at once, so the next stat or
/// open of the same missing name would ask again).
pub fn negative_entry_out(out: &mut Out, ttl: std::time::Duration) {
    out.u64(0).u64(0).u64(ttl.as_secs()).u64(0);
    out.u32(ttl.subsec_nanos()).u32(0);
    out.zeros(FUSE_ATTR_SIZE);
}

/// `struct fuse_attr_out`.
pub fn attr_out(out: &mut Out, a: &FileAttr, ttl: std::time::Duration) {
    out.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0);
    attr(out, a);
}

/// `struct fuse_open_out` (no backing file).
pub fn open_out(out: &mut Out, fh: u64, flags: u32) {
    out.u64(fh).u32(flags).u32(0);
}

/// `struct fuse_kstatfs` in `fuse_statfs_out`.
pub fn statfs_out(out: &mut Out, s: &StatFs) {
    out.u64(s.blocks)
        .u64(s.blocks_free)
        .u64(s.blocks_free)
        .u64(s.files)
        .u64(s.files_free);
    out.u32(s.block_size)
        .u32(s.name_max)
        .u32(s.block_size)
        .u32(0);
    out.zeros(24);
}

/// Room a directory entry takes: its header and name, padded to 8 bytes.
fn dirent_size(name: &[u8]) -> usize {
    (DIRENT_HEADER + name.len()).next_multiple_of(8)
}

/// `struct fuse_dirent`, if it fits; false when the reply is full.
pub fn dirent(out: &mut Out, ino: u64, next: u64, kind: FileType, name: &[u8]) -> bool {
    let size = dirent_size(name);
    if size > out.room() {
        return false;
    }
    out.u64(ino)
        .u64(next)
        .u32(name.len() as u32)
        .u32(mode_bits(kind) >> 12);
    out.bytes(name).zeros(size - DIRENT_HEADER - name.len());
    true
}

/// `struct fuse_direntplus` (entry_out then dirent), if it fits.
pub fn direntplus(
    out: &mut Out,
    next: u64,
    name: &[u8],
    a: &FileAttr,
    ttl: std::time::Duration,
) -> bool {
    if ENTRY_OUT_SIZE + dirent_size(name) > out.room() {
        return false;
    }
    entry_out(out, a, ttl);
    dirent(out, a.ino.0, next, a.kind, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::INodeNo;
    use std::time::Duration;

    fn sample() -> FileAttr {
        FileAttr {
            ino: INodeNo(7),
            size: 4096,
            blocks: 8,
            atime: UNIX_EPOCH + Duration::new(10, 1),
            mtime: UNIX_EPOCH + Duration::new(20, 2),
            ctime: UNIX_EPOCH + Duration::new(30, 3),
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 1001,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    #[test]
    fn a_negative_entry_is_node_zero_with_an_entry_timeout_and_no_attributes() {
        let mut buf = [0xffu8; 256];
        let mut out = Out::new(&mut buf);
        negative_entry_out(&mut out, Duration::from_millis(1500));
        assert_eq!(out.len(), ENTRY_OUT_SIZE);
        let f = Fields(&buf);
        assert_eq!(f.u64(0), Some(0), "nodeid 0: the name does not exist");
        assert_eq!(f.u64(16), Some(1), "entry_valid seconds");
        assert_eq!(f.u32(32), Some(500_000_000), "entry_valid_nsec");
        assert_eq!(f.u64(24), Some(0), "attr_valid");
        assert!(
            buf[40..ENTRY_OUT_SIZE].iter().all(|&b| b == 0),
            "no attributes"
        );
    }

    #[test]
    fn entry_out_has_the_kernel_layout() {
        let mut buf = [0u8; 256];
        let mut out = Out::new(&mut buf);
        entry_out(&mut out, &sample(), Duration::from_millis(1500));
        assert_eq!(out.len(), ENTRY_OUT_SIZE);
        let f = Fields(&buf);
        assert_eq!(f.u64(0), Some(7), "nodeid");
        assert_eq!(f.u64(16), Some(1), "entry_valid seconds");
        assert_eq!(f.u32(32), Some(500_000_000), "entry_valid_nsec");
        let attr = 40;
        assert_eq!(f.u64(attr + 8), Some(4096), "size");
        assert_eq!(f.u64(attr + 32), Some(20), "mtime");
        assert_eq!(f.u32(attr + 52), Some(2), "mtimensec");
        assert_eq!(f.u32(attr + 60), Some(libc::S_IFREG | 0o644), "mode");
        assert_eq!(f.u32(attr + 68), Some(1000), "uid");
        assert_eq!(f.u32(attr + 80), Some(4096), "blksize");
    }

    #[test]
    fn dirents_are_padded_to_eight_bytes_and_stop_when_full() {
        let mut buf = [0u8; 64];
        let mut out = Out::new(&mut buf);
        assert!(dirent(&mut out, 5, 1, FileType::Directory, b"abc"));
        assert_eq!(out.len(), 32);
        assert!(!dirent(
            &mut out,
            6,
            2,
            FileType::RegularFile,
            b"a-longer-name"
        ));
        assert_eq!(out.len(), 32, "a refused entry writes nothing");
        let f = Fields(&buf);
        assert_eq!(f.u32(16), Some(3), "namelen");
        assert_eq!(f.u32(20), Some(libc::DT_DIR as u32), "type");
        assert_eq!(&buf[24..27], b"abc");
    }

    #[test]
    fn names_split_nul_terminated_strings_and_refuse_unterminated_ones() {
        let (n, rest) = names::<2>(b"old\0new\0tail").unwrap();
        assert_eq!(n, [&b"old"[..], &b"new"[..]]);
        assert_eq!(rest, b"tail");
        assert!(names::<1>(b"no-terminator").is_none());
    }

    #[test]
    fn the_in_header_is_read_at_its_offsets_and_a_short_one_is_refused() {
        let mut h = [0u8; 40];
        h[4..8].copy_from_slice(&opcode::READ.to_le_bytes());
        h[8..16].copy_from_slice(&99u64.to_le_bytes());
        h[16..24].copy_from_slice(&5u64.to_le_bytes());
        h[24..28].copy_from_slice(&1000u32.to_le_bytes());
        h[28..32].copy_from_slice(&100u32.to_le_bytes());
        h[32..36].copy_from_slice(&4242u32.to_le_bytes());
        let p = InHeader::parse(&h).unwrap();
        assert_eq!(
            p,
            InHeader {
                opcode: opcode::READ,
                unique: 99,
                nodeid: 5,
                uid: 1000,
                gid: 100,
                pid: 4242,
            }
        );
        assert!(InHeader::parse(&h[..20]).is_none());
    }
}
