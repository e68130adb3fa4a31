//! File data: reads, writes, holes and lseek over block and chunk extents.
//!
//! A write that covers whole aligned chunks (`CHUNK_BYTES`, 64 KiB) stores each as one value,
//! so streaming I/O moves one 64 KiB value where it would move sixteen 4 KiB ones (a cold read
//! costs half the CPU per byte: `examples/bench_extent_size.rs`). Everything else, above all a
//! 4 KiB random write, stays one block value: a single WAL append that never reads old bytes.
//! A block written into a chunk goes over it (reads merge: a block key wins over its chunk's
//! copy) and the blocks are merged back into the chunk in the background once writes leave
//! it alone (`fold`), so a file rewritten at random ends as chunks again. A hole cannot go
//! over a chunk (an absent key would show the chunk through): a hole punched or truncated
//! into a chunk, or a block of zeros written into one, splits it at once. A chunk write
//! deletes the block keys it covers. The chunks of a bulk write (256 KiB and more) are
//! written into the store's extent files, their values naming where (format 4); reads take
//! those bytes after their lookups. Chunk values: `chunk`; layout: `codec`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::chunk::{chunk_bytes, ChunkAt};
use super::codec::{
    chunk_key, decode_chunk, decode_extent, decode_extent_key, extent_key, lookup_keys,
    private_extent, stored_chunk, xattr_key, Chunk, Extent, ExtentKey,
};
use super::readahead::Plan;
use super::{
    now, privileges, usage, Attr, Clearing, Fallocate, FileKind, Result, Volume, VolumeError,
    MULTI_GET_BLOCKS, UNLOGGED_WRITE_MIN,
};
use crate::store::{Batch, ExtentSpan, Family, SpanPart};

/// The most keys `durable_deletes` deletes one by one (1 MiB of 4 KiB blocks).
const DURABLE_DELETES_MAX: u64 = 256;

/// The bytes `[offset, end)` of a read, blocks `first..=last` of `bs` bytes.
#[derive(Clone, Copy)]
struct ReadRange {
    offset: u64,
    end: u64,
    first: u64,
    last: u64,
    bs: u64,
}

impl ReadRange {
    /// Where block `index`'s part of the read goes in the output, and where it is in the block.
    fn span(&self, index: u64) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let block_start = index * self.bs;
        let lo = self.offset.max(block_start);
        let hi = self.end.min(block_start + self.bs);
        (
            (lo - self.offset) as usize..(hi - self.offset) as usize,
            (lo - block_start) as usize..(hi - block_start) as usize,
        )
    }

    fn place_block(&self, out: &mut [u8], index: u64, block: &[u8]) {
        let (to, from) = self.span(index);
        out[to].copy_from_slice(&block[from]);
    }

    /// The blocks in range of chunk `c` (of `chunk_blocks` blocks, bytes `value`, zeros past
    /// its end) that have no key of their own (`overlaid`, indexed from `first`) into `out`.
    fn place_chunk(
        &self,
        out: &mut [u8],
        overlaid: &[bool],
        c: u64,
        chunk_blocks: u64,
        value: &[u8],
        at: usize,
    ) {
        for index in c.max(self.first)..(c + chunk_blocks).min(self.last + 1) {
            if overlaid[(index - self.first) as usize] {
                continue;
            }
            let (to, from) = self.span(index);
            let base = ((index - c) * self.bs) as usize;
            debug_assert!(
                base + from.start >= at,
                "bytes from {at} miss a block's start"
            );
            let (lo, hi) = (base + from.start - at, base + from.end - at);
            let have = value.get(lo..value.len().min(hi)).unwrap_or(&[]);
            let (data, zeros) = out[to].split_at_mut(have.len());
            data.copy_from_slice(have);
            zeros.fill(0);
        }
    }
}

impl Volume {
    fn chunked(&self) -> bool {
        self.chunk_blocks > 1
    }

