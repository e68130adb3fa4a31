//! Reading base blocks: from a pack slot, opened with the host pack key and checked against
//! its name, or from the host block cache. Needs no index: a tenant's extent reference carries
//! the block's location, so serving processes read packs directly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};

use super::index::BlockRecord;
use super::pack::{aligned, pack_path, Pack, PackIo, PreadIo, PAGE};
use super::uring::UringIo;
use super::{BaseError, BlockHash};
use crate::cache::{HostCache, SlabAllocator};
use crate::data_dir::DataDir;

/// Length of a block reference in a tenant's extents: hash ‖ pack ‖ slot ‖ nonce ‖ tag.
pub const REF_LEN: usize = 32 + 4 + 4 + 12 + 16;
/// Length of a reference to a block stored as a fragment: [`REF_LEN`] ‖ offset ‖ length.
pub const FRAGMENT_REF_LEN: usize = REF_LEN + 4 + 2;

pub fn encode_ref(hash: &BlockHash, r: &BlockRecord) -> Vec<u8> {
    let mut v = Vec::with_capacity(FRAGMENT_REF_LEN);
    v.extend_from_slice(hash);
    v.extend_from_slice(&r.pack.to_be_bytes());
    v.extend_from_slice(&r.slot.to_be_bytes());
    v.extend_from_slice(&r.nonce);
    v.extend_from_slice(&r.tag);
    r.encode_fragment(&mut v);
    v
}

fn decode_ref(v: &[u8]) -> Result<(BlockHash, BlockRecord), String> {
    let fragment = match v.len() {
        REF_LEN => None,
        FRAGMENT_REF_LEN => BlockRecord::decode_fragment(&v[REF_LEN..]),
        n => {
            return Err(format!(
                "a base block reference of {n} bytes: not one this tenantfs reads \
                 ({REF_LEN} or {FRAGMENT_REF_LEN}); was the tenant written by a newer tenantfs?"
            ))
        }
    };
    fn field<const N: usize>(v: &[u8], at: usize) -> [u8; N] {
        v[at..at + N].try_into().expect("length checked")
    }
    Ok((
        field(v, 0),
        BlockRecord {
            pack: u32::from_be_bytes(field(v, 32)),
            slot: u32::from_be_bytes(field(v, 36)),
            fragment,
            nonce: field(v, 40),
            tag: field(v, 52),
            refs: 0,
        },
    ))
}

/// Open packs and the key to open their slots.
pub struct PackReader {
    dir: PathBuf,
    cipher: Aes256Gcm,
    pub(crate) slabs: SlabAllocator,
    pub(crate) io: Box<dyn PackIo>,
    packs: Mutex<HashMap<u32, Arc<Pack>>>,
}

impl PackReader {
    pub fn new(data: &DataDir) -> Result<Self, BaseError> {
        let key = super::host_keys::host_key(data, super::host_keys::HostKey::Pack)?;
        Ok(Self {
            dir: data.root().join("base").join("packs"),
            cipher: Aes256Gcm::new_from_slice(key.bytes()).expect("32-byte key"),
            slabs: SlabAllocator::new(),
            io: Box::new(PreadIo),
            packs: Mutex::default(),
        })
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
        self.read_many_into(None, &[(*hash, *rec)], &mut [out])
    }

    /// Opens (decrypts) `data`, block `hash` (one block long, its stored bytes as read from
    /// `rec`'s place in `pack` and zeros after them), in place and checks it against its name.
    fn open_block(
        &self,
        pack: &Pack,
        hash: &BlockHash,
        rec: &BlockRecord,
        data: &mut [u8],
    ) -> Result<(), BaseError> {
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
        let stored = rec.stored_bytes(pack.block_size) as usize;
        self.cipher
            .decrypt_in_place_detached(
                Nonce::from_slice(&rec.nonce),
                hash,
                &mut data[..stored],
                Tag::from_slice(&rec.tag),
            )
            .map_err(|_| bad("it does not open under the host key (ciphertext or tag damaged)"))?;
        if blake3::hash(data).as_bytes() != hash {
            return Err(bad("its content does not hash to its name"));
        }
        Ok(())
    }

