//! Importing a base: a source tree or raw image walked in order, files cut into blocks, each
//! distinct block sealed and written once into a pack (256 per pack write and index batch),
//! the base's record and node list written last, so a crash leaves an import that `open`
//! rolls back.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use aes_gcm::aead::AeadInPlace;
use aes_gcm::Nonce;

use super::{
    now_unix, BaseInfo, BaseRecord, BaseState, BaseStore, Progress, FLUSH_BLOCKS, FORMAT_VERSION,
};
use crate::base::index::{self, BlockRecord, Fragment};
use crate::base::pack::{aligned, Pack, FRAGMENT_MAX, MAX_SLOTS, PAGE};
use crate::base::tree::{walk, EntryKind, SourceKind, TreeEntry};
use crate::base::{BaseError, BlockHash};
use crate::store::{Batch, Family};

impl BaseStore {
    /// Imports `source` (a directory tree, or a raw image file) as base `name`, cutting files
    /// into `block_size` blocks; each distinct block is stored once per host.
    pub fn import(
        &self,
        name: &str,
        source: &Path,
        block_size: u32,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<BaseInfo, BaseError> {
        crate::tenants::validate_name(name).map_err(|_| BaseError::BadName(name.to_owned()))?;
        if !block_size.is_power_of_two() || !(4096..=1 << 20).contains(&block_size) {
            return Err(BaseError::BadBlockSize(block_size as u64));
        }
        if self.record(name)?.is_some() {
            return Err(BaseError::Exists(name.to_owned()));
        }
        let meta = std::fs::metadata(source).map_err(|e| BaseError::Source {
            path: source.to_owned(),
            detail: e.to_string(),
        })?;
        let (kind, entries) = if meta.is_dir() {
            (SourceKind::Tree, walk(source)?)
        } else if meta.is_file() {
            (SourceKind::Image, vec![TreeEntry::image(source, &meta)])
        } else {
            return Err(BaseError::Source {
                path: source.to_owned(),
                detail: "is neither a directory nor a regular file (a raw disk image)".into(),
            });
        };
        let mut record = BaseRecord {
            format_version: FORMAT_VERSION,
            name: name.to_owned(),
            kind,
            source: source.display().to_string(),
            block_size,
            state: BaseState::Importing,
            files: entries.len() as u64,
            logical_bytes: entries
                .iter()
                .filter(|e| e.kind == EntryKind::File)
                .map(|e| e.size)
                .sum(),
            unique_blocks: 0,
            unique_bytes: Some(0),
            stored_bytes: Some(0),
            created_unix: now_unix(),
        };
        let mut b = self.index.batch();
        self.put_record(&mut b, &record);
        self.index.write(b)?;
        self.index.sync()?;
        let mut imp = Importer::new(self, name, block_size)?;
        let mut done = 0u64;
        let total = record.logical_bytes;
        let result = (|| {
            for (seq, e) in entries.iter().enumerate() {
                imp.batch.put(
                    Family::Inodes,
                    &index::tree_key(name, seq as u64),
                    &serde_json::to_vec(e).expect("entry serialises"),
                );
                if e.kind == EntryKind::File {
                    let path = e.source_path(source, kind);
                    let mut f = File::open(&path).map_err(|err| BaseError::Source {
                        path: path.clone(),
                        detail: err.to_string(),
                    })?;
                    let mut block = vec![0u8; block_size as usize];
                    let mut index = 0u64;
                    loop {
                        let n = read_full(&mut f, &mut block).map_err(|err| BaseError::Source {
                            path: path.clone(),
                            detail: err.to_string(),
                        })?;
                        if n == 0 {
                            break;
                        }
                        block[n..].fill(0);
                        imp.add(seq as u64, index, &block, n)?;
                        index += 1;
                        done += n as u64;
                        if index.is_multiple_of(256) {
                            progress(Progress {
                                done_bytes: done,
                                total_bytes: total,
                            });
                        }
                        if n < block.len() {
                            break;
                        }
                    }
                }
                imp.maybe_flush()?;
            }
            imp.finish()
        })();
        if let Err(e) = result {
            // Leave nothing half-imported: roll back what was indexed (packs keep garbage
            // slots until `base gc`).
            let _ = imp.flush();
            if let Err(rb) = self.drop_base(name) {
                tracing::error!(base = name, error = %rb, "cannot roll back a failed import; the next open will");
            }
            return Err(e);
        }
        progress(Progress {
            done_bytes: total,
            total_bytes: total,
        });
        record.state = BaseState::Ready;
        record.unique_blocks = imp.seen.len() as u64;
        record.unique_bytes = Some(imp.unique_bytes);
        record.stored_bytes = Some(imp.stored_bytes);
        let mut b = self.index.batch();
        self.put_record(&mut b, &record);
        self.index.write(b)?;
        self.index.sync()?;
        Ok(self.info(&record))
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// One import's write state: blocks sealed into an aligned buffer, index changes in a batch,
/// both flushed together (pack data first, synced, then the index).
struct Importer<'a> {
    store: &'a BaseStore,
    base: String,
    block_size: u32,
    pack: Arc<Pack>,
    next_slot: u32,
    buf: crate::cache::SlabBox,
    buffered: usize,
    first_slot: u32,
    batch: Batch<'a>,
    /// Block records changed since the last flush (new, or one more reference).
    dirty: HashMap<BlockHash, BlockRecord>,
    seen: HashSet<BlockHash>,
    /// File bytes in the distinct blocks seen so far.
    unique_bytes: u64,
    /// Bytes the distinct blocks seen so far take in packs (slots, and fragments).
    stored_bytes: u64,
    entries: usize,
    /// The open fragment slot (aligned, one block long), where the next fragment goes in it, and
    /// the fragments sealed into it: (hash, place, nonce, tag).
    fragment_slot: crate::cache::SlabBox,
    fragment_at: u32,
    fragments: Vec<(BlockHash, Fragment, [u8; 12], [u8; 16])>,
}

/// Seals `data` in place under the host pack key with a new random nonce (AAD = `hash`).
fn seal_in_place(
    store: &BaseStore,
    hash: &BlockHash,
    data: &mut [u8],
) -> Result<([u8; 12], [u8; 16]), BaseError> {
    let mut nonce = [0u8; 12];
    crate::crypto::random_bytes(&mut nonce)?;
    let tag = store
        .packs
        .cipher()
        .encrypt_in_place_detached(Nonce::from_slice(&nonce), hash, data)
        .map_err(|_| BaseError::Corrupt("AES-GCM refused to seal a block".into()))?;
    Ok((nonce, tag.into()))
}

impl<'a> Importer<'a> {
    fn new(store: &'a BaseStore, base: &str, block_size: u32) -> Result<Self, BaseError> {
        let (pack, next_slot) = match store
            .index
            .get(Family::Meta, &index::alloc_key(block_size))?
        {
            Some(v) if v.len() == 8 => {
                let id = u32::from_be_bytes(v[..4].try_into().expect("4 bytes"));
                (
                    store.pack(id)?,
                    u32::from_be_bytes(v[4..].try_into().expect("4 bytes")),
                )
            }
            _ => (store.new_pack(block_size)?, 0),
        };
        let buf = aligned(&store.packs.slabs, FLUSH_BLOCKS * block_size as usize)
            .map_err(BaseError::io(pack.path()))?;
        let mut fragment_slot =
            aligned(&store.packs.slabs, block_size as usize).map_err(BaseError::io(pack.path()))?;
        fragment_slot.fill(0);
        Ok(Self {
            store,
            base: base.to_owned(),
            block_size,
            pack,
            next_slot,
            buf,
            buffered: 0,
            first_slot: next_slot,
            batch: store.index.batch(),
            dirty: HashMap::new(),
            seen: HashSet::new(),
            unique_bytes: 0,
            stored_bytes: 0,
            entries: 0,
            fragment_slot,
            fragment_at: 0,
            fragments: Vec::new(),
        })
    }

    /// Adds block `index` of entry `seq`, which holds `len` bytes of the file (the rest of
    /// `block` is zero padding).
    fn add(&mut self, seq: u64, index: u64, block: &[u8], len: usize) -> Result<(), BaseError> {
        let Some(last) = block.iter().rposition(|&b| b != 0) else {
            return Ok(()); // a hole
        };
        let hash: BlockHash = *blake3::hash(block).as_bytes();
        self.batch.put(
            Family::Dirents,
            &index::file_block_key(&self.base, seq, index),
            &hash,
        );
        self.entries += 1;
        if !self.seen.insert(hash) {
            return Ok(());
        }
        self.unique_bytes += len as u64;
        self.batch
            .put(Family::Extents, &index::ref_key(&self.base, &hash), b"");
        let existing = match self.dirty.get(&hash) {
            Some(r) => Some(*r),
            None => self.store.block_record(&hash)?,
        };
        let rec = match existing {
            Some(mut r) => {
                r.refs += 1;
                r
            }
            None if last < FRAGMENT_MAX => {
                self.stored_bytes += last as u64 + 1;
                // Its record waits for its slot to be closed.
                return self.seal_fragment(&hash, &block[..=last]);
            }
            None => self.seal(&hash, block)?,
        };
        self.stored_bytes += rec.stored_bytes(self.block_size);
        self.dirty.insert(hash, rec);
        Ok(())
    }

    /// The next slot, in the buffer (zeroed) and in the pack (a new pack when this one is
    /// full): its index in the buffer.
    fn take_slot(&mut self) -> Result<usize, BaseError> {
        if self.buffered == FLUSH_BLOCKS {
            self.flush()?;
        }
        if self.next_slot == MAX_SLOTS {
            self.flush()?;
            self.pack = self.store.new_pack(self.block_size)?;
            self.next_slot = 0;
            self.first_slot = 0;
        }
        let bs = self.block_size as usize;
        let at = self.buffered;
        self.buf[at * bs..(at + 1) * bs].fill(0);
        self.buffered += 1;
        self.next_slot += 1;
        Ok(at)
    }

    fn seal(&mut self, hash: &BlockHash, block: &[u8]) -> Result<BlockRecord, BaseError> {
        let bs = self.block_size as usize;
        let at = self.take_slot()?;
        let slot = &mut self.buf[at * bs..(at + 1) * bs];
        slot.copy_from_slice(block);
        let (nonce, tag) = seal_in_place(self.store, hash, slot)?;
        Ok(BlockRecord {
            pack: self.pack.id,
            slot: self.next_slot - 1,
            fragment: None,
            nonce,
            tag,
            refs: 1,
        })
    }

    /// Seals `bytes` (a block up to its last non-zero byte, at most `FRAGMENT_MAX`) as the next
    /// fragment of the open fragment slot, opening one when it has no room left in its pages. Its
    /// record waits in `fragments` until the slot is closed.
    fn seal_fragment(&mut self, hash: &BlockHash, bytes: &[u8]) -> Result<(), BaseError> {
        let len = bytes.len() as u32;
        let mut at = self.fragment_at;
        if at % PAGE + len > PAGE {
            at = at.next_multiple_of(PAGE);
        }
        if at + len > self.block_size {
            self.close_fragments()?;
            at = 0;
        }
        let slot = &mut self.fragment_slot[at as usize..(at + len) as usize];
        slot.copy_from_slice(bytes);
        let (nonce, tag) = seal_in_place(self.store, hash, slot)?;
        self.fragments.push((
            *hash,
            Fragment {
                offset: at,
                len: len as u16,
            },
            nonce,
            tag,
        ));
        self.fragment_at = at + len;
        Ok(())
    }

    /// Puts the open fragment slot (if it holds any) into the next slot and its fragments' records
    /// with the others to be written.
    fn close_fragments(&mut self) -> Result<(), BaseError> {
        if self.fragments.is_empty() {
            return Ok(());
        }
        let bs = self.block_size as usize;
        let at = self.take_slot()?;
        self.buf[at * bs..(at + 1) * bs].copy_from_slice(&self.fragment_slot[..bs]);
        self.fragment_slot[..bs].fill(0);
        let slot = self.next_slot - 1;
        for (hash, fragment, nonce, tag) in std::mem::take(&mut self.fragments) {
            self.dirty.insert(
                hash,
                BlockRecord {
                    pack: self.pack.id,
                    slot,
                    fragment: Some(fragment),
                    nonce,
                    tag,
                    refs: 1,
                },
            );
        }
        self.fragment_at = 0;
        Ok(())
    }

    fn maybe_flush(&mut self) -> Result<(), BaseError> {
        if self.entries >= 16 * FLUSH_BLOCKS || self.batch.len() >= 16 * FLUSH_BLOCKS {
            self.flush()?;
            // Tests: a crash with fragments waiting for their slot (their records not written).
            fail::fail_point!("base-import-flushed");
        }
        Ok(())
    }

    /// Everything sealed: the open fragment slot closed, then flushed.
    fn finish(&mut self) -> Result<(), BaseError> {
        self.close_fragments()?;
        self.flush()
    }

    /// Pack data first (written, synced), then the index batch that points at it. Fragments of
    /// the open fragment slot wait for its close: their files' entries and the base's references
    /// may be written before their records (an import cut short is rolled back whole).
    fn flush(&mut self) -> Result<(), BaseError> {
        if self.buffered > 0 {
            let bs = self.block_size as usize;
            self.pack
                .write_slots(
                    &*self.store.packs.io,
                    self.first_slot,
                    &self.buf[..self.buffered * bs],
                )
                .and_then(|()| self.pack.sync())
                .map_err(BaseError::io(self.pack.path()))?;
            self.buffered = 0;
            self.first_slot = self.next_slot;
        }
        let mut batch = std::mem::replace(&mut self.batch, self.store.index.batch());
        for (h, r) in self.dirty.drain() {
            batch.put(Family::Extents, &index::block_key(&h), &r.encode());
        }
        let mut alloc = self.pack.id.to_be_bytes().to_vec();
        alloc.extend_from_slice(&self.next_slot.to_be_bytes());
        batch.put(Family::Meta, &index::alloc_key(self.block_size), &alloc);
        self.store.index.write(batch)?;
        self.entries = 0;
        Ok(())
    }
}

impl BaseStore {
    fn new_pack(&self, block_size: u32) -> Result<Arc<Pack>, BaseError> {
        let id = self.pack_ids()?.last().map_or(1, |n| n + 1);
        let pack = Arc::new(
            Pack::create(&self.packs_dir, id, block_size, &self.packs.slabs).map_err(
                BaseError::io(&super::super::pack::pack_path(&self.packs_dir, id)),
            )?,
        );
        self.packs.add_pack(pack.clone());
        Ok(pack)
    }
}
