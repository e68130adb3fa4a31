//! How the filesystem model is laid out in a tenant store's column families.
//!
//! ```text
//! inodes   ino (u64 BE)                      -> Attr record (below)
//! dirents  parent ino (u64 BE) ‖ name bytes  -> child ino (u64 BE) ‖ kind (u8)
//! extents  ino (u64 BE) ‖ block index (u64 BE) -> one of
//!            private bytes: the block's bytes up to its last non-zero byte (so the value
//!                   ends in a non-zero byte; the rest of the block reads as zeros). A full
//!                   4 KiB block is a 4,096-byte value: one 4 KiB slot in the blob cache.
//!            payload ‖ tag (u8) ‖ 0x00: anything else, told apart by its final zero byte;
//!                   tag 1: reference to a base block (opaque to the volume: the base
//!                   module's hash ‖ pack ‖ slot ‖ nonce ‖ tag), read through `BaseBlocks`
//!          absent: a hole (reads as zeros)
//!          ino (u64 BE) ‖ first block (u64 BE) ‖ 'c' -> a chunk: the bytes of the
//!                   `CHUNK_BYTES / block size` blocks from `first block` (a multiple of that
//!                   count) up to their last non-zero byte. Written for a write that covers the
//!                   whole aligned chunk (streaming I/O: one 64 KiB value, not 16 of 4 KiB).
//!                   A chunk write deletes the block keys it covers; a smaller write puts
//!                   block keys over the chunk, merged into it later (`fold`); a hole into
//!                   a chunk splits it into block keys. A read takes the chunk and block
//!                   keys of its range; a block key, where both exist, wins.
//!                   (Format 3; format 2 stores hold block keys only and are read as they are.)
//!            or, for a chunk of a bulk write (format 5): extent span (file u64 BE ‖ offset
//!                   u64 BE ‖ length u32 BE ‖ per 4 KiB piece the low 32 bits of its XXH3,
//!                   u32 BE each) ‖ 3 ‖ 0x00: the chunk's bytes are in the store's extent file
//!                   `file` from `offset` (see `store::extents`), written there before this
//!                   value was; a read checks only the pieces it takes.
//!                   Format 4 wrote (file ‖ offset ‖ length ‖ XXH3 of the whole span u64 BE)
//!                   ‖ 2 ‖ 0x00, read whole; such values are read as they are, and a chunk
//!                   moved by extent collection is written in the new form.
//!          Values of 2 KiB and more are kept in RocksDB blob files (BlobDB): written once at
//!          flush, never rewritten by compaction, read with O_DIRECT (see `store::host`).
//! meta     "volume"                          -> format version (u32 BE) ‖ block size (u32 BE)
//!          "O" ‖ ino                         -> (empty) orphan: nlink 0, still open
//!          "X" ‖ ino ‖ name                  -> xattr value
//!          "grafting"                        -> base name, while a base tree is grafted in
//!          "usage"                           -> version (u8) ‖ closed (u8) ‖ bytes (u64 BE) ‖
//!                   inodes (u64 BE): what the files take, whole only when closed is 1
//!                   (see `usage`)
//! ```
//!
//! Big-endian integers keep keys of one inode together and in block order, so a file's extents
//! and a directory's entries are one range scan.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Attr, FileKind};
use crate::store::{ExtentSpan, SpanCheck};

pub(crate) const VOLUME_KEY: &[u8] = b"volume";
/// Version 5: a chunk value in an extent file may carry a checksum per 4 KiB piece (tag 3).
/// Version 4 added chunk values naming their bytes in an extent file (tag 2, one checksum);
/// version 3 chunk keys (a 64 KiB value for a whole aligned run) beside block keys. Versions 2
/// (block keys only) to 4 read the same way and are taken over by writing 5 at open (an older
/// binary would misread or refuse a newer value, so it refuses the store by its version).
/// Version 1 put a leading tag byte before every extent value and is refused.
pub(crate) const FORMAT_VERSION: u32 = 5;
/// The oldest format a store is migrated from (by rewriting its version: its keys read as they
/// are).
pub(crate) const FORMAT_MIGRATES_FROM: u32 = 2;
/// File bytes one chunk value holds (when the volume's blocks are smaller).
pub(crate) const CHUNK_BYTES: u64 = 64 << 10;
const CHUNK_TAG: u8 = b'c';
const ATTR_VERSION: u8 = 1;
const ATTR_FIXED: usize = 84;

