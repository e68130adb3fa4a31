//! The values a volume's operations take and return: inode attributes, kinds, directory
//! entries, the changes a setattr asks for, rename and xattr modes, fallocate modes, statfs,
//! and the source of base blocks a volume may share with a base image.

use std::time::SystemTime;

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
    pub(super) fn from_u8(v: u8) -> Option<Self> {
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

#[cfg(test)]
impl Attr {
    /// A file `ino` of `kind`, 0644, root's, one link, empty, every time the epoch: for unit
    /// tests to change what they look at.
    pub(crate) fn for_tests(ino: u64, kind: FileKind) -> Self {
        let t = SystemTime::UNIX_EPOCH;
        Self {
            ino,
            kind,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            rdev: 0,
            parent: 1,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            blocks: 0,
        }
    }
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
