//! Reading base blocks: from a pack slot, opened with the host pack key and checked against
//! its name, or from the host block cache. Needs no index: a tenant's extent reference carries
//! the block's location, so serving processes read packs directly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};

use super::index::BlockRecord;
use super::pack::{aligned, pack_path, Pack, PackIo, PreadIo};
use super::{BaseError, BlockHash};
use crate::cache::{HostCache, SlabAllocator};
use crate::data_dir::DataDir;

/// Length of a block reference in a tenant's extents: hash ‖ pack ‖ slot ‖ nonce ‖ tag.
pub const REF_LEN: usize = 32 + 4 + 4 + 12 + 16;

pub fn encode_ref(hash: &BlockHash, r: &BlockRecord) -> Vec<u8> {
    let mut v = Vec::with_capacity(REF_LEN);
    v.extend_from_slice(hash);
    v.extend_from_slice(&r.pack.to_be_bytes());
    v.extend_from_slice(&r.slot.to_be_bytes());
    v.extend_from_slice(&r.nonce);
    v.extend_from_slice(&r.tag);
    v
}

fn decode_ref(v: &[u8]) -> Option<(BlockHash, BlockRecord)> {
    if v.len() != REF_LEN {
        return None;
    }
    Some((
        v[..32].try_into().ok()?,
        BlockRecord {
            pack: u32::from_be_bytes(v[32..36].try_into().ok()?),
            slot: u32::from_be_bytes(v[36..40].try_into().ok()?),
            nonce: v[40..52].try_into().ok()?,
            tag: v[52..68].try_into().ok()?,
            refs: 0,
        },
    ))
}

pub(crate) const PACK_KEY_PURPOSE: &str = "tenantfs 2026-11 base pack key v1";

/// Open packs and the key to open their slots.
pub struct PackReader {
    dir: PathBuf,
    cipher: Aes256Gcm,
    pub(crate) slabs: SlabAllocator,
    pub(crate) io: Box<dyn PackIo>,
    packs: Mutex<HashMap<u32, Arc<Pack>>>,
}

impl PackReader {
    pub fn new(data: &DataDir) -> Self {
        let key = data.master_key().derive(PACK_KEY_PURPOSE);
        Self {
            dir: data.root().join("base").join("packs"),
            cipher: Aes256Gcm::new_from_slice(key.bytes()).expect("32-byte key"),
            slabs: SlabAllocator::new(),
            io: Box::new(PreadIo),
            packs: Mutex::default(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn cipher(&self) -> &Aes256Gcm {
        &self.cipher
    }

    pub(crate) fn pack(&self, id: u32) -> Result<Arc<Pack>, BaseError> {
        let mut packs = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = packs.get(&id) {
            return Ok(p.clone());
        }
        let p = Arc::new(
            Pack::open(&self.dir, id, &self.slabs)
                .map_err(BaseError::io(&pack_path(&self.dir, id)))?,
        );
        packs.insert(id, p.clone());
        Ok(p)
    }

    pub(crate) fn forget(&self, id: u32) {
        self.packs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    pub(crate) fn add_pack(&self, pack: Arc<Pack>) {
        self.packs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pack.id, pack);
    }

    /// Reads the block at `rec` into `out` (one block long), opens it and checks it is `hash`.
    pub fn read_into(
        &self,
        hash: &BlockHash,
        rec: &BlockRecord,
        out: &mut [u8],
    ) -> Result<(), BaseError> {
        let pack = self.pack(rec.pack)?;
        let len = pack.block_size as usize;
        if out.len() != len {
            return Err(BaseError::Corrupt(format!(
                "block {} is {len} bytes in its pack, {} expected",
                hex::encode(hash),
                out.len()
            )));
        }
        let mut buf = aligned(&self.slabs, len).map_err(BaseError::io(pack.path()))?;
        pack.read_slot(&*self.io, rec.slot, &mut buf[..len])
            .map_err(BaseError::io(pack.path()))?;
        out.copy_from_slice(&buf[..len]);
        let bad = |reason: &str| {
            let e = BaseError::BlockCorrupt {
                hash: hex::encode(hash),
                pack: pack.path().to_owned(),
                slot: rec.slot,
                reason: reason.to_owned(),
            };
            tracing::error!(error = %e, "base block is damaged");
            e
        };
        self.cipher
            .decrypt_in_place_detached(
                Nonce::from_slice(&rec.nonce),
                hash,
                out,
                Tag::from_slice(&rec.tag),
            )
            .map_err(|_| bad("it does not open under the host key (ciphertext or tag damaged)"))?;
        if blake3::hash(out).as_bytes() != hash {
            return Err(bad("its content does not hash to its name"));
        }
        Ok(())
    }
}

/// What a serving process gives a base-backed volume: pack reads through the host block
/// cache, keyed by hash, so every tenant of one base shares one copy of a block in RAM.
pub struct BaseBlockReader {
    packs: PackReader,
    cache: Option<Arc<HostCache>>,
}

impl BaseBlockReader {
    pub fn new(data: &DataDir, cache: Option<Arc<HostCache>>) -> Self {
        Self {
            packs: PackReader::new(data),
            cache,
        }
    }
}

impl crate::volume::BaseBlocks for BaseBlockReader {
    fn read(&self, reference: &[u8], out: &mut [u8]) -> Result<(), String> {
        let (hash, rec) = decode_ref(reference).ok_or("malformed base block reference")?;
        let Some(cache) = &self.cache else {
            return self
                .packs
                .read_into(&hash, &rec, out)
                .map_err(|e| e.to_string());
        };
        if let Some(b) = cache.blocks().get(&hash) {
            if b.len() == out.len() {
                out.copy_from_slice(&b);
                return Ok(());
            }
        }
        self.packs
            .read_into(&hash, &rec, out)
            .map_err(|e| e.to_string())?;
        match cache.blocks().insert(hash, out) {
            Ok(_) => cache.block_inserted(),
            Err(e) => tracing::debug!(error = %e, "base block not cached"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_round_trip() {
        let r = BlockRecord {
            pack: 2,
            slot: 77,
            nonce: [3; 12],
            tag: [4; 16],
            refs: 0,
        };
        let v = encode_ref(&[9; 32], &r);
        assert_eq!(v.len(), REF_LEN);
        assert_eq!(decode_ref(&v), Some(([9; 32], r)));
        assert_eq!(decode_ref(&v[1..]), None);
    }
}