pub(crate) const EXTENT_BASE: u8 = 1;
/// Tag of a chunk value that names its bytes in an extent file with one checksum (format 4).
pub(crate) const EXTENT_STORED: u8 = 2;
/// Tag of a chunk value that names its bytes in an extent file with a checksum per 4 KiB
/// piece (format 5).
pub(crate) const EXTENT_STORED_PIECES: u8 = 3;
/// Present while a tree from a base image is being grafted into a new volume.
pub(crate) const GRAFTING_KEY: &[u8] = b"grafting";
/// What the files take, stored at close (see `usage`).
pub(crate) const USAGE_KEY: &[u8] = b"usage";

pub(crate) fn ino_key(ino: u64) -> [u8; 8] {
    ino.to_be_bytes()
}

pub(crate) fn dirent_key(parent: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + name.len());
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name);
    k
}

/// `[start, end)` of every dirent key of `parent`.
pub(crate) fn dirent_range(parent: u64) -> ([u8; 8], [u8; 8]) {
    (parent.to_be_bytes(), (parent + 1).to_be_bytes())
}

pub(crate) fn dirent_value(child: u64, kind: FileKind) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[..8].copy_from_slice(&child.to_be_bytes());
    v[8] = kind as u8;
    v
}

pub(crate) fn decode_dirent(v: &[u8]) -> Option<(u64, FileKind)> {
    if v.len() != 9 {
        return None;
    }
    Some((
        u64::from_be_bytes(v[..8].try_into().ok()?),
        FileKind::from_u8(v[8])?,
    ))
}

pub(crate) fn extent_key(ino: u64, block: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k[8..].copy_from_slice(&block.to_be_bytes());
    k
}

pub(crate) fn chunk_key(ino: u64, first_block: u64) -> [u8; 17] {
    let mut k = [CHUNK_TAG; 17];
    k[..16].copy_from_slice(&extent_key(ino, first_block));
    k
}

/// What an extents-family key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentKey {
    /// One block, by index.
    Block(u64),
    /// The chunk starting at this block index.
    Chunk(u64),
}

pub(crate) fn decode_extent_key(k: &[u8]) -> Option<ExtentKey> {
    let block = u64::from_be_bytes(k.get(8..16)?.try_into().ok()?);
    match k.len() {
        16 => Some(ExtentKey::Block(block)),
        17 if k[16] == CHUNK_TAG => Some(ExtentKey::Chunk(block)),
        _ => None,
    }
}

/// A block or chunk key without a heap allocation (a read looks up hundreds).
#[derive(Clone, Copy)]
pub(crate) struct LookupKey {
    bytes: [u8; 17],
    len: u8,
}

