//! Chunk values: their bytes (inline, or in an extent file since format 4), a chunk split
//! into block keys (a hole into it, a base image's block over it) and the blocks written over
//! a chunk merged back into it (the fold). Layout: `codec`; the data path: `data`.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::codec::{
    chunk_key, decode_chunk, decode_extent, decode_extent_key, extent_key, lookup_keys,
    private_extent, stored_chunk, Chunk, Extent, ExtentKey, CHUNK_BYTES,
};
use super::Result;
use crate::store::{Batch, ExtentSpan, Family, EXTENT_ALIGN};
use crate::tenants::Tenant;

/// Blocks per chunk for a volume of `block_size` blocks: 1 (no chunks) when a block is already
/// a chunk or larger.
pub(super) fn chunk_blocks(block_size: u64) -> u64 {
    (CHUNK_BYTES / block_size).max(1)
}

/// The bytes of chunk value `value` of `ino`: the value itself, or what it names in an extent
/// file. The caller holds the extent files' `read_guard` since it looked the value up.
pub(super) fn chunk_bytes<'a>(tenant: &Tenant, ino: u64, value: &'a [u8]) -> Result<Cow<'a, [u8]>> {
    match decode_chunk(value) {
        Some(Chunk::Bytes(bytes)) => Ok(Cow::Borrowed(bytes)),
        Some(Chunk::Stored(span)) if u64::from(span.len) <= CHUNK_BYTES => {
            let mut bytes = Vec::new();
            tenant
                .db()
                .extent_files()
                .read(&[span], |_, b| bytes = b.to_vec())?;
            Ok(Cow::Owned(bytes))
        }
        _ => Err(super::damaged(tenant, ino)),
    }
}

/// One chunk of one file: chunk `first` (its first block) of `ino`, in a volume of
/// `block_size` blocks and `chunk_blocks` blocks per chunk. The caller holds the inode's lock.
pub(super) struct ChunkAt<'a> {
    pub tenant: &'a Tenant,
    pub block_size: u64,
    pub chunk_blocks: u64,
    pub ino: u64,
    pub first: u64,
}