    /// Reads several blocks: what lies next to each other in a pack in one read each (a run:
    /// consecutive slots, and the page of a fragment; up to 64 blocks' worth), the runs all in
    /// flight at once through `batch` when there are several (io_uring: see BENCHMARKS.md,
    /// "Base pack I/O engines"), else with pread. `outs[i]` gets `blocks[i]`.
    pub fn read_many_into(
        &self,
        batch: Option<&dyn PackIo>,
        blocks: &[(BlockHash, BlockRecord)],
        outs: &mut [&mut [u8]],
    ) -> Result<(), BaseError> {
        // Each block's place: (pack, file offset and length of the aligned range to read,
        // where its stored bytes start in that range).
        let mut places: Vec<(u32, u64, u64, u64)> = Vec::with_capacity(blocks.len());
        for ((hash, rec), out) in blocks.iter().zip(outs.iter()) {
            let p = self.pack(rec.pack)?;
            let bs = p.block_size as usize;
            if out.len() != bs {
                return Err(BaseError::Corrupt(format!(
                    "block {} is {bs} bytes in its pack, {} expected",
                    hex::encode(hash),
                    out.len()
                )));
            }
            let slot = p.offset(rec.slot);
            places.push(match rec.fragment {
                None => (rec.pack, slot, bs as u64, 0),
                Some(fragment) => {
                    let page = u64::from(fragment.offset / PAGE * PAGE);
                    let within = u64::from(fragment.offset % PAGE);
                    if within + u64::from(fragment.len) > u64::from(PAGE) || page >= bs as u64 {
                        return Err(BaseError::Corrupt(format!(
                            "block {} is a fragment at {}+{} of a {bs}-byte slot, across a page",
                            hex::encode(hash),
                            fragment.offset,
                            fragment.len
                        )));
                    }
                    (rec.pack, slot + page, u64::from(PAGE), within)
                }
            });
        }
        let mut order: Vec<usize> = (0..blocks.len()).collect();
        order.sort_by_key(|&i| (places[i].0, places[i].1));
        // Runs of (pack, file offset, length, indices into `blocks`).
        let mut runs: Vec<(u32, u64, u64, Vec<usize>)> = Vec::new();
        for i in order {
            let (pack, at, len, _) = places[i];
            let most = 64 * outs[i].len() as u64;
            match runs.last_mut() {
                // Already in the run (a block read twice, or a fragment of a page in it).
                Some((p, start, n, members)) if *p == pack && at + len <= *start + *n => {
                    members.push(i)
                }
                Some((p, start, n, members))
                    if *p == pack && *start + *n == at && *n + len <= most =>
                {
                    *n += len;
                    members.push(i)
                }
                _ => runs.push((pack, at, len, vec![i])),
            }
        }
        let mut bufs = Vec::with_capacity(runs.len());
        for (pack, _, n, _) in &runs {
            let p = self.pack(*pack)?;
            bufs.push(aligned(&self.slabs, *n as usize).map_err(BaseError::io(p.path()))?);
        }
        match batch {
            Some(io) if runs.len() > 1 => {
                let mut by_pack: HashMap<u32, Vec<(u64, &mut [u8])>> = HashMap::new();
                for ((pack, at, n, _), buf) in runs.iter().zip(bufs.iter_mut()) {
                    by_pack
                        .entry(*pack)
                        .or_default()
                        .push((*at, &mut buf[..*n as usize]));
                }
                for (pack, mut reads) in by_pack {
                    let p = self.pack(pack)?;
                    p.read_many_at(io, &mut reads)
                        .map_err(BaseError::io(p.path()))?;
                }
            }
            _ => {
                for ((pack, at, n, _), buf) in runs.iter().zip(bufs.iter_mut()) {
                    let p = self.pack(*pack)?;
                    p.read_at(&*self.io, *at, &mut buf[..*n as usize])
                        .map_err(BaseError::io(p.path()))?;
                }
            }
        }
        for ((pack, start, _, members), buf) in runs.iter().zip(bufs.iter()) {
            let p = self.pack(*pack)?;
            for &i in members {
                let (hash, rec) = &blocks[i];
                let (_, at, _, within) = places[i];
                let from = (at - start + within) as usize;
                let stored = rec.stored_bytes(p.block_size) as usize;
                let out = &mut outs[i];
                out[..stored].copy_from_slice(&buf[from..from + stored]);
                out[stored..].fill(0);
                self.open_block(&p, hash, rec, out)?;
            }
        }
        Ok(())
    }
}

/// What a serving process gives a base-backed volume: pack reads through the host block
/// cache, keyed by hash, so every tenant of one base shares one copy of a block in RAM.
pub struct BaseBlockReader {
    packs: PackReader,
    cache: Option<Arc<HostCache>>,
    /// io_uring for batches of scattered runs; `None` where io_uring is unavailable.
    batch: Option<UringIo>,
}

