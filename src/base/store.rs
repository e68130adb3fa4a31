//! The host's base store: imports, block reads, verification, deletion.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aes_gcm::aead::AeadInPlace;
use aes_gcm::Nonce;
use serde::{Deserialize, Serialize};

use super::index::{self, BlockRecord};
use super::pack::{aligned, Pack, MAX_SLOTS};
use super::reader::{encode_ref, PackReader};
use super::tree::{walk, EntryKind, SourceKind, TreeEntry};
use super::{BaseError, BlockHash};
use crate::crypto::TenantKey;
use crate::data_dir::DataDir;
use crate::store::{Batch, Encryption, Family, OpenMode, StoreHost, TenantDb};
use crate::volume::{FileKind, GraftNode};

/// Version 2 added `unique_bytes`; version-1 records get it computed from the index at open.
const FORMAT_VERSION: u32 = 2;
/// Blocks sealed and written per pack write (and per index batch).
const FLUSH_BLOCKS: usize = 256;
const INDEX_NAME: &str = "host base index";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseState {
    /// Being imported; a base left in this state by a crash is rolled back at the next open.
    Importing,
    Ready,
    /// Being deleted; finished at the next open if interrupted.
    Deleting,
}

/// What the index keeps about a base.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRecord {
    pub format_version: u32,
    pub name: String,
    pub kind: SourceKind,
    pub source: String,
    pub block_size: u32,
    pub state: BaseState,
    pub files: u64,
    /// Bytes of the tree's files (their sizes).
    pub logical_bytes: u64,
    /// Distinct non-zero blocks in the tree.
    pub unique_blocks: u64,
    /// Bytes of file data in those distinct blocks, each block counted once by the file bytes
    /// it holds (a file's last, partial block counts its bytes, not the whole block): never
    /// more than `logical_bytes`. None only in version-1 records, until they are migrated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_bytes: Option<u64>,
    pub created_unix: u64,
}

/// One base in `base list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BaseInfo {
    pub name: String,
    pub kind: SourceKind,
    pub block_size: u32,
    pub files: u64,
    /// Bytes of its files (their sizes, holes included).
    pub logical_bytes: u64,
    /// Bytes of file data in its distinct non-zero blocks (each counted once, by the file
    /// bytes it holds): what is left of `logical_bytes` after holes and duplicates.
    pub unique_bytes: u64,
    /// Its distinct blocks times the block size: what it would take on disk alone.
    pub stored_bytes: u64,
    /// Tenants created from the base.
    pub tenants: Vec<String>,
}

/// Host totals in `base list`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostTotals {
    pub logical_bytes: u64,
    /// Bytes of blocks stored (each once, whatever number of bases holds it).
    pub stored_bytes: u64,
    /// Bytes the pack files take on disk, garbage and headers included (`base gc` gives the
    /// garbage back).
    pub pack_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BaseList {
    pub bases: Vec<BaseInfo>,
    pub host: HostTotals,
}

/// Import progress, for a progress bar.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// What `gc` did.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct GcReport {
    pub packs: u64,
    pub live_blocks: u64,
    /// Slots no block record points at (dropped blocks, interrupted imports), now holes.
    pub garbage_slots: u64,
    /// Pack files that held no live block, deleted.
    pub packs_deleted: u64,
    /// Disk bytes given back (before minus after).
    pub reclaimed_bytes: u64,
}

/// What `verify` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    pub blocks: u64,
    /// Blocks whose slot does not open or does not hash to its name: "hash: reason".
    pub bad: Vec<String>,
    /// Block references of base trees with no stored block.
    pub missing: u64,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.bad.is_empty() && self.missing == 0
    }
}