impl AsRef<[u8]> for LookupKey {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The keys that may hold blocks `first..=last` of `ino`, in ascending order: each block's key
/// and, when chunks are in use (`chunk_blocks > 1`), the key of each chunk overlapping the
/// range; with what each key names.
pub(crate) fn lookup_keys(
    ino: u64,
    first: u64,
    last: u64,
    chunk_blocks: u64,
) -> (Vec<LookupKey>, Vec<ExtentKey>) {
    let chunked = chunk_blocks > 1;
    let start = if chunked {
        first - first % chunk_blocks
    } else {
        first
    };
    let n = (last - start + 1) as usize;
    let mut keys = Vec::with_capacity(n + n / chunk_blocks as usize + 1);
    let mut names = Vec::with_capacity(keys.capacity());
    for block in start..=last {
        // A block key sorts just before the chunk key starting at the same block (a prefix).
        if block >= first {
            let mut bytes = [0u8; 17];
            bytes[..16].copy_from_slice(&extent_key(ino, block));
            keys.push(LookupKey { bytes, len: 16 });
            names.push(ExtentKey::Block(block));
        }
        if chunked && block.is_multiple_of(chunk_blocks) {
            keys.push(LookupKey {
                bytes: chunk_key(ino, block),
                len: 17,
            });
            names.push(ExtentKey::Chunk(block));
        }
    }
    (keys, names)
}

/// What an extent value holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Extent<'a> {
    /// The block's bytes up to its last non-zero one.
    Private(&'a [u8]),
    /// A reference to a block of a base image.
    Base(&'a [u8]),
}

/// The value of a private block holding `data` (`None`: all zeros, a hole).
pub(crate) fn private_extent(data: &[u8]) -> Option<&[u8]> {
    data.iter()
        .rposition(|&x| x != 0)
        .map(|last| &data[..=last])
}

/// The value of a block shared with a base image.
pub(crate) fn base_extent(reference: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(reference.len() + 2);
    v.extend_from_slice(reference);
    v.extend_from_slice(&[EXTENT_BASE, 0]);
    v
}

pub(crate) fn decode_extent(value: &[u8]) -> Option<Extent<'_>> {
    match value {
        [.., last] if *last != 0 => Some(Extent::Private(value)),
        [reference @ .., EXTENT_BASE, 0] => Some(Extent::Base(reference)),
        _ => None,
    }
}

/// What a chunk value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk<'a> {
    /// The chunk's bytes up to its last non-zero one.
    Bytes(&'a [u8]),
    /// Where its bytes are in the store's extent files.
    Stored(ExtentSpan),
}

/// The value of a chunk whose bytes were written into an extent file at `span`.
pub(crate) fn stored_chunk(span: ExtentSpan) -> Vec<u8> {
    let mut v = span.encode();
    v.push(match span.check {
        SpanCheck::Whole(_) => EXTENT_STORED,
        SpanCheck::Pieces(_) => EXTENT_STORED_PIECES,
    });
    v.push(0);
    v
}

/// A chunk value, or `None` when it is neither form (damaged).
pub(crate) fn decode_chunk(value: &[u8]) -> Option<Chunk<'_>> {
    match value {
        [.., last] if *last != 0 => Some(Chunk::Bytes(value)),
        [span @ .., EXTENT_STORED, 0] => ExtentSpan::decode_whole(span).map(Chunk::Stored),
        [span @ .., EXTENT_STORED_PIECES, 0] => ExtentSpan::decode_pieces(span).map(Chunk::Stored),
        _ => None,
    }
}

pub(crate) fn orphan_key(ino: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = b'O';
    k[1..].copy_from_slice(&ino.to_be_bytes());
    k
}

pub(crate) fn xattr_prefix(ino: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = b'X';
    k[1..].copy_from_slice(&ino.to_be_bytes());
    k
}

pub(crate) fn xattr_key(ino: u64, name: &[u8]) -> Vec<u8> {
    let mut k = xattr_prefix(ino).to_vec();
    k.extend_from_slice(name);
    k
}

fn put_time(out: &mut Vec<u8>, t: SystemTime) {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                (-(d.as_secs() as i64), 0)
            } else {
                (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    };
    out.extend_from_slice(&secs.to_be_bytes());
    out.extend_from_slice(&nanos.to_be_bytes());
}

fn get_time(b: &[u8]) -> SystemTime {
    let secs = i64::from_be_bytes(b[..8].try_into().unwrap());
    let nanos = u32::from_be_bytes(b[8..12].try_into().unwrap()).min(999_999_999);
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nanos.into())
    }
}

pub(crate) fn encode_attr(a: &Attr, symlink_target: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(ATTR_FIXED + symlink_target.map_or(0, <[u8]>::len));
    out.push(ATTR_VERSION);
    out.push(a.kind as u8);
    out.extend_from_slice(&a.perm.to_be_bytes());
    out.extend_from_slice(&a.uid.to_be_bytes());
    out.extend_from_slice(&a.gid.to_be_bytes());
    out.extend_from_slice(&a.nlink.to_be_bytes());
    out.extend_from_slice(&a.size.to_be_bytes());
    out.extend_from_slice(&a.rdev.to_be_bytes());
    out.extend_from_slice(&a.parent.to_be_bytes());
    for t in [a.atime, a.mtime, a.ctime, a.crtime] {
        put_time(&mut out, t);
    }
    debug_assert_eq!(out.len(), ATTR_FIXED);
    if let Some(t) = symlink_target {
        out.extend_from_slice(t);
    }
    out
}