/// Opens `tenant`'s volume; a tenant created from a base reads the base's blocks from the
/// host's packs, through `cache` when one is given (a serving host's).
pub fn open_volume(
    data: &DataDir,
    tenant: crate::tenants::Tenant,
    cache: Option<Arc<HostCache>>,
    opening: crate::volume::Opening,
) -> Result<crate::volume::Volume, crate::volume::VolumeError> {
    let from_base = tenant.info().base.is_some();
    let volume = crate::volume::Volume::open_as(tenant, opening)?;
    Ok(if from_base {
        let reader = BaseBlockReader::new(data, cache).map_err(|e| {
            crate::volume::VolumeError::BaseKeys {
                tenant: volume.tenant().info().name.clone(),
                detail: e.to_string(),
            }
        })?;
        volume.with_base(Arc::new(reader))
    } else {
        volume
    })
}

impl BaseBlockReader {
    pub fn new(data: &DataDir, cache: Option<Arc<HostCache>>) -> Result<Self, BaseError> {
        let batch = match UringIo::new() {
            Ok(u) => Some(u),
            Err(e) => {
                tracing::info!(error = %e, "io_uring unavailable; base block batches use pread");
                None
            }
        };
        Ok(Self {
            packs: PackReader::new(data)?,
            cache,
            batch,
        })
    }

    fn cached(&self, hash: &BlockHash, out: &mut [u8]) -> bool {
        match self.cache.as_ref().and_then(|c| c.blocks().get(hash)) {
            Some(b) if b.len() == out.len() => {
                out.copy_from_slice(&b);
                true
            }
            _ => false,
        }
    }

    fn cache_insert(&self, hash: BlockHash, data: &[u8]) {
        if let Some(cache) = &self.cache {
            match cache.blocks().insert(hash, data) {
                Ok(_) => cache.block_inserted(),
                Err(e) => tracing::debug!(error = %e, "base block not cached"),
            }
        }
    }
}

impl crate::volume::BaseBlocks for BaseBlockReader {
    fn read(&self, reference: &[u8], out: &mut [u8]) -> Result<(), String> {
        let (hash, rec) = decode_ref(reference)?;
        if self.cached(&hash, out) {
            return Ok(());
        }
        self.packs
            .read_into(&hash, &rec, out)
            .map_err(|e| e.to_string())?;
        self.cache_insert(hash, out);
        Ok(())
    }

    fn read_many(&self, refs: &[&[u8]], outs: &mut [&mut [u8]]) -> Result<(), String> {
        let mut misses: Vec<(BlockHash, BlockRecord)> = Vec::new();
        let mut miss_outs: Vec<&mut [u8]> = Vec::new();
        for (r, out) in refs.iter().zip(outs.iter_mut()) {
            let (hash, rec) = decode_ref(r)?;
            if !self.cached(&hash, out) {
                misses.push((hash, rec));
                miss_outs.push(&mut **out);
            }
        }
        if misses.is_empty() {
            return Ok(());
        }
        // Misses are read and opened straight into the caller's buffers.
        self.packs
            .read_many_into(
                self.batch.as_ref().map(|u| u as &dyn PackIo),
                &misses,
                &mut miss_outs,
            )
            .map_err(|e| e.to_string())?;
        for ((hash, _), data) in misses.iter().zip(miss_outs.iter()) {
            self.cache_insert(*hash, data);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_round_trip() {
        let mut r = BlockRecord {
            pack: 2,
            slot: 77,
            fragment: None,
            nonce: [3; 12],
            tag: [4; 16],
            refs: 0,
        };
        let v = encode_ref(&[9; 32], &r);
        assert_eq!(v.len(), REF_LEN);
        assert_eq!(decode_ref(&v), Ok(([9; 32], r)));
        r.fragment = Some(crate::base::index::Fragment {
            offset: 4100,
            len: 2048,
        });
        let v = encode_ref(&[9; 32], &r);
        assert_eq!(v.len(), FRAGMENT_REF_LEN);
        assert_eq!(decode_ref(&v), Ok(([9; 32], r)));
        let e = decode_ref(&v[1..]).unwrap_err();
        assert!(
            e.contains("73 bytes") && e.contains("newer tenantfs"),
            "{e}"
        );
    }
}