impl ChunkAt<'_> {
    /// Whether the chunk value exists, and which of its blocks have their own key over it.
    /// Keys only: no value is read.
    fn cover(&self) -> Result<(bool, BTreeSet<u64>)> {
        let (ino, first) = (self.ino, self.first);
        let mut chunk = false;
        let mut overlaid = BTreeSet::new();
        self.tenant.db().keys(
            Family::Extents,
            &extent_key(ino, first),
            &extent_key(ino, first + self.chunk_blocks),
            |k| {
                match decode_extent_key(k) {
                    Some(ExtentKey::Block(index)) => {
                        overlaid.insert(index);
                    }
                    Some(ExtentKey::Chunk(c)) => chunk |= c == first,
                    None => {}
                }
                true
            },
        )?;
        Ok((chunk, overlaid))
    }

    /// Rewrites the chunk (if it exists) as block keys in `b`, leaving out the blocks that
    /// already have their own key (they overlay the chunk), and deletes the chunk key; false
    /// when there is no chunk. A chunk overlaid whole is not read at all. Later changes to
    /// its blocks in the same batch win over the rewritten blocks.
    pub(super) fn split(&self, b: &mut Batch<'_>) -> Result<bool> {
        let (tenant, ino, first) = (self.tenant, self.ino, self.first);
        let (exists, overlaid) = self.cover()?;
        if !exists {
            return Ok(false);
        }
        if (overlaid.len() as u64) < self.chunk_blocks {
            let db = tenant.db();
            let _no_delete = db.extent_files().read_guard();
            let Some(value) = db.get(Family::Extents, &chunk_key(ino, first))? else {
                return Ok(false);
            };
            let chunk = chunk_bytes(tenant, ino, &value)?;
            let bs = self.block_size as usize;
            if chunk.len() > self.chunk_blocks as usize * bs {
                return Err(super::damaged(tenant, ino));
            }
            for (nth, data) in chunk.chunks(bs).enumerate() {
                let index = first + nth as u64;
                if !overlaid.contains(&index) {
                    if let Some(v) = private_extent(data) {
                        b.put(Family::Extents, &extent_key(ino, index), v);
                    }
                }
            }
        }
        b.delete(Family::Extents, &chunk_key(ino, first));
        Ok(true)
    }

    /// Merges the block keys over the chunk into it in `b`: one value again (its bytes in an
    /// extent file, and in the cache), the blocks' keys deleted; `None` when there is no chunk
    /// or nothing over it. A chunk range holds no
    /// hole (a hole splits its chunk at once), so the merged value holds exactly the bytes a
    /// read would see. A block that is not private data (a base image's block) cannot go
    /// into a chunk: the chunk is split instead ([`Self::split`]). One multi-get of the
    /// chunk's keys brings both the values and which keys exist; the chunk's bytes are laid
    /// under the blocks after it, when every block over it is known. The `Some` holds the old
    /// chunk's span if it was in an extent file: once `b` is written, its cached bytes can go
    /// ([`crate::store::ExtentFiles::forget_cached`]).
    pub(super) fn merge(&self, b: &mut Batch<'_>) -> Result<Option<Option<ExtentSpan>>> {
        let (tenant, ino, first) = (self.tenant, self.ino, self.first);
        let bs = self.block_size as usize;
        let blocks = self.chunk_blocks;
        let mut merged = vec![0u8; blocks as usize * bs];
        // Which blocks have a key of their own: their bytes come from it, not from the chunk.
        let mut overlaid = vec![false; blocks as usize];
        let mut chunk = None;
        let mut damaged = false;
        let mut not_private = false;
        let (keys, names) = lookup_keys(ino, first, first + blocks - 1, blocks);
        let no_delete = tenant.db().extent_files().read_guard();
        tenant
            .db()
            .multi_get(Family::Extents, &keys, |i, v| match names[i] {
                ExtentKey::Chunk(_) => chunk = Some(v.to_vec()),
                ExtentKey::Block(index) => match decode_extent(v) {
                    Some(Extent::Private(data)) if data.len() <= bs => {
                        let nth = (index - first) as usize;
                        overlaid[nth] = true;
                        let to = &mut merged[nth * bs..(nth + 1) * bs];
                        let (to, zeros) = to.split_at_mut(data.len());
                        to.copy_from_slice(data);
                        zeros.fill(0);
                    }
                    Some(Extent::Base(_)) => not_private = true,
                    _ => damaged = true,
                },
            })?;
        if damaged {
            return Err(super::damaged(tenant, ino));
        }
        let Some(value) = chunk else {
            return Ok(None);
        };
        let replaced = match decode_chunk(&value) {
            Some(Chunk::Stored(span)) => Some(span),
            _ => None,
        };
        let bytes = chunk_bytes(tenant, ino, &value)?;
        let under = merged
            .get_mut(..bytes.len())
            .ok_or_else(|| super::damaged(tenant, ino))?;
        for (nth, (to, from)) in under.chunks_mut(bs).zip(bytes.chunks(bs)).enumerate() {
            if !overlaid[nth] {
                to.copy_from_slice(from);
            }
        }
        if not_private {
            // The chunk is read: `split` takes the guard again itself (taken twice by one
            // thread, a collection waiting for the write side between would hold both).
            drop(no_delete);
            return Ok(self.split(b)?.then_some(replaced));
        }
        if !overlaid.contains(&true) {
            return Ok(None);
        }
        for (nth, _) in overlaid.iter().enumerate().filter(|(_, o)| **o) {
            b.delete(Family::Extents, &extent_key(ino, first + nth as u64));
        }
        let key = chunk_key(ino, first);
        let Some(private) = private_extent(&merged) else {
            b.delete(Family::Extents, &key);
            return Ok(Some(replaced));
        };
        // Into an extent file, as bulk writes go, and into the cache: the chunk and the blocks
        // over it were just read (they are what the file's readers read), and an inline value
        // would be copied by a flush into a blob file, read from disk again after it (a new
        // cache key), and again after each blob collection that moves it.
        let stored = &merged[..private.len().next_multiple_of(EXTENT_ALIGN)];
        let db = tenant.db();
        let span = db.write_extents(stored, stored.len())?[0];
        db.extent_files().keep_cached(&span, stored);
        b.put(Family::Extents, &key, &stored_chunk(span));
        Ok(Some(replaced))
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::{chunk_key, decode_chunk, stored_chunk, Chunk};
    use super::super::testing::noise;
    use super::super::{FileKind, Owner, TestStore, Volume, VolumeError, ROOT_INO};
    use crate::store::{ExtentSpan, Family, SpanCheck, PIECE};

    const CHUNK: u64 = 64 << 10;
    /// What the key provider puts before an extent file's body.
    const PREFIX: u64 = 4096;

    fn span_of(vol: &Volume, ino: u64, chunk: u64) -> ExtentSpan {
        let value = vol
            .tenant()
            .db()
            .get(Family::Extents, &chunk_key(ino, chunk * CHUNK / 4096))
            .unwrap()
            .expect("a chunk value");
        match decode_chunk(&value) {
            Some(Chunk::Stored(span)) => span,
            other => panic!("chunk {chunk} is not in an extent file: {other:?}"),
        }
    }

    /// Flips one byte of extent file `file`'s body at `offset`.
    fn flip(store: &TestStore, file: u64, offset: u64) {
        let name = format!("{file:08}.ext");
        let path = walk(store.root())
            .into_iter()
            .find(|p| p.file_name().is_some_and(|n| n == name.as_str()))
            .expect("the extent file");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(PREFIX + offset) as usize] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            match p.is_dir() {
                true => out.extend(walk(&p)),
                false => out.push(p),
            }
        }
        out
    }

    fn is_checksum_error(r: Result<Vec<u8>, VolumeError>) -> bool {
        match r {
            Err(VolumeError::Store(e)) => e.is_corruption() && e.to_string().contains("checksum"),
            other => panic!("not a checksum failure: {:?}", other.map(|b| b.len())),
        }
    }

    /// A random read of a few KiB of a chunk in an extent file reads, checks and caches only
    /// the 4 KiB pieces it covers; a second such read of the chunk soon after reads it whole
    /// (its pieces are wanted). A damaged piece fails the reads that take it and no other; a
    /// whole read of the chunk fails on it. A chunk value of format 4 (one checksum for the
    /// chunk) is read whole and checked whole.
    #[test]
    fn random_reads_take_only_their_pieces_and_check_them() {
        let store = TestStore::new();
        let (ino, model) = {
            let vol = store.open();
            let owner = Owner { uid: 0, gid: 0 };
            let ino = vol
                .mknod(ROOT_INO, b"f", FileKind::File, 0o644, owner, 0)
                .unwrap()
                .ino;
            let model = noise(1 << 20, 7);
            vol.write(ino, 0, &model).unwrap();
            vol.fsync().unwrap();
            (ino, model)
        };
        let piece = u64::from(PIECE);
        let (damaged, old) = {
            let vol = store.open();
            let damaged = span_of(&vol, ino, 2);
            assert!(matches!(damaged.check, SpanCheck::Pieces(_)), "{damaged:?}");
            // Chunk 3 as format 4 wrote it: one checksum of the whole span.
            let mut old = span_of(&vol, ino, 3);
            let bytes = &model[(3 * CHUNK) as usize..(3 * CHUNK) as usize + old.len as usize];
            old.check = SpanCheck::Whole(twox_hash::XxHash3_64::oneshot(bytes));
            let db = vol.tenant().db();
            db.put(
                Family::Extents,
                &chunk_key(ino, 3 * CHUNK / 4096),
                &stored_chunk(old),
            )
            .unwrap();
            db.sync().unwrap();
            (damaged, old)
        };
        flip(&store, damaged.file, damaged.offset + 5 * piece + 100);
        // What the writes left in the host cache is found again by the store opened anew
        // (cache keys name files, not stores): start from the disk.
        let cache = store.store_host().block_cache();
        cache.release(cache.usage());

        let vol = store.open();
        let files = vol.tenant().db().extent_files();
        let read = |at: u64, len: u32| vol.read(ino, at, len);
        let model_at = |at: u64, len: u32| &model[at as usize..(at + u64::from(len)) as usize];
        // (Each read below is a random one: not where the last one ended.)
        // One piece of chunk 6: read and cached alone.
        let six = span_of(&vol, ino, 6);
        assert!(
            read(6 * CHUNK + 7 * piece + 10, 3000).unwrap()
                == model_at(6 * CHUNK + 7 * piece + 10, 3000)
        );
        assert_eq!(
            files.cached_len(six.file, six.offset + 7 * piece),
            Some(4096)
        );
        assert_eq!(files.cached_len(six.file, six.offset), None);
        // A second part of chunk 6 missed (two pieces of it): the chunk is read and cached
        // whole.
        assert!(
            read(6 * CHUNK + 9 * piece + 4000, 200).unwrap()
                == model_at(6 * CHUNK + 9 * piece + 4000, 200)
        );
        assert_eq!(
            files.cached_len(six.file, six.offset),
            Some(six.len as usize)
        );
        assert!(
            read(6 * CHUNK + 2 * piece, 4096).unwrap() == model_at(6 * CHUNK + 2 * piece, 4096)
        );

        // The damaged piece fails its reads; the chunk's other pieces read back, the second
        // one through a whole read of the chunk that fails its check.
        assert!(
            is_checksum_error(read(2 * CHUNK + 5 * piece + 8, 100)),
            "piece 5"
        );
        for p in [7, 9, 0, 15] {
            let at = 2 * CHUNK + p * piece + 1;
            assert!(read(at, 4000).unwrap() == model_at(at, 4000), "piece {p}");
        }
        assert!(
            is_checksum_error(read(2 * CHUNK + 5 * piece, 4096)),
            "piece 5 again"
        );
        assert!(
            is_checksum_error(read(2 * CHUNK, CHUNK as u32)),
            "the whole chunk"
        );
        assert_eq!(files.cached_len(damaged.file, damaged.offset), None);

        // Format 4: the whole chunk read (and cached) for 4 KiB of it.
        let at = 3 * CHUNK + 6 * piece;
        assert!(read(at, 4096).unwrap() == model_at(at, 4096));
        assert_eq!(
            files.cached_len(old.file, old.offset),
            Some(old.len as usize)
        );
        drop(vol);
        flip(&store, old.file, old.offset + 12 * piece);
        cache.release(cache.usage());
        let vol = store.open();
        assert!(is_checksum_error(vol.read(ino, at, 4096)), "format 4 chunk");
        // The chunks around are whole and read back.
        let at = (4 * CHUNK) as usize;
        assert!(vol.read(ino, at as u64, 8192).unwrap() == model[at..at + 8192]);
    }

    /// A file written in bulk and read through once, whose size is over half the cache, leaves
    /// the cache as it found it (drop-behind): a file read twice stays cached beside it, and
    /// so do chunks of the large file cached before the stream.
    /// Without drop-behind, 48 MiB through a 64 MiB cache push out the hot file and stay.
    #[test]
    fn a_stream_through_a_large_file_leaves_the_cache_to_others() {
        // A 64 MiB cache: 8 times the read-ahead window, whose chunks are cached before they
        // are read.
        let store = TestStore::with_cache(64 << 20);
        let owner = Owner { uid: 0, gid: 0 };
        let (hot, big) = {
            let vol = store.open();
            let file = |name: &[u8], mib: usize| {
                let ino = vol
                    .mknod(ROOT_INO, name, FileKind::File, 0o644, owner, 0)
                    .unwrap()
                    .ino;
                let data = noise(mib << 20, mib as u64);
                vol.write(ino, 0, &data).unwrap();
                (ino, data)
            };
            let files = (file(b"hot", 4), file(b"big", 48));
            vol.fsync().unwrap();
            files
        };
        let vol = store.open();
        let files = vol.tenant().db().extent_files();
        let spans = |ino: u64, mib: u64| -> Vec<ExtentSpan> {
            (0..mib * (1 << 20) / CHUNK)
                .map(|c| span_of(&vol, ino, c))
                .collect()
        };
        let read_through = |(ino, data): &(u64, Vec<u8>)| {
            for at in (0..data.len()).step_by(128 << 10) {
                let back = vol.read(*ino, at as u64, 128 << 10).unwrap();
                assert!(back == data[at..at + (128 << 10)], "wrong bytes at {at}");
            }
        };
        let cached = |spans: &[ExtentSpan]| spans.iter().filter(|s| files.is_cached(s)).count();
        read_through(&hot);
        read_through(&hot);
        // Five chunks of the big file read at random (whole) before the stream: they stay.
        for c in [303u64, 301, 304, 302, 300] {
            let at = c * CHUNK;
            let back = vol.read(big.0, at, CHUNK as u32).unwrap();
            assert!(back == big.1[at as usize..(at + CHUNK) as usize]);
        }
        read_through(&big);
        let before: Vec<ExtentSpan> = (300..305).map(|c| span_of(&vol, big.0, c)).collect();
        assert_eq!(
            cached(&before),
            5,
            "the stream erased chunks it did not bring in"
        );
        // (A read-ahead job that ends after the reader passed its chunk, having read it
        // itself, leaves that chunk behind: a few of 768 alone, up to 151 seen while the
        // other tests kept both CPUs busy and the jobs lagged. Without drop-behind 722 stay.)
        let left = cached(&spans(big.0, 48)) - 5;
        assert!(
            left <= 192,
            "{left} of the stream's 768 chunks stayed in the cache"
        );
        assert_eq!(
            cached(&spans(hot.0, 4)),
            64,
            "the stream pushed the hot file out"
        );
    }
}
