//! The host's base store: its records, block reads, grafting a base into a new tenant,
//! listing and deletion; imports in `import`, gc and verification in `upkeep`.

mod import;
mod template;
pub(crate) use template::reseal as reseal_templates;
mod upkeep;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::index::{self, BlockRecord};
use super::pack::Pack;
use super::reader::{encode_ref, PackReader};
use super::tree::{EntryKind, SourceKind, TreeEntry};
use super::{BaseError, BlockHash};
use crate::crypto::TenantKey;
use crate::data_dir::DataDir;
use crate::store::{Batch, Encryption, Family, OpenMode, StoreHost, TenantDb};
use crate::volume::{FileKind, GraftNode};

/// Version 2 added `unique_bytes`; version-1 records get it computed from the index at open.
/// Version 3: the base's short blocks may be stored as fragments (several to a slot), which a
/// tenantfs that reads version 2 would not find; `stored_bytes` added. Records of versions 1
/// and 2 stay as they are (their blocks fill their slots).
const FORMAT_VERSION: u32 = 3;
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
    /// Bytes those distinct blocks take in packs: a slot each, or a fragment's bytes for a block
    /// stored as one. None in records before version 3, whose blocks each fill a slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    pub created_unix: u64,
}

/// How a raw image becomes a block volume's device ([`BaseStore::create_volume`]).
#[derive(Clone, Copy, Debug)]
pub struct ImageDevice<'a> {
    /// The name of the device's file in the volume's store.
    pub file: &'a [u8],
    /// The device's size: at least the image's; if `None`, the image's size rounded up to a
    /// multiple of `granule`.
    pub size: Option<u64>,
    pub granule: u64,
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
    /// What its distinct blocks take in packs (a slot each, or a fragment's bytes): what it
    /// would take on disk alone, headers and partly filled slots aside.
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
        let key: TenantKey = super::host_keys::host_key(data, super::host_keys::HostKey::Index)?;
        let index = TenantDb::open(
            host,
            INDEX_NAME,
            &index_dir,
            Encryption::of_key(key),
            OpenMode::Create,
        )
        .map_err(|e| match e {
            crate::store::StoreError::InUse { .. } => BaseError::StoreBusy,
            e => e.into(),
        })?;
        let store = Self {
            data_root: data.root().to_owned(),
            packs_dir,
            index,
            packs: PackReader::new(data)?,
        };
        for mut record in store.records()? {
            match record.state {
                BaseState::Ready if record.unique_bytes.is_none() => {
                    record.unique_bytes = Some(store.unique_bytes_of(&record)?);
                    record.format_version = FORMAT_VERSION;
                    let mut b = store.index.batch();
                    store.put_record(&mut b, &record);
                    store.index.write(b)?;
                    tracing::info!(
                        base = %record.name,
                        "base record migrated to format {FORMAT_VERSION}"
                    );
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

    /// The ids of the pack files present, in order.
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
        let record = self.ready(name)?;
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

    /// The record of base `name`, which must be ready.
    fn ready(&self, name: &str) -> Result<BaseRecord, BaseError> {
        self.record(name)?
            .filter(|r| r.state == BaseState::Ready)
            .ok_or_else(|| BaseError::Unknown(name.to_owned()))
    }

    /// Creates `tenant` as `new` says (its block size and base: `record`'s) as a copy of
    /// `record`'s template (built first if it has none), which `shape` may change before the
    /// tenant appears (it gets the staged store and the tenant's ring).
    fn copy_template(
        &self,
        data: &DataDir,
        host: &StoreHost,
        tenant: &str,
        record: &BaseRecord,
        new: crate::tenants::NewTenant<'_>,
        shape: impl FnOnce(&std::path::Path, Arc<crate::crypto::Keyring>) -> Result<(), BaseError>,
    ) -> Result<crate::tenants::TenantInfo, BaseError> {
        let template = self.template(data, host, record)?;
        let new = crate::tenants::NewTenant {
            block_size: Some(record.block_size as u64),
            base: Some(&record.name),
            ..new
        };
        crate::tenants::create_from_base_store(
            data,
            tenant,
            &new,
            (template.key_id, &template.key),
            |db, ring| -> Result<(), BaseError> {
                crate::store::TenantDb::copy_checkpoint(tenant, &template.db, db)?;
                shape(db, ring)
            },
        )
    }

    /// Tenants created from base `name`.
    fn users(&self, name: &str) -> Result<Vec<String>, BaseError> {
        Ok(crate::tenants::list(&self.data_root)?
            .into_iter()
            .filter(|t| t.base.as_deref() == Some(name))
            .map(|t| t.name)
            .collect())
    }

    /// Creates tenant `tenant` from ready base `base`: a new tenant store (the base's block
    /// size) that starts as a copy of the base's template (`template`: the base's whole tree,
    /// its file blocks referencing the base's blocks), sharing its files: no data is copied,
    /// and the cost does not grow with the base. The template is built at the first tenant.
    pub fn create_tenant(
        &self,
        data: &DataDir,
        host: &StoreHost,
        tenant: &str,
        base: &str,
    ) -> Result<crate::tenants::TenantInfo, BaseError> {
        self.create_tenant_with_quota(data, host, tenant, base, Default::default())
    }

    /// [`Self::create_tenant`] with a quota. The grafted files count against it as written
    /// ones do (a tree larger than the quota leaves the tenant refusing writes until files
    /// are deleted or the quota is raised).
    pub fn create_tenant_with_quota(
        &self,
        data: &DataDir,
        host: &StoreHost,
        tenant: &str,
        base: &str,
        quota: crate::quota::Quota,
    ) -> Result<crate::tenants::TenantInfo, BaseError> {
        let record = self.ready(base)?;
        let new = crate::tenants::NewTenant {
            quota,
            ..Default::default()
        };
        let info = self.copy_template(data, host, tenant, &record, new, |_, _| Ok(()))?;
        tracing::info!(tenant, base, "tenant created from base");
        Ok(info)
    }

    /// Creates block volume `tenant` from ready base `base`, a raw image: the image becomes
    /// the volume's device as `device` says, copy on write as any tenant from a base. The
    /// volume starts as a copy of the base's template, as a tenant from a base does; then its
    /// one file is renamed to the device's and grown to its size (both O(1)).
    pub fn create_volume(
        &self,
        data: &DataDir,
        host: &StoreHost,
        tenant: &str,
        base: &str,
        device: &ImageDevice,
    ) -> Result<crate::tenants::TenantInfo, BaseError> {
        let record = self.ready(base)?;
        if record.kind != SourceKind::Image {
            return Err(BaseError::NotAnImage(base.to_owned()));
        }
        let image = record.logical_bytes;
        let size = device
            .size
            .unwrap_or(image.next_multiple_of(device.granule));
        if size < image {
            return Err(BaseError::SmallerThanImage {
                base: base.to_owned(),
                image,
                size,
            });
        }
        let new = crate::tenants::NewTenant {
            device_size: Some(size),
            ..Default::default()
        };
        // The device is made in the staged copy, before the volume appears: a crash leaves
        // no volume without its device.
        let info = self.copy_template(data, host, tenant, &record, new, |db, ring| {
            make_device(data, host, tenant, &record, db, ring, size, device)
        })?;
        tracing::info!(tenant, base, size, "block volume created from base");
        Ok(info)
    }

    fn info(&self, r: &BaseRecord) -> BaseInfo {
        BaseInfo {
            name: r.name.clone(),
            kind: r.kind,
            block_size: r.block_size,
            files: r.files,
            logical_bytes: r.logical_bytes,
            unique_bytes: r.unique_bytes.unwrap_or(0),
            stored_bytes: r
                .stored_bytes
                .unwrap_or(r.unique_blocks * r.block_size as u64),
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
        let mut block_sizes: HashMap<u32, u32> = HashMap::new();
        let mut blocks: Vec<BlockRecord> = Vec::new();
        self.for_each_block(|_, r| blocks.push(r))?;
        for r in blocks {
            let bs = match block_sizes.get(&r.pack) {
                Some(&bs) => bs,
                None => *block_sizes
                    .entry(r.pack)
                    .or_insert(self.pack(r.pack)?.block_size),
            };
            stored += r.stored_bytes(bs);
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
        // (Its tenants, none left, linked the template's files: their copies stay theirs.)
        let dir = template::dir_of(&self.data_root, name);
        template::remove_if_there(&template::staging_of(&dir))?;
        template::remove_if_there(&dir)?;
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
}

/// Makes the device of new block volume `tenant` in its staged store `db` (a copy of raw
/// image base `record`'s template, opened under the volume's `ring`): the image's one file
/// renamed to the device's name and grown from the image's size to `size`.
#[allow(clippy::too_many_arguments)]
fn make_device(
    data: &DataDir,
    host: &StoreHost,
    tenant: &str,
    record: &BaseRecord,
    db: &std::path::Path,
    ring: Arc<crate::crypto::Keyring>,
    size: u64,
    device: &ImageDevice,
) -> Result<(), BaseError> {
    let image = record.logical_bytes;
    let lock = crate::tenant_lock::lock(data.root(), tenant).map_err(|e| {
        BaseError::Tenant(crate::tenants::TenantError::InUse(format!("{tenant}: {e}")))
    })?;
    let store = TenantDb::open(
        host,
        tenant,
        db,
        Encryption::Tenant(Arc::clone(&ring)),
        OpenMode::Existing,
    )?;
    let info = crate::tenants::TenantInfo {
        name: tenant.to_owned(),
        block_size: record.block_size,
        created_unix: now_unix(),
        disk_bytes: 0,
        base: Some(record.name.clone()),
        device_size: Some(size),
        quota: Default::default(),
    };
    let volume =
        crate::volume::Volume::open(crate::tenants::Tenant::unlisted(info, store, ring, lock))?;
    let root = crate::volume::ROOT_INO;
    let file = volume
        .readdir(root)?
        .into_iter()
        .find(|e| e.kind == FileKind::File)
        .ok_or_else(|| BaseError::Corrupt(format!("the raw image base of {tenant} has no file")))?;
    if file.name != device.file {
        let mode = crate::volume::RenameMode::NoReplace;
        volume.rename(root, &file.name, root, device.file, mode)?;
    }
    if size != image {
        let grow = crate::volume::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        volume.setattr(file.ino, &grow)?;
    }
    volume.fsync()?;
    Ok(())
}

#[cfg(test)]
mod tests;