    /// Chunk `first` of `ino`.
    pub(super) fn chunk_at(&self, ino: u64, first: u64) -> ChunkAt<'_> {
        ChunkAt {
            tenant: &self.tenant,
            block_size: self.block_size,
            chunk_blocks: self.chunk_blocks,
            ino,
            first,
        }
    }

    /// The first block of the chunk holding block `index`.
    fn chunk_of(&self, index: u64) -> u64 {
        index - index % self.chunk_blocks
    }

    /// The byte range of the whole aligned chunks inside `[offset, end)` (empty: `lo >= hi`).
    /// Without chunks, the whole blocks.
    fn whole_chunks(&self, offset: u64, end: u64) -> (u64, u64) {
        let unit = self.chunk_blocks * self.block_size;
        (offset.div_ceil(unit) * unit, end / unit * unit)
    }

    /// Puts block `index` of `ino` into `b`: stored as a hole when all zeros.
    fn put_block(&self, b: &mut Batch<'_>, ino: u64, index: u64, data: &[u8]) {
        let key = extent_key(ino, index);
        match private_extent(data) {
            None => b.delete(Family::Extents, &key),
            Some(v) => b.put(Family::Extents, &key, v),
        }
    }

    /// The current bytes of one block (zeros for a hole), `block_size` long, and whether a
    /// chunk value lies under it.
    fn read_block(&self, ino: u64, index: u64) -> Result<(Vec<u8>, bool)> {
        let mut block = vec![0u8; self.block_size as usize];
        let (keys, names) = lookup_keys(ino, index, index, self.chunk_blocks);
        let mut from_block = None;
        let mut from_chunk = None;
        let _no_delete = self.db().extent_files().read_guard();
        self.db()
            .multi_get(Family::Extents, &keys, |i, v| match names[i] {
                ExtentKey::Block(_) => from_block = Some(v.to_vec()),
                ExtentKey::Chunk(c) => from_chunk = Some((c, v.to_vec())),
            })?;
        let over_chunk = from_chunk.is_some();
        if let Some(v) = from_block {
            self.decode_block_into(ino, &v, &mut block)?;
        } else if let Some((c, v)) = from_chunk {
            let chunk = chunk_bytes(&self.tenant, ino, &v)?;
            self.chunk_block_into(ino, &chunk, index - c, &mut block)?;
        }
        Ok((block, over_chunk))
    }

    fn decode_block_into(&self, ino: u64, value: &[u8], out: &mut [u8]) -> Result<()> {
        match decode_extent(value) {
            Some(Extent::Private(data)) if data.len() <= out.len() => {
                out[..data.len()].copy_from_slice(data);
                out[data.len()..].fill(0);
                Ok(())
            }
            Some(Extent::Base(reference)) => {
                match &self.base {
                    Some(base) => base
                        .read(reference, out)
                        .map_err(|detail| self.base_error(ino, detail)),
                    None => Err(self
                        .base_error(ino, "this volume was opened without its base image".into())),
                }
            }
            _ => Err(self.damaged(ino)),
        }
    }

    /// Block `nth` of a chunk value into `out` (one block; zeros past the value's end).
    fn chunk_block_into(&self, ino: u64, chunk: &[u8], nth: u64, out: &mut [u8]) -> Result<()> {
        if chunk.len() as u64 > self.chunk_blocks * self.block_size {
            return Err(self.damaged(ino));
        }
        let lo = ((nth * self.block_size) as usize).min(chunk.len());
        let hi = (lo + out.len()).min(chunk.len());
        out[..hi - lo].copy_from_slice(&chunk[lo..hi]);
        out[hi - lo..].fill(0);
        Ok(())
    }

    fn base_error(&self, ino: u64, detail: String) -> VolumeError {
        tracing::error!(tenant = %self.tenant.info().name, ino, %detail, "base block read failed");
        VolumeError::BaseBlock {
            tenant: self.tenant.info().name.clone(),
            ino,
            detail,
        }
    }

    /// Writes `data` at `offset` of `ino` (a file of `size` bytes before) block by block into
    /// `b`: whole blocks never read the old bytes, partial ones read, patch and rewrite their
    /// block; a block over a chunk leaves the chunk for the fold, a hole splits it first.
    fn write_blocks(
        &self,
        b: &mut Batch<'_>,
        ino: u64,
        size: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let bs = self.block_size;
        let end = offset + data.len() as u64;
        let mut blocks: Vec<(u64, Cow<'_, [u8]>)> = Vec::new();
        // Chunks a partial block was read in: whether a chunk value lies under it is known.
        let mut read_in = BTreeMap::new();
        let mut pos = offset;
        while pos < end {
            let index = pos / bs;
            let block_start = index * bs;
            let lo = (pos - block_start) as usize;
            let hi = (end.min(block_start + bs) - block_start) as usize;
            let src = &data[(pos - offset) as usize..(pos - offset) as usize + (hi - lo)];
            let block = if lo == 0 && hi == bs as usize {
                Cow::Borrowed(src)
            } else {
                // Beyond the old end of file there is nothing to read: the rest is zeros.
                let mut block = if block_start >= size {
                    vec![0u8; bs as usize]
                } else {
                    let (block, over_chunk) = self.read_block(ino, index)?;
                    *read_in.entry(self.chunk_of(index)).or_default() |= over_chunk;
                    block
                };
                block[lo..hi].copy_from_slice(src);
                Cow::Owned(block)
            };
            blocks.push((index, block));
            pos = block_start + hi as u64;
        }
        if self.chunked() {
            // Blocks go over the chunk they land in, and are merged into it later (`fold`),
            // once writes leave it alone. A block of zeros is a hole, an absent key
            // that would let the chunk show through: its chunk is split now, as is one the fold
            // queue cannot take. Past the old end of file no chunk exists (truncation splits or
            // drops them). Only a chunk that exists is queued: a file written in pieces
            // smaller than a chunk (tar writes 10 KiB) has none, and the block each piece
            // patches where the last one ended must not queue a fold for nothing. (A chunk
            // already queued exists: random writes into it ask the store nothing.)
            let mut split = BTreeSet::new();
            let mut queued = BTreeSet::new();
            for (index, block) in blocks.iter().filter(|(index, _)| index * bs < size) {
                let first = self.chunk_of(*index);
                if private_extent(block).is_none() {
                    split.insert(first);
                } else {
                    queued.insert(first);
                }
            }
            let later: Vec<u64> = queued
                .difference(&split)
                .copied()
                .filter(|first| {
                    read_in.get(first).copied().unwrap_or_else(|| {
                        self.folds.is_queued(ino, *first) || self.chunk_may_lie_under(ino, *first)
                    })
                })
                .collect();
            for first in later {
                if !self.folds.note(ino, first, true) {
                    split.insert(first);
                }
            }
            for first in split {
                self.chunk_at(ino, first).split(b)?;
            }
        }
        for (index, block) in &blocks {
            self.put_block(b, ino, *index, block);
        }
        Ok(())
    }

    /// False when chunk `first` of `ino` surely does not exist (no disk read: a false
    /// positive only queues a fold that finds nothing to do).
    fn chunk_may_lie_under(&self, ino: u64, first: u64) -> bool {
        self.db().may_exist(Family::Extents, &chunk_key(ino, first))
    }

    /// Writes whole aligned chunks `data` at `offset` (a multiple of the chunk size) of `ino`
    /// (a file of `size` bytes before) into `b`: one value per chunk, after deleting the block
    /// keys they replace. With `to_extent_file`, the bytes go into the store's extent files
    /// now, and each chunk's value names where they are (format 4: bulk data is written once,
    /// by this thread, not copied through the memtable and a flush).
    fn write_chunks(
        &self,
        b: &mut Batch<'_>,
        ino: u64,
        size: u64,
        offset: u64,
        data: &[u8],
        to_extent_file: bool,
    ) -> Result<()> {
        let bs = self.block_size;
        let first = offset / bs;
        if !self.chunked() {
            for (nth, block) in data.chunks(bs as usize).enumerate() {
                self.put_block(b, ino, first + nth as u64, block);
            }
            return Ok(());
        }
        if offset < size {
            // Block keys (of chunks split by earlier writes, or from format 2) give way to the
            // chunks; old chunk keys are simply overwritten by the puts below.
            let last = first + data.len() as u64 / bs;
            if to_extent_file {
                // Unlogged like a fold: a crash keeps both or neither (see `durable_deletes`).
                self.delete_keys_where(
                    b,
                    Family::Extents,
                    &extent_key(ino, first),
                    &extent_key(ino, last),
                    |k| matches!(decode_extent_key(k), Some(ExtentKey::Block(_))),
                )?;
            } else {
                self.durable_deletes(b, ino, first, last, false);
            }
        }
        let unit = (self.chunk_blocks * bs) as usize;
        // Nothing to write for a run of zeros (holes).
        let stored = match to_extent_file && private_extent(data).is_some() {
            true => self.db().write_extents(data, unit)?,
            false => Vec::new(),
        };
        for (nth, chunk) in data.chunks(unit).enumerate() {
            let key = chunk_key(ino, first + nth as u64 * self.chunk_blocks);
            match (private_extent(chunk), stored.get(nth)) {
                (Some(_), Some(span)) => b.put(Family::Extents, &key, &stored_chunk(*span)),
                (Some(v), None) => b.put(Family::Extents, &key, v),
                (None, _) if offset + ((nth * unit) as u64) < size => {
                    b.delete(Family::Extents, &key)
                }
                (None, _) => {}
            }
        }
        Ok(())
    }

    /// Deletes the block keys of `ino` in `[first, last)` (and with `chunks` the chunk keys,
    /// `first` and `last` being chunk boundaries) whether they are there or not: a logged
    /// batch must not decide its deletes from what it sees. A fold deletes the blocks over a
    /// chunk without the WAL (`fold.rs`); a write that then found no block to delete would
    /// log none, and a crash before the next flush would bring the fold's blocks back over
    /// it, synced or not. A long range (more than [`DURABLE_DELETES_MAX`] blocks) is one
    /// range deletion, which takes chunk keys too.
    fn durable_deletes(&self, b: &mut Batch<'_>, ino: u64, first: u64, last: u64, chunks: bool) {
        if last - first > DURABLE_DELETES_MAX {
            b.delete_range(
                Family::Extents,
                &extent_key(ino, first),
                &extent_key(ino, last),
            );
            return;
        }
        for index in first..last {
            b.delete(Family::Extents, &extent_key(ino, index));
            if chunks && self.chunked() && index % self.chunk_blocks == 0 {
                b.delete(Family::Extents, &chunk_key(ino, index));
            }
        }
    }

    /// Zeroes `[offset, offset+len)` of `ino` (clamped to `size`) in batch `b`: whole chunks
    /// (or blocks) become holes, the edges are written as zeros (a whole block of zeros is a
    /// hole too).
    pub(super) fn zero_range(
        &self,
        b: &mut Batch<'_>,
        ino: u64,
        offset: u64,
        len: u64,
        size: u64,
    ) -> Result<()> {
        let end = offset.saturating_add(len).min(size.max(offset));
        if end <= offset {
            return Ok(());
        }
        let bs = self.block_size;
        let (lo, hi) = self.whole_chunks(offset, end);
        let edges = if lo < hi {
            self.durable_deletes(b, ino, lo / bs, hi / bs, true);
            [(offset, lo), (hi, end)]
        } else {
            [(offset, end), (end, end)]
        };
        for (from, to) in edges {
            if from < to {
                let zeros = vec![0u8; (to - from) as usize];
                self.write_blocks(b, ino, size, from, &zeros)?;
            }
        }
        Ok(())
    }

    /// [`Self::read_into`] without the warming of the file's neighbours (`neighbours`).
    pub(super) fn read_stored(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        out.clear();
        let attr = self.getattr(ino)?;
        match attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(VolumeError::IsDir),
            _ => return Err(VolumeError::Invalid),
        }
        if offset >= attr.size || size == 0 {
            return Ok(()); // (an empty range: `end - 1` below would underflow)
        }
        self.blob_gc.poke(&self.tenant);
        let end = (offset + u64::from(size)).min(attr.size);
        out.resize((end - offset) as usize, 0);
        let out = &mut out[..];
        let bs = self.block_size;
        let first = offset / bs;
        let last = (end - 1) / bs;
        // A read answered again (its disk reads made by the ring) was random the first time,
        // and the streams' state has moved on since: it is planned as such, and moves nothing.
        let plan = match crate::serving::answering_since() {
            Some(_) => Plan::random(end),
            None => self.readahead.plan(ino, offset, end, attr.size),
        };
        if let Some((from, to)) = plan.background {
            self.readahead
                .fetch(&self.tenant, ino, from, to, bs, self.chunk_blocks);
        }
        // Blocks past `last` are looked up only to bring them into the cache.
        let fetch_last =
            ((plan.sync_end - 1) / bs).clamp(last, (first + MULTI_GET_BLOCKS - 1).max(last));
        let mut block = vec![0u8; bs as usize];
        let mut err = None;
        // Blocks with their own key: a chunk's copy of them is stale.
        let mut overlaid = vec![false; (last - first + 1) as usize];
        // Chunks met in range, to queue for folding if blocks overlay them.
        let mut chunks_met: Vec<u64> = Vec::new();
        // Chunks whose bytes are in extent files, read together after the lookups.
        let mut stored: Vec<(u64, ExtentSpan)> = Vec::new();
        // Blocks shared with a base image are fetched together after the lookups.
        let mut base_refs: Vec<(u64, Vec<u8>)> = Vec::new();
        let range = ReadRange {
            offset,
            end,
            first,
            last,
            bs,
        };
        let mut copy = |name: ExtentKey, value: &[u8]| -> bool {
            let result = match name {
                ExtentKey::Block(index) if index > last => return true,
                ExtentKey::Block(index) => {
                    overlaid[(index - first) as usize] = true;
                    if let (Some(Extent::Base(reference)), Some(_)) =
                        (decode_extent(value), &self.base)
                    {
                        base_refs.push((index, reference.to_vec()));
                        return true;
                    }
                    self.decode_block_into(ino, value, &mut block)
                        .map(|()| range.place_block(out, index, &block))
                }
                ExtentKey::Chunk(c) if c > last => return true,
                ExtentKey::Chunk(c) => match decode_chunk(value) {
                    Some(Chunk::Bytes(bytes)) if bytes.len() as u64 <= self.chunk_blocks * bs => {
                        chunks_met.push(c);
                        // Blocks whose keys come later overwrite their part of `out`.
                        range.place_chunk(out, &overlaid, c, self.chunk_blocks, bytes, 0);
                        Ok(())
                    }
                    Some(Chunk::Stored(span)) if u64::from(span.len) <= self.chunk_blocks * bs => {
                        chunks_met.push(c);
                        stored.push((c, span));
                        Ok(())
                    }
                    _ => Err(self.damaged(ino)),
                },
            };
            match result {
                Ok(()) => true,
                Err(e) => {
                    err = Some(e);
                    false
                }
            }
        };
        // No extent file named by a value looked up here goes before it is read.
        let extent_files = self.db().extent_files();
        let _no_delete = extent_files.read_guard();
        let blocks = last - first + 1;
        if blocks <= MULTI_GET_BLOCKS {
            // Point lookups use the bloom filters; an iterator would visit every SST whose key
            // range overlaps the file, which after overwrites can be many.
            let (keys, names) = lookup_keys(ino, first, fetch_last, self.chunk_blocks);
            self.db().multi_get(Family::Extents, &keys, |i, v| {
                copy(names[i], v);
            })?;
        } else {
            // Very large reads scan, fetching their span from the SSTs in large reads.
            let readahead = ((blocks * bs) as usize).min(4 << 20);
            self.db().range_with_readahead(
                Family::Extents,
                &extent_key(ino, self.chunk_of(first)),
                &extent_key(ino, last + 1),
                readahead,
                |k, v| match decode_extent_key(k) {
                    Some(ExtentKey::Block(index)) if index < first => true,
                    Some(name) => copy(name, v),
                    None => true,
                },
            )?;
        }
        if let Some(e) = err {
            return Err(e);
        }
        if !stored.is_empty() {
            // After every lookup: the blocks over these chunks are all known.
            // A random read takes only the pieces it covers; others whole chunks, which the
            // reads after them will want.
            let parts: Vec<SpanPart> = stored
                .iter()
                .map(|&(c, span)| match plan.random {
                    true => {
                        let at = c * bs;
                        let lo = offset.saturating_sub(at).min(u64::from(span.len)) as u32;
                        let hi = (end - at).min(u64::from(span.len)) as u32;
                        SpanPart { span, lo, hi }
                    }
                    false => SpanPart::whole(span),
                })
                .collect();
            // A random read may hand its disk reads to the thread answering it; others read.
            let from_disk = extent_files.read_parts(&parts, plan.random, |i, at, bytes| {
                let (c, chunk_blocks) = (stored[i].0, self.chunk_blocks);
                range.place_chunk(out, &overlaid, c, chunk_blocks, bytes, at as usize);
            })?;
            if !plan.random && attr.size > extent_files.cache_capacity() / 2 {
                // Drop-behind: a stream through a file larger than half the cache would push
                // out what others read again, and finds none of it there when it comes back.
                // Only what the stream brought in goes (this read's disk reads, its
                // read-ahead's): chunks cached before it stay.
                for (i, (c, span)) in stored.iter().enumerate() {
                    let fetched = self.readahead.take_fetched(span);
                    let passed = end >= c * bs + u64::from(span.len);
                    if passed && (fetched || from_disk.binary_search(&i).is_ok()) {
                        extent_files.forget_cached(span);
                    }
                }
            }
        }
        for c in chunks_met {
            // A chunk left overlaid (its fold dropped at a close, or a format 2 store).
            let lo = c.max(first) - first;
            let hi = (c + self.chunk_blocks).min(last + 1) - first;
            if overlaid[lo as usize..hi as usize].contains(&true) {
                self.folds.note(ino, c, false);
            }
        }
        if let (Some(base), false) = (&self.base, base_refs.is_empty()) {
            let mut blocks = vec![0u8; base_refs.len() * bs as usize];
            let refs: Vec<&[u8]> = base_refs.iter().map(|(_, r)| r.as_slice()).collect();
            let mut outs: Vec<&mut [u8]> = blocks.chunks_mut(bs as usize).collect();
            base.read_many(&refs, &mut outs)
                .map_err(|detail| self.base_error(ino, detail))?;
            for ((index, _), block) in base_refs.iter().zip(blocks.chunks(bs as usize)) {
                range.place_block(out, *index, block);
            }
        }
        Ok(())
    }

    /// Checks that `[offset, offset+len)` fits a file, locks the inode and loads it; the inode
    /// must be a regular file (a directory is EISDIR, anything else `not_file`).
    fn lock_file_range(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        not_file: VolumeError,
    ) -> Result<(std::sync::MutexGuard<'_, ()>, super::Attr, u64)> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= super::MAX_FILE_SIZE)
            .ok_or(VolumeError::TooBig)?;
        let guard = self.inodes.lock(ino);
        let (attr, _) = self.load(ino)?;
        match attr.kind {
            FileKind::File => Ok((guard, attr, end)),
            FileKind::Dir => Err(VolumeError::IsDir),
            _ => Err(not_file),
        }
    }

    /// Writes `data` at `offset` (a block device's write: no mode or xattr changes).
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_with(ino, offset, data, None).map(|(n, _)| n)
    }

    /// A write(2) to a file, with what a local filesystem's write does besides: it drops the
    /// file's capability (`security.capability`, whoever writes: a delete of that key in the
    /// write's own batch, no read) and clears setuid and setgid as `clearing` says (see
    /// `privileges`). Also whether the mode changed: whoever caches it must forget it.
    pub fn write_file(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        clearing: Option<Clearing<'_>>,
    ) -> Result<(u32, bool)> {
        self.write_with(ino, offset, data, Some(clearing))
    }

    /// `file`: `Some` for [`Self::write_file`], with its clearing.
    fn write_with(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        file: Option<Option<Clearing<'_>>>,
    ) -> Result<(u32, bool)> {
        let (_g, mut attr, end) =
            self.lock_file_range(ino, offset, data.len() as u64, VolumeError::Invalid)?;
        if data.is_empty() {
            return Ok((0, false)); // writes nothing, and does not move the end of file either
        }
        let charge = self.charge_growth(&attr, end)?;
        // Bulk data of a chunked volume goes into extent files (see `write_chunks`); without
        // chunks (blocks of 64 KiB and more) it skips the WAL instead.
        let bulk = data.len() >= UNLOGGED_WRITE_MIN;
        let to_extent_file = bulk && self.chunked();
        // Room for the data (unless it goes to an extent file) and, per block, a key and a
        // record header.
        let blocks = data.len() / self.block_size as usize + 2;
        let inline = if to_extent_file { 0 } else { data.len() };
        let mut b = self.db().batch_with_capacity(inline + blocks * 64);
        let (lo, hi) = self.whole_chunks(offset, end);
        let at = |pos: u64| (pos - offset) as usize;
        if lo < hi {
            self.write_blocks(&mut b, ino, attr.size, offset, &data[..at(lo)])?;
            let run = &data[at(lo)..at(hi)];
            self.write_chunks(&mut b, ino, attr.size, lo, run, to_extent_file)?;
            self.write_blocks(&mut b, ino, attr.size, hi, &data[at(hi)..])?;
        } else {
            self.write_blocks(&mut b, ino, attr.size, offset, data)?;
        }
        let t = now();
        attr.size = attr.size.max(end);
        attr.mtime = t;
        attr.ctime = t;
        let mode_changed = match file {
            Some(Some(change)) => privileges::clear(&mut attr, change),
            _ => false,
        };
        let drop_capability = |b: &mut Batch| {
            if file.is_some() {
                b.delete(Family::Meta, &xattr_key(ino, privileges::CAPABILITY_XATTR));
            }
        };
        if bulk {
            // Bulk data goes to the memtable only (the values naming extent files, or without
            // chunks the data itself, written once into a blob file at flush); fsync flushes
            // it (see `TenantDb::write_unlogged`), after the extent files it names are synced.
            // The inode goes through the WAL after it: a crash before the flush leaves the
            // new size over holes (zeros, as a file system loses unsynced data) and what was
            // overwritten as it was, never blocks past the size.
            self.db().write_unlogged(b)?;
            let mut b = self.db().batch();
            drop_capability(&mut b);
            self.store_attr(&mut b, &attr, &[]);
            self.db().write(b)?;
        } else {
            drop_capability(&mut b);
            self.store_attr(&mut b, &attr, &[]);
            self.db().write(b)?;
        }
        charge.keep();
        self.blob_gc.poke(&self.tenant);
        Ok((data.len() as u32, mode_changed))
    }

    /// Takes from the quota what moving `attr`'s end of file to `end` (if further) adds.
    fn charge_growth(&self, attr: &Attr, end: u64) -> Result<usage::Charge<'_>> {
        let before = usage::charged_bytes(attr, self.block_size);
        let grown = Attr {
            size: attr.size.max(end),
            ..attr.clone()
        };
        let after = usage::charged_bytes(&grown, self.block_size);
        self.counts.charge(after - before, 0)
    }

    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: Fallocate) -> Result<()> {
        if len == 0 {
            return Err(VolumeError::Invalid);
        }
        let (_g, mut attr, end) =
            self.lock_file_range(ino, offset, len, VolumeError::NotSupported)?;
        let t = now();
        let mut b = self.db().batch();
        let grow = match mode {
            Fallocate::Allocate { keep_size } => !keep_size,
            Fallocate::PunchHole => {
                self.zero_range(&mut b, ino, offset, len, attr.size)?;
                attr.mtime = t;
                false
            }
            Fallocate::ZeroRange { keep_size } => {
                self.zero_range(&mut b, ino, offset, len, attr.size)?;
                attr.mtime = t;
                !keep_size
            }
        };
        let charge = self.charge_growth(&attr, if grow { end } else { attr.size })?;
        if grow && end > attr.size {
            attr.size = end;
        }
        attr.ctime = t;
        self.store_attr(&mut b, &attr, &[]);
        self.db().write(b)?;
        charge.keep();
        Ok(())
    }

    /// The extent keys of `ino` from the one covering byte `offset` on, as the block ranges
    /// they cover, in order, while `f` returns true.
    fn extents_from(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(u64, u64) -> bool,
    ) -> Result<()> {
        let start = self.chunk_of(offset / self.block_size);
        Ok(self.db().keys(
            Family::Extents,
            &extent_key(ino, start),
            &extent_key(ino, u64::MAX),
            |k| match decode_extent_key(k) {
                Some(ExtentKey::Block(index)) => f(index, index + 1),
                Some(ExtentKey::Chunk(c)) => f(c, c + self.chunk_blocks),
                None => true,
            },
        )?)
    }

    /// lseek(SEEK_DATA): the first offset >= `offset` inside data. (A chunk counts as data
    /// up to its end, zeros after its last non-zero byte included.)
    pub fn seek_data(&self, ino: u64, offset: u64) -> Result<u64> {
        let attr = self.getattr(ino)?;
        if offset >= attr.size {
            return Err(VolumeError::NoMoreData);
        }
        let bs = self.block_size;
        let from = offset / bs;
        let mut found = None;
        self.extents_from(ino, offset, |lo, hi| {
            if hi > from {
                found = Some(lo.max(from));
                false
            } else {
                true
            }
        })?;
        match found {
            Some(index) if index * bs < attr.size => Ok(offset.max(index * bs)),
            _ => Err(VolumeError::NoMoreData),
        }
    }

    /// lseek(SEEK_HOLE): the first offset >= `offset` inside a hole (end of file counts).
    pub fn seek_hole(&self, ino: u64, offset: u64) -> Result<u64> {
        let attr = self.getattr(ino)?;
        if offset >= attr.size {
            return Err(VolumeError::NoMoreData);
        }
        let bs = self.block_size;
        let mut expect = offset / bs;
        self.extents_from(ino, offset, |lo, hi| {
            if lo > expect {
                false
            } else {
                expect = expect.max(hi);
                true
            }
        })?;
        Ok(offset.max(expect * bs).min(attr.size))
    }
}