/// Decodes an inode record: its attributes and, for symlinks, the target.
pub(crate) fn decode_attr(ino: u64, b: &[u8]) -> Option<(Attr, &[u8])> {
    if b.len() < ATTR_FIXED || b[0] != ATTR_VERSION {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
    let attr = Attr {
        ino,
        kind: FileKind::from_u8(b[1])?,
        perm: u16::from_be_bytes([b[2], b[3]]),
        uid: u32_at(4),
        gid: u32_at(8),
        nlink: u32_at(12),
        size: u64_at(16),
        rdev: u32_at(24),
        parent: u64_at(28),
        atime: get_time(&b[36..48]),
        mtime: get_time(&b[48..60]),
        ctime: get_time(&b[60..72]),
        crtime: get_time(&b[72..84]),
        blocks: 0,
    };
    Some((attr, &b[ATTR_FIXED..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_round_trip() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let before = UNIX_EPOCH - Duration::new(5, 250_000_000);
        let a = Attr {
            ino: 42,
            kind: FileKind::Symlink,
            perm: 0o4755,
            uid: 1000,
            gid: 100,
            nlink: 3,
            size: u64::MAX - 1,
            rdev: 7,
            parent: 9,
            atime: t,
            mtime: before,
            ctime: UNIX_EPOCH,
            crtime: t,
            blocks: 0,
        };
        let enc = encode_attr(&a, Some(b"/target"));
        let (b, target) = decode_attr(42, &enc).unwrap();
        assert_eq!(b, a);
        assert_eq!(target, b"/target");
        assert!(decode_attr(1, &enc[..20]).is_none());
    }

    #[test]
    fn extent_values_round_trip() {
        let mut block = vec![0u8; 4096];
        assert_eq!(private_extent(&block), None);
        block[4095] = 7;
        assert_eq!(
            private_extent(&block).unwrap().len(),
            4096,
            "a full block is untagged"
        );
        assert_eq!(decode_extent(&block), Some(Extent::Private(&block[..])));
        block[4095] = 0;
        block[10] = 1;
        let v = private_extent(&block).unwrap();
        assert_eq!(v.len(), 11);
        assert_eq!(decode_extent(v), Some(Extent::Private(v)));
        let r = base_extent(b"ref\0\0");
        assert_eq!(decode_extent(&r), Some(Extent::Base(&b"ref\0\0"[..])));
        // Neither form: an unknown tag, an empty value.
        assert_eq!(decode_extent(&[1, 9, 0]), None);
        assert_eq!(decode_extent(&[]), None);
    }

    #[test]
    fn lookup_keys_are_sorted_and_named() {
        let (keys, names) = lookup_keys(9, 14, 33, 16);
        let bytes: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        assert!(bytes.windows(2).all(|w| w[0] < w[1]), "not ascending");
        let decoded: Vec<ExtentKey> = bytes
            .iter()
            .map(|k| decode_extent_key(k).unwrap())
            .collect();
        assert_eq!(decoded, names);
        // Chunks 0, 16 and 32 overlap blocks 14..=33; blocks before 14 are not looked up.
        let chunks: Vec<u64> = names
            .iter()
            .filter_map(|n| match n {
                ExtentKey::Chunk(c) => Some(*c),
                ExtentKey::Block(_) => None,
            })
            .collect();
        assert_eq!(chunks, [0, 16, 32]);
        assert_eq!(names.len() - chunks.len(), 20);
        // Without chunks: the blocks alone.
        let (keys, names) = lookup_keys(9, 14, 33, 1);
        assert_eq!(keys.len(), 20);
        assert!(names.iter().all(|n| matches!(n, ExtentKey::Block(_))));
    }

    #[test]
    fn keys_sort_by_inode_then_block() {
        assert!(chunk_key(1, u64::MAX).as_slice() < extent_key(2, 0).as_slice());
        assert!(extent_key(1, 16).as_slice() < chunk_key(1, 16).as_slice());
        assert!(chunk_key(1, 16).as_slice() < extent_key(1, 17).as_slice());
        assert_eq!(
            decode_extent_key(&extent_key(3, 5)),
            Some(ExtentKey::Block(5))
        );
        assert_eq!(
            decode_extent_key(&chunk_key(3, 16)),
            Some(ExtentKey::Chunk(16))
        );
        assert_eq!(decode_extent_key(&[0; 17]), None);
        assert!(extent_key(1, u64::MAX) < extent_key(2, 0));
        assert!(extent_key(1, 255) < extent_key(1, 256));
        let (s, e) = dirent_range(5);
        assert!(dirent_key(5, b"\xff\xff").as_slice() < &e[..]);
        assert!(dirent_key(5, b"").as_slice() >= &s[..]);
    }
}