/// The host's base images: packs under `<data-dir>/base/packs`, index in `<data-dir>/base/index`.
pub struct BaseStore {
    data_root: PathBuf,
    packs_dir: PathBuf,
    index: TenantDb,
    packs: PackReader,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl BaseStore {
    /// Opens (creating on first use) the base store of a data dir, and finishes what a crash
    /// interrupted: an import is rolled back, a delete completed.
    pub fn open(data: &DataDir, host: &StoreHost) -> Result<Self, BaseError> {
        let root = data.root().join("base");
        let packs_dir = root.join("packs");
        std::fs::create_dir_all(&packs_dir).map_err(BaseError::io(&packs_dir))?;
        let index_dir = root.join("index");
        let key: TenantKey = data
            .master_key()
            .derive("tenantfs 2026-11 base index key v1");
        let index = TenantDb::open(
            host,
            INDEX_NAME,
            &index_dir,
            Encryption::Tenant(key),
            OpenMode::Create,
        )?;
        let store = Self {
            data_root: data.root().to_owned(),
            packs_dir,
            index,
            packs: PackReader::new(data),
        };
        for mut record in store.records()? {
            match record.state {
                BaseState::Ready if record.unique_bytes.is_none() => {
                    record.unique_bytes = Some(store.unique_bytes_of(&record)?);
                    record.format_version = FORMAT_VERSION;
                    let mut b = store.index.batch();
                    store.put_record(&mut b, &record);
                    store.index.write(b)?;
                    tracing::info!(base = %record.name, "base record migrated to format 2");
                }
                BaseState::Ready => {}
                BaseState::Importing => {
                    tracing::warn!(base = %record.name, "an import was interrupted; rolling it back");
                    store.drop_base(&record.name)?;
                }
                BaseState::Deleting => {
                    tracing::warn!(base = %record.name, "a delete was interrupted; finishing it");
                    store.drop_base(&record.name)?;
                }
            }
        }
        Ok(store)
    }

    fn records(&self) -> Result<Vec<BaseRecord>, BaseError> {
        let mut out = Vec::new();
        let mut bad = None;
        let mut newer = None;
        self.index.range(
            Family::Meta,
            index::BASES_START,
            index::BASES_END,
            |k, v| {
                match serde_json::from_slice::<BaseRecord>(v) {
                    Ok(r) if r.format_version > FORMAT_VERSION => {
                        newer = Some((r.name, r.format_version));
                        return false;
                    }
                    Ok(r) => out.push(r),
                    Err(e) => bad = Some(format!("{}: {e}", String::from_utf8_lossy(&k[1..]))),
                }
                true
            },
        )?;
        if let Some((base, found)) = newer {
            return Err(BaseError::NewerFormat {
                base,
                found,
                known: FORMAT_VERSION,
            });
        }
        match bad {
            Some(detail) => Err(BaseError::Corrupt(format!("base record {detail}"))),
            None => Ok(out),
        }
    }

    /// `unique_bytes` of a base from its index entries, as its import counts it: the file
    /// bytes of each distinct block, at its first appearance in tree order.
    fn unique_bytes_of(&self, r: &BaseRecord) -> Result<u64, BaseError> {
        let mut sizes: HashMap<u64, u64> = HashMap::new();
        let (start, end) = index::base_range(b'T', &r.name);
        self.index.range(Family::Inodes, &start, &end, |k, v| {
            let seq = k.len().checked_sub(8).map(|at| &k[at..]);
            if let (Some(seq), Ok(e)) = (seq, serde_json::from_slice::<TreeEntry>(v)) {
                sizes.insert(u64::from_be_bytes(seq.try_into().expect("8 bytes")), e.size);
            }
            true
        })?;
        let bs = r.block_size as u64;
        let mut seen: HashSet<BlockHash> = HashSet::new();
        let mut total = 0u64;
        let (start, end) = index::base_range(b'K', &r.name);
        self.index.range(Family::Dirents, &start, &end, |k, v| {
            let n = k.len();
            if n >= 16 && v.len() == 32 {
                let seq = u64::from_be_bytes(k[n - 16..n - 8].try_into().expect("8 bytes"));
                let index = u64::from_be_bytes(k[n - 8..].try_into().expect("8 bytes"));
                let size = sizes.get(&seq).copied().unwrap_or(0);
                if seen.insert(v.try_into().expect("32 bytes")) {
                    total += size.saturating_sub(index * bs).min(bs);
                }
            }
            true
        })?;
        Ok(total)
    }

    /// The base named `name`, if it exists (in any state).
    pub fn record(&self, name: &str) -> Result<Option<BaseRecord>, BaseError> {
        match self.index.get(Family::Meta, &index::base_key(name))? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| BaseError::Corrupt(format!("base record {name}: {e}"))),
        }
    }

    fn put_record(&self, b: &mut Batch<'_>, r: &BaseRecord) {
        b.put(
            Family::Meta,
            &index::base_key(&r.name),
            &serde_json::to_vec(r).expect("record serialises"),
        );
    }

    fn pack(&self, id: u32) -> Result<Arc<Pack>, BaseError> {
        self.packs.pack(id)
    }

    fn block_record(&self, hash: &BlockHash) -> Result<Option<BlockRecord>, BaseError> {
        match self.index.get(Family::Extents, &index::block_key(hash))? {
            None => Ok(None),
            Some(v) => BlockRecord::decode(&v).map(Some).ok_or_else(|| {
                BaseError::Corrupt(format!("block record {} is malformed", hex::encode(hash)))
            }),
        }
    }

    /// Calls `f` with every block record in the index (hash order); a malformed record is an
    /// error.
    fn for_each_block(&self, mut f: impl FnMut(&BlockHash, BlockRecord)) -> Result<(), BaseError> {
        let mut bad = false;
        self.index.range(
            Family::Extents,
            index::BLOCKS_START,
            index::BLOCKS_END,
            |k, v| {
                match (<BlockHash>::try_from(&k[1..]), BlockRecord::decode(v)) {
                    (Ok(h), Some(r)) => f(&h, r),
                    _ => bad = true,
                }
                !bad
            },
        )?;
        if bad {
            return Err(BaseError::Corrupt("a block record is malformed".into()));
        }
        Ok(())
    }

    /// Reads, opens and checks one block: exactly its bytes, or an error naming the block.
    pub fn read_block(&self, hash: &BlockHash) -> Result<Vec<u8>, BaseError> {
        let rec = self
            .block_record(hash)?
            .ok_or_else(|| BaseError::BlockMissing(hex::encode(hash)))?;
        let mut out = vec![0u8; self.pack(rec.pack)?.block_size as usize];
        self.packs.read_into(hash, &rec, &mut out)?;
        Ok(out)
    }

    /// The tree of ready base `name` as nodes to graft into a new volume, each file block a
    /// reference that carries the block's location (so reads need no index).
    pub fn graft_nodes(&self, name: &str) -> Result<(BaseRecord, Vec<GraftNode>), BaseError> {
        let record = self
            .record(name)?
            .filter(|r| r.state == BaseState::Ready)
            .ok_or_else(|| BaseError::Unknown(name.to_owned()))?;
        let mut entries: Vec<TreeEntry> = Vec::new();
        let (start, end) = index::base_range(b'T', name);
        let mut bad = None;
        self.index.range(Family::Inodes, &start, &end, |_, v| {
            match serde_json::from_slice(v) {
                Ok(e) => entries.push(e),
                Err(e) => bad = Some(e.to_string()),
            }
            true
        })?;
        if let Some(detail) = bad {
            return Err(BaseError::Corrupt(format!("tree of base {name}: {detail}")));
        }
        let mut blocks: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); entries.len()];
        let (start, end) = index::base_range(b'K', name);
        let mut refs: Vec<(usize, u64, BlockHash)> = Vec::new();
        self.index.range(Family::Dirents, &start, &end, |k, v| {
            let n = k.len();
            if n >= 16 && v.len() == 32 {
                let seq = u64::from_be_bytes(k[n - 16..n - 8].try_into().expect("8 bytes"));
                let index = u64::from_be_bytes(k[n - 8..].try_into().expect("8 bytes"));
                refs.push((seq as usize, index, v.try_into().expect("32 bytes")));
            }
            true
        })?;
        let mut records: HashMap<BlockHash, BlockRecord> = HashMap::new();
        for (seq, index, hash) in refs {
            let rec = match records.get(&hash) {
                Some(r) => *r,
                None => {
                    let r = self
                        .block_record(&hash)?
                        .ok_or_else(|| BaseError::BlockMissing(hex::encode(hash)))?;
                    records.insert(hash, r);
                    r
                }
            };
            blocks
                .get_mut(seq)
                .ok_or_else(|| {
                    BaseError::Corrupt(format!("tree of base {name}: block of entry {seq}"))
                })?
                .push((index, encode_ref(&hash, &rec)));
        }
        let nodes = entries
            .into_iter()
            .zip(blocks)
            .map(|(e, blocks)| GraftNode {
                kind: match e.kind {
                    EntryKind::File => FileKind::File,
                    EntryKind::Dir => FileKind::Dir,
                    EntryKind::Symlink => FileKind::Symlink,
                    EntryKind::Fifo => FileKind::Fifo,
                    EntryKind::Socket => FileKind::Socket,
                    EntryKind::CharDev => FileKind::CharDev,
                    EntryKind::BlockDev => FileKind::BlockDev,
                },
                perm: (e.mode & 0o7777) as u16,
                uid: e.uid,
                gid: e.gid,
                mtime: UNIX_EPOCH
                    + std::time::Duration::new(e.mtime_sec.max(0) as u64, e.mtime_nsec),
                size: e.size,
                rdev: e.rdev as u32,
                target: e.target.unwrap_or_default(),
                path: e.path,
                blocks,
            })
            .collect();
        Ok((record, nodes))
    }

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
            imp.flush()
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
        let mut b = self.index.batch();
        self.put_record(&mut b, &record);
        self.index.write(b)?;
        self.index.sync()?;
        Ok(self.info(&record))
    }

    /// Tenants created from base `name`.
    fn users(&self, name: &str) -> Result<Vec<String>, BaseError> {
        Ok(crate::tenants::list(&self.data_root)?
            .into_iter()
            .filter(|t| t.base.as_deref() == Some(name))
            .map(|t| t.name)
            .collect())
    }

    /// Creates tenant `tenant` from ready base `base`: a new tenant store (own key, the base's
    /// block size) holding the base's whole tree, its file blocks referencing the base's
    /// blocks: no data is copied. If grafting fails, the tenant is deleted again.
    pub fn create_tenant(
        &self,
        data: &DataDir,
        host: &StoreHost,
        tenant: &str,
        base: &str,
    ) -> Result<crate::tenants::TenantInfo, BaseError> {
        let (record, nodes) = self.graft_nodes(base)?;
        let info = crate::tenants::create_from(
            data,
            host,
            tenant,
            Some(record.block_size as u64),
            Some(base),
        )?;
        let grafted = (|| -> Result<u64, BaseError> {
            let volume = crate::volume::Volume::open(crate::tenants::open(data, host, tenant)?)?;
            Ok(volume.graft(base, nodes)?)
        })();
        match grafted {
            Ok(n) => {
                tracing::info!(tenant, base, nodes = n, "tenant created from base");
                Ok(info)
            }
            Err(e) => {
                if let Err(d) = crate::tenants::delete(data, tenant) {
                    tracing::error!(tenant, error = %d, "cannot remove a tenant whose graft failed");
                }
                Err(e)
            }
        }
    }

    fn info(&self, r: &BaseRecord) -> BaseInfo {
        BaseInfo {
            name: r.name.clone(),
            kind: r.kind,
            block_size: r.block_size,
            files: r.files,
            logical_bytes: r.logical_bytes,
            unique_bytes: r.unique_bytes.unwrap_or(0),
            stored_bytes: r.unique_blocks * r.block_size as u64,
            tenants: Vec::new(),
        }
    }

    /// Every ready base, with host totals.
    pub fn list(&self) -> Result<BaseList, BaseError> {
        let tenants = crate::tenants::list(&self.data_root)?;
        let bases: Vec<BaseInfo> = self
            .records()?
            .iter()
            .filter(|r| r.state == BaseState::Ready)
            .map(|r| BaseInfo {
                tenants: tenants
                    .iter()
                    .filter(|t| t.base.as_deref() == Some(r.name.as_str()))
                    .map(|t| t.name.clone())
                    .collect(),
                ..self.info(r)
            })
            .collect();
        let mut stored = 0u64;
        let mut sizes: HashMap<u32, u64> = HashMap::new();
        self.for_each_block(|_, r| *sizes.entry(r.pack).or_default() += 1)?;
        for (pack, n) in sizes {
            stored += n * self.pack(pack)?.block_size as u64;
        }
        let mut pack_bytes = 0;
        for id in self.pack_ids()? {
            let p = self.pack(id)?;
            pack_bytes += p.allocated_bytes().map_err(BaseError::io(p.path()))?;
        }
        Ok(BaseList {
            host: HostTotals {
                logical_bytes: bases.iter().map(|b| b.logical_bytes).sum(),
                stored_bytes: stored,
                pack_bytes,
            },
            bases,
        })
    }

    /// Deletes base `name`: its tree and its references; blocks no other base holds become
    /// garbage in their packs (reclaimed by `base gc`).
    pub fn delete(&self, name: &str) -> Result<(), BaseError> {
        let mut r = self
            .record(name)?
            .ok_or_else(|| BaseError::Unknown(name.to_owned()))?;
        let users = self.users(name)?;
        if !users.is_empty() {
            return Err(BaseError::InUse {
                base: name.to_owned(),
                tenants: users,
            });
        }
        r.state = BaseState::Deleting;
        let mut b = self.index.batch();
        self.put_record(&mut b, &r);
        self.index.write(b)?;
        self.drop_base(name)
    }

    /// Removes a base's keys and releases its references (idempotent: safe to repeat after a
    /// crash in the middle).
    fn drop_base(&self, name: &str) -> Result<(), BaseError> {
        let (start, end) = index::base_range(b'R', name);
        let mut hashes: Vec<BlockHash> = Vec::new();
        self.index.range(Family::Extents, &start, &end, |k, _| {
            if let Ok(h) = k[k.len() - 32..].try_into() {
                hashes.push(h);
            }
            true
        })?;
        for chunk in hashes.chunks(4096) {
            let mut b = self.index.batch();
            for h in chunk {
                if let Some(mut rec) = self.block_record(h)? {
                    rec.refs = rec.refs.saturating_sub(1);
                    if rec.refs == 0 {
                        b.delete(Family::Extents, &index::block_key(h));
                    } else {
                        b.put(Family::Extents, &index::block_key(h), &rec.encode());
                    }
                }
                // Dropped with its count change in one batch: a repeat skips it.
                b.delete(Family::Extents, &index::ref_key(name, h));
            }
            self.index.write(b)?;
        }
        let mut b = self.index.batch();
        for (tag, family) in [(b'T', Family::Inodes), (b'K', Family::Dirents)] {
            let (start, end) = index::base_range(tag, name);
            b.delete_range(family, &start, &end);
        }
        b.delete(Family::Meta, &index::base_key(name));
        self.index.write(b)?;
        self.index.sync()?;
        Ok(())
    }

    /// Gives back the disk space of pack slots that no block record points at: runs of such
    /// slots become holes (the file keeps its size, so no live block moves and tenants'
    /// references stay valid), and a pack with no live block left is deleted (never the one
    /// imports append to). It changes no index entry, so a crash at any point is harmless and
    /// running it again finishes the job.
    pub fn gc(&self, progress: &mut dyn FnMut(Progress)) -> Result<GcReport, BaseError> {
        let mut live: HashMap<u32, HashSet<u32>> = HashMap::new();
        self.for_each_block(|_, r| {
            live.entry(r.pack).or_default().insert(r.slot);
        })?;
        // Where imports append: those packs stay, and slots from the append point on are not
        // garbage but free.
        let mut appending: HashMap<u32, u32> = HashMap::new();
        self.index.range(Family::Meta, b"P", b"Q", |_, v| {
            if v.len() == 8 {
                appending.insert(
                    u32::from_be_bytes(v[..4].try_into().expect("4 bytes")),
                    u32::from_be_bytes(v[4..].try_into().expect("4 bytes")),
                );
            }
            true
        })?;
        let ids = self.pack_ids()?;
        let mut report = GcReport {
            live_blocks: live.values().map(|s| s.len() as u64).sum(),
            ..GcReport::default()
        };
        for (n, id) in ids.iter().enumerate() {
            progress(Progress {
                done_bytes: n as u64,
                total_bytes: ids.len() as u64,
            });
            report.packs += 1;
            let pack = self.pack(*id)?;
            let path = pack.path().to_owned();
            let io = BaseError::io(&path);
            let before = pack.allocated_bytes().map_err(&io)?;
            let slots_live = live.get(id);
            if slots_live.is_none() && !appending.contains_key(id) {
                drop(pack);
                self.packs.forget(*id);
                std::fs::remove_file(&path).map_err(BaseError::io(&path))?;
                report.packs_deleted += 1;
                report.reclaimed_bytes += before;
                continue;
            }
            let end = match appending.get(id) {
                Some(&next) => next as u64,
                None => pack.slots_on_disk().map_err(&io)?,
            };
            let mut run: Option<(u32, u32)> = None;
            for slot in 0..end as u32 {
                let garbage = !slots_live.is_some_and(|s| s.contains(&slot));
                if garbage {
                    report.garbage_slots += 1;
                    run = Some(match run {
                        Some((first, n)) => (first, n + 1),
                        None => (slot, 1),
                    });
                } else if let Some((first, n)) = run.take() {
                    pack.punch(first, n).map_err(&io)?;
                }
            }
            if let Some((first, n)) = run {
                pack.punch(first, n).map_err(&io)?;
            }
            report.reclaimed_bytes += before.saturating_sub(pack.allocated_bytes().map_err(&io)?);
        }
        progress(Progress {
            done_bytes: ids.len() as u64,
            total_bytes: ids.len() as u64,
        });
        tracing::info!(?report, "base gc done");
        Ok(report)
    }

    /// Reads every stored block back and checks it; and that every block a tree names exists.
    pub fn verify(&self) -> Result<VerifyReport, BaseError> {
        let mut report = VerifyReport::default();
        let mut blocks: Vec<(BlockHash, BlockRecord)> = Vec::new();
        self.for_each_block(|h, r| blocks.push((*h, r)))?;
        for (h, rec) in &blocks {
            report.blocks += 1;
            // The record is in hand: read the slot without looking it up again.
            let read = self.pack(rec.pack).and_then(|p| {
                let mut out = vec![0u8; p.block_size as usize];
                self.packs.read_into(h, rec, &mut out)
            });
            match read {
                Ok(()) => {}
                Err(e @ (BaseError::BlockCorrupt { .. } | BaseError::Io { .. })) => {
                    report.bad.push(format!("{}: {e}", hex::encode(h)))
                }
                Err(e) => return Err(e),
            }
        }
        let known: HashSet<BlockHash> = blocks.into_iter().map(|(h, _)| h).collect();
        self.index.range(Family::Dirents, b"K", b"L", |_, v| {
            if v.len() != 32 || !known.contains(<&BlockHash>::try_from(v).expect("32 bytes")) {
                report.missing += 1;
            }
            true
        })?;
        Ok(report)
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
    entries: usize,
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
            entries: 0,
        })
    }

    /// Adds block `index` of entry `seq`, which holds `len` bytes of the file (the rest of
    /// `block` is zero padding).
    fn add(&mut self, seq: u64, index: u64, block: &[u8], len: usize) -> Result<(), BaseError> {
        if block.iter().all(|&b| b == 0) {
            return Ok(()); // a hole
        }
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
            None => self.seal(&hash, block)?,
        };
        self.dirty.insert(hash, rec);
        if self.buffered == FLUSH_BLOCKS {
            self.flush()?;
        }
        Ok(())
    }

    fn seal(&mut self, hash: &BlockHash, block: &[u8]) -> Result<BlockRecord, BaseError> {
        if self.next_slot == MAX_SLOTS {
            self.flush()?;
            self.pack = self.store.new_pack(self.block_size)?;
            self.next_slot = 0;
            self.first_slot = 0;
        }
        let mut nonce = [0u8; 12];
        crate::crypto::random_bytes(&mut nonce)?;
        let bs = self.block_size as usize;
        let slot = &mut self.buf[self.buffered * bs..(self.buffered + 1) * bs];
        slot.copy_from_slice(block);
        let tag = self
            .store
            .packs
            .cipher()
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), hash, slot)
            .map_err(|_| BaseError::Corrupt("AES-GCM refused to seal a block".into()))?;
        let rec = BlockRecord {
            pack: self.pack.id,
            slot: self.next_slot,
            nonce,
            tag: tag.into(),
            refs: 1,
        };
        self.buffered += 1;
        self.next_slot += 1;
        Ok(rec)
    }

    fn maybe_flush(&mut self) -> Result<(), BaseError> {
        if self.entries >= 16 * FLUSH_BLOCKS || self.batch.len() >= 16 * FLUSH_BLOCKS {
            self.flush()?;
        }
        Ok(())
    }

    /// Pack data first (written, synced), then the index batch that points at it.
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
    fn pack_ids(&self) -> Result<Vec<u32>, BaseError> {
        let mut ids = Vec::new();
        for e in std::fs::read_dir(&self.packs_dir)
            .map_err(BaseError::io(&self.packs_dir))?
            .flatten()
        {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(n) = name
                .strip_prefix("pack-")
                .and_then(|s| s.strip_suffix(".tfp"))
            {
                if let Ok(n) = n.parse::<u32>() {
                    ids.push(n);
                }
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn new_pack(&self, block_size: u32) -> Result<Arc<Pack>, BaseError> {
        let id = self.pack_ids()?.last().map_or(1, |n| n + 1);
        let pack = Arc::new(
            Pack::create(&self.packs_dir, id, block_size, &self.packs.slabs)
                .map_err(BaseError::io(&super::pack::pack_path(&self.packs_dir, id)))?,
        );
        self.packs.add_pack(pack.clone());
        Ok(pack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migration of version-1 records recounts `unique_bytes` from the index exactly as
    /// the import counted it: partial last blocks, a duplicate block, a hole.
    #[test]
    fn migration_counts_unique_bytes_as_the_import_did() {
        let tmp = tempfile::Builder::new()
            .prefix("tenantfs-base-migrate-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let root = tmp.path().join("data");
        DataDir::init(&root, None).unwrap();
        let data = DataDir::open(&root, None).unwrap();
        let host = StoreHost::builder().build();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        let block = vec![7u8; 4096];
        let a = [block.as_slice(), &[0u8; 4096], &[3u8; 10]].concat();
        std::fs::write(src.join("a"), &a).unwrap();
        std::fs::write(src.join("d/b"), [block.as_slice(), &[9u8; 33]].concat()).unwrap();
        std::fs::write(src.join("d/c"), vec![5u8; 5000]).unwrap();
        let store = BaseStore::open(&data, &host).unwrap();
        store.import("m", &src, 4096, &mut |_| {}).unwrap();
        let record = store.record("m").unwrap().unwrap();
        let counted = record.unique_bytes.unwrap();
        assert_eq!(
            counted,
            4096 + 10 + 33 + 5000,
            "the repeated block counts once"
        );
        assert_eq!(store.unique_bytes_of(&record).unwrap(), counted);
        // A version-1 record (no unique_bytes) is migrated when the store opens.
        let mut old = record.clone();
        old.format_version = 1;
        old.unique_bytes = None;
        let mut b = store.index.batch();
        store.put_record(&mut b, &old);
        store.index.write(b).unwrap();
        drop(store);
        let store = BaseStore::open(&data, &host).unwrap();
        let migrated = store.record("m").unwrap().unwrap();
        assert_eq!(migrated.format_version, FORMAT_VERSION);
        assert_eq!(migrated.unique_bytes, Some(counted));
    }
}
