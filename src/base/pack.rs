//! Pack files: append-only files of sealed base blocks.
//!
//! A pack holds blocks of one size. After a 4 KiB header (magic, pack id, block size) come
//! slots of exactly one block each, so a block is one aligned read at
//! `4096 + slot * block_size` (O_DIRECT where the filesystem takes it). A slot holds only the
//! AES-256-GCM ciphertext, which is as long as the block; the nonce and tag live in the index.
//!
//! Slots are written before the index points at them, so a crash leaves at most unindexed
//! slots (garbage for `base gc`), never an index entry without its data.
//!
//! Short blocks (a small file, a file's tail: at most [`FRAGMENT_MAX`] bytes up to the last
//! non-zero one) are stored as **fragments**: several share a slot, packed one after another
//! within its 4 KiB pages (a fragment never crosses a page, so reading one is one aligned
//! 4 KiB read), each sealed on its own; the index keeps its offset and length. A base of
//! 20,000 files of 7 bytes takes 35 slots, not 20,000.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::cache::{SlabAllocator, SlabBox};

pub const HEADER_LEN: u64 = 4096;
const MAGIC: &[u8; 8] = b"TFSPACK1";
/// Slots per pack file: 1 GiB of 4 KiB blocks.
pub const MAX_SLOTS: u32 = 1 << 18;
/// The unit fragments are packed in and read by.
pub const PAGE: u32 = 4096;
/// The longest block stored as a fragment (half a page, so a page is at least half full).
pub const FRAGMENT_MAX: usize = PAGE as usize / 2;

/// How pack bytes move between memory and disk: [`PreadIo`] (`pread`/`pwrite`) or
/// [`UringIo`](super::UringIo) (io_uring on a dedicated thread); BENCHMARKS.md says which is
/// faster for which path. Buffers are page-aligned (O_DIRECT) and reads are exact: a slot is
/// always fully present, so a short read is an error.
pub trait PackIo: Send + Sync {
    fn read_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Reads each `(offset, buffer)`, e.g. a prefetch of the following blocks in one call.
    /// On error, which of the other buffers were filled depends on the engine (this default
    /// stops at the first failing read; `UringIo` completes them all).
    fn read_many(&self, file: &File, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, buf) in reads.iter_mut() {
            self.read_at(file, buf, *offset)?;
        }
        Ok(())
    }
}

/// Plain positional reads and writes.
pub struct PreadIo;

impl PackIo for PreadIo {
    fn read_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        file.read_exact_at(buf, offset)
    }
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        file.write_all_at(buf, offset)
    }
}

/// One open pack file.
pub struct Pack {
    pub id: u32,
    pub block_size: u32,
    file: File,
    path: PathBuf,
}

pub fn pack_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("pack-{id:06}.tfp"))
}

/// Opens with O_DIRECT where the filesystem takes it (the page cache must not hold a second
/// copy of base blocks: the host block cache holds them), else buffered.
fn open_file(path: &Path, create: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create_new(create);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => o.create_new(false).open(path),
        r => r,
    }
}

/// A zeroed, page-aligned buffer of `len` bytes (O_DIRECT needs aligned memory).
pub fn aligned(slabs: &SlabAllocator, len: usize) -> io::Result<SlabBox> {
    // Slab slots of 4 KiB and up, and large mappings, are page-aligned.
    slabs
        .alloc(len.max(4096))
        .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "no memory for an I/O buffer"))
}

