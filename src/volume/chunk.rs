//! Chunk values: their bytes (inline, or in an extent file since format 4), a chunk split
//! into block keys (a hole into it, a base image's block over it) and the blocks written over
//! a chunk merged back into it (the fold). Layout: `codec`; the data path: `data`.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::codec::{
    chunk_key, decode_chunk, decode_extent, decode_extent_key, extent_key, lookup_keys,
    private_extent, Chunk, Extent, ExtentKey, CHUNK_BYTES,
};
use super::Result;
use crate::store::{Batch, Family};
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

/// What is stored for chunk `first` of `ino`: whether the chunk value exists, and which of its
/// blocks have their own key over it. Keys only: no value is read.
fn chunk_cover(
    tenant: &Tenant,
    chunk_blocks: u64,
    ino: u64,
    first: u64,
) -> Result<(bool, BTreeSet<u64>)> {
    let mut chunk = false;
    let mut overlaid = BTreeSet::new();
    tenant.db().keys(
        Family::Extents,
        &extent_key(ino, first),
        &extent_key(ino, first + chunk_blocks),
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

/// Rewrites chunk `first` of `ino` (if it exists) as block keys in `b`, leaving out the blocks
/// that already have their own key (they overlay the chunk), and deletes the chunk key; false
/// when there is no chunk. A chunk overlaid whole is not read at all. Later changes to its
/// blocks in the same batch win over the rewritten blocks. The caller holds the inode's lock.
pub(super) fn split_chunk(
    tenant: &Tenant,
    b: &mut Batch<'_>,
    block_size: u64,
    chunk_blocks: u64,
    ino: u64,
    first: u64,
) -> Result<bool> {
    let (exists, overlaid) = chunk_cover(tenant, chunk_blocks, ino, first)?;
    if !exists {
        return Ok(false);
    }
    if (overlaid.len() as u64) < chunk_blocks {
        let db = tenant.db();
        let _no_delete = db.extent_files().read_guard();
        let Some(value) = db.get(Family::Extents, &chunk_key(ino, first))? else {
            return Ok(false);
        };
        let chunk = chunk_bytes(tenant, ino, &value)?;
        let bs = block_size as usize;
        if chunk.len() > chunk_blocks as usize * bs {
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

/// Merges the block keys over chunk `first` of `ino` into the chunk in `b`: one value again,
/// the blocks' keys deleted; false when there is no chunk or nothing over it. A chunk range
/// holds no hole (a hole splits its chunk at once), so the merged value holds exactly the
/// bytes a read would see. A block that is not private data (a base image's block) cannot go
/// into a chunk: the chunk is split instead ([`split_chunk`]). One multi-get of the chunk's
/// keys brings both the values and which keys exist. The caller holds the inode's lock.
pub(super) fn merge_chunk(
    tenant: &Tenant,
    b: &mut Batch<'_>,
    block_size: u64,
    chunk_blocks: u64,
    ino: u64,
    first: u64,
) -> Result<bool> {
    let bs = block_size as usize;
    let mut merged = vec![0u8; chunk_blocks as usize * bs];
    // Which blocks have a key of their own: their bytes come from it, not from the chunk
    // (keys arrive in key order: the first block's key comes before the chunk's).
    let mut overlaid = vec![false; chunk_blocks as usize];
    let mut chunk = false;
    let mut damaged = false;
    let mut not_private = false;
    let mut stored = None;
    let (keys, names) = lookup_keys(ino, first, first + chunk_blocks - 1, chunk_blocks);
    let _no_delete = tenant.db().extent_files().read_guard();
    tenant
        .db()
        .multi_get(Family::Extents, &keys, |i, v| match names[i] {
            ExtentKey::Chunk(_) if matches!(decode_chunk(v), Some(Chunk::Stored(_))) => {
                chunk = true;
                stored = Some(v.to_vec());
            }
            ExtentKey::Chunk(_) => match merged.get_mut(..v.len()) {
                Some(to) => {
                    chunk = true;
                    for (nth, (to, from)) in to.chunks_mut(bs).zip(v.chunks(bs)).enumerate() {
                        if !overlaid[nth] {
                            to.copy_from_slice(from);
                        }
                    }
                }
                None => damaged = true,
            },
            ExtentKey::Block(index) => match decode_extent(v) {
                Some(Extent::Private(data)) if data.len() <= bs => {
                    let nth = (index - first) as usize;
                    overlaid[nth] = true;
                    let (to, zeros) = merged[nth * bs..(nth + 1) * bs].split_at_mut(data.len());
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
    if !chunk {
        return Ok(false);
    }
    if let Some(value) = stored {
        // Read after the lookups, so every block over the chunk is known: those keep theirs.
        let bytes = chunk_bytes(tenant, ino, &value)?;
        let to = merged
            .get_mut(..bytes.len())
            .ok_or_else(|| super::damaged(tenant, ino))?;
        for (nth, (to, from)) in to.chunks_mut(bs).zip(bytes.chunks(bs)).enumerate() {
            if !overlaid[nth] {
                to.copy_from_slice(from);
            }
        }
    }
    if not_private {
        return split_chunk(tenant, b, block_size, chunk_blocks, ino, first);
    }
    if !overlaid.contains(&true) {
        return Ok(false);
    }
    for (nth, _) in overlaid.iter().enumerate().filter(|(_, o)| **o) {
        b.delete(Family::Extents, &extent_key(ino, first + nth as u64));
    }
    let key = chunk_key(ino, first);
    match private_extent(&merged) {
        Some(v) => b.put(Family::Extents, &key, v),
        None => b.delete(Family::Extents, &key),
    }
    Ok(true)
}