impl Pack {
    pub fn create(dir: &Path, id: u32, block_size: u32, slabs: &SlabAllocator) -> io::Result<Self> {
        let path = pack_path(dir, id);
        let file = open_file(&path, true)?;
        let mut header = aligned(slabs, HEADER_LEN as usize)?;
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&id.to_be_bytes());
        header[12..16].copy_from_slice(&block_size.to_be_bytes());
        file.write_all_at(&header[..HEADER_LEN as usize], 0)?;
        file.sync_all()?;
        crate::fs_util::sync_dir(dir)?;
        Ok(Self {
            id,
            block_size,
            file,
            path,
        })
    }

    pub fn open(dir: &Path, id: u32, slabs: &SlabAllocator) -> io::Result<Self> {
        let path = pack_path(dir, id);
        let file = open_file(&path, false)?;
        let mut header = aligned(slabs, HEADER_LEN as usize)?;
        file.read_exact_at(&mut header[..HEADER_LEN as usize], 0)?;
        let bad = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {what}", path.display()),
            )
        };
        if &header[..8] != MAGIC {
            return Err(bad("not a tenantfs pack file (bad magic)"));
        }
        if u32::from_be_bytes(header[8..12].try_into().expect("4 bytes")) != id {
            return Err(bad("pack id in the header does not match the file name"));
        }
        let block_size = u32::from_be_bytes(header[12..16].try_into().expect("4 bytes"));
        if !block_size.is_power_of_two() || block_size < 4096 {
            return Err(bad("bad block size in the header"));
        }
        Ok(Self {
            id,
            block_size,
            file,
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where slot `slot` starts in the file.
    pub fn offset(&self, slot: u32) -> u64 {
        HEADER_LEN + slot as u64 * self.block_size as u64
    }

    /// Writes whole slots from `first` on; `data` is aligned and a multiple of the block size.
    pub fn write_slots(&self, io: &dyn PackIo, first: u32, data: &[u8]) -> io::Result<()> {
        debug_assert!(data.len().is_multiple_of(self.block_size as usize));
        io.write_at(&self.file, data, self.offset(first))
    }

    /// Reads one slot into `buf` (aligned, one block long).
    pub fn read_slot(&self, io: &dyn PackIo, slot: u32, buf: &mut [u8]) -> io::Result<()> {
        io.read_at(&self.file, buf, self.offset(slot))
    }

    /// Reads several slots in one call (`(first slot, buffer)`, each buffer aligned and a whole
    /// number of slots long: a run of consecutive slots is one read): with `UringIo` all of them
    /// are in flight at once.
    pub fn read_slots(&self, io: &dyn PackIo, reads: &mut [(u32, &mut [u8])]) -> io::Result<()> {
        let mut at: Vec<(u64, &mut [u8])> = reads
            .iter_mut()
            .map(|(slot, buf)| (self.offset(*slot), &mut **buf))
            .collect();
        self.read_many_at(io, &mut at)
    }

    /// Reads `(file offset, buffer)` ranges, each [`PAGE`]-aligned and a whole number of pages
    /// long, in one call.
    pub fn read_many_at(&self, io: &dyn PackIo, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        io.read_many(&self.file, reads)
    }

    /// Reads one [`PAGE`]-aligned range, a whole number of pages long.
    pub fn read_at(&self, io: &dyn PackIo, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        io.read_at(&self.file, buf, offset)
    }

    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Gives the disk space of `count` slots from `first` back to the filesystem (a hole; reads
    /// as zeros). The file keeps its size, so no slot moves.
    pub fn punch(&self, first: u32, count: u32) -> io::Result<()> {
        use nix::fcntl::{fallocate, FallocateFlags};
        use std::os::fd::AsRawFd;
        fallocate(
            self.file.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            self.offset(first) as i64,
            count as i64 * self.block_size as i64,
        )
        .map_err(io::Error::from)
    }

    /// Bytes the file takes on disk (holes excluded).
    pub fn allocated_bytes(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata()?.blocks() * 512)
    }

    /// Slots the file has room for (written or not).
    pub fn slots_on_disk(&self) -> io::Result<u64> {
        let len = self.file.metadata()?.len();
        Ok(len.saturating_sub(HEADER_LEN) / self.block_size as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_headers_are_checked() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let slabs = SlabAllocator::new();
        let p = Pack::create(dir.path(), 7, 4096, &slabs).unwrap();
        let mut data = aligned(&slabs, 3 * 4096).unwrap();
        for (i, b) in data.chunks_mut(4096).enumerate() {
            b.fill(i as u8 + 1);
        }
        p.write_slots(&PreadIo, 2, &data).unwrap();
        p.sync().unwrap();
        assert_eq!(p.slots_on_disk().unwrap(), 5);
        drop(p);
        let p = Pack::open(dir.path(), 7, &slabs).unwrap();
        let mut buf = aligned(&slabs, 4096).unwrap();
        p.read_slot(&PreadIo, 3, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 2));
        assert!(
            Pack::create(dir.path(), 7, 4096, &slabs).is_err(),
            "never overwritten"
        );
        let engines: [&dyn PackIo; 2] = [&PreadIo, &crate::base::UringIo::new().unwrap()];
        for io in engines {
            let (mut a, mut b) = (
                aligned(&slabs, 4096).unwrap(),
                aligned(&slabs, 4096).unwrap(),
            );
            p.read_slots(io, &mut [(4, &mut a[..4096]), (2, &mut b[..4096])])
                .unwrap();
            assert!(a[..4096].iter().all(|&x| x == 3) && b[..4096].iter().all(|&x| x == 1));
        }
        std::fs::rename(pack_path(dir.path(), 7), pack_path(dir.path(), 8)).unwrap();
        let e = Pack::open(dir.path(), 8, &slabs).err().unwrap();
        assert!(e.to_string().contains("does not match"), "{e}");
    }
}
