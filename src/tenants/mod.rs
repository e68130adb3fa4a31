//! The tenant registry: one directory per tenant under `<data-dir>/tenants/`.
//!
//! ```text
//! tenants/<name>/tenant.json   name, format version, block size, creation time, wrapped key,
//!                              base, device size (block volumes), quota
//! tenants/<name>/db/           the tenant's encrypted RocksDB
//! tenants/<name>/snapshots/    its snapshots (`snapshots`)
//! ```
//!
//! A tenant appears only whole: `create` builds everything in a hidden staging directory and
//! renames it into place; `delete` renames the directory away before removing it. The tenant's
//! lock ([`crate::tenant_lock`], in the data dir's one lock file) makes "in use" visible across
//! processes, so a mounted tenant cannot be deleted or opened twice.
//!
//! A restore ([`replace_store`]) puts a copy of a snapshot's store in place of the tenant's:
//! the copy is made beside it (`db.restoring`, with the record it brings,
//! `tenant.json.restoring`), then the store is renamed away (`db.replaced`), the copy into
//! its place and the record over the old one. Whoever takes the tenant's lock next finishes a
//! restore that got as far as renaming the store away, and undoes one that did not.
//!
//! Everything about one tenant (create, open, info, delete) reads that tenant's directory
//! only, never the others': its cost does not grow with the number of tenants. Only `list`
//! walks them all.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::crypto::{KeyError, KeyId, Keyring, TenantKey};
use crate::data_dir::{tenants_dir, DataDir};
use crate::fs_util::{sync_dir, tree_bytes, write_atomic};
use crate::process;
use crate::quota::Quota;
use crate::store::{Encryption, OpenMode, StoreError, StoreHost, TenantDb};
pub use crate::tenant_lock::TenantLock;
use crate::tenant_lock::{self, LockError};

mod keys;
mod restore;

use keys::keyring;
pub(crate) use keys::{create_fork, create_from_base_store, reseal, Reseal};
pub use keys::{delete_shredded, key_ids, rotate_key, rotate_key_closed};
use restore::finish_restore;
pub(crate) use restore::replace_store;

const RECORD: &str = "tenant.json";
const DB: &str = "db";
/// A restore's copy of a snapshot's store, whole, before it takes the store's place.
const RESTORING_DB: &str = "db.restoring";
/// The store a restore replaces, until the restore is finished.
const REPLACED_DB: &str = "db.replaced";
/// The record a restore brings, until it is in place.
const RESTORING_RECORD: &str = "tenant.json.restoring";
/// The record's layout: 2 holds a ring of keys (`keys`, `writing_key`); 3 also marks a key as
/// its base's (`RecordKey::base`), and is written only then. A record of 1 (one key,
/// `wrapped_key`) is read as a ring of that key and written as 2 when it next changes.
const FORMAT_VERSION: u32 = 4;
/// Block size of a new volume when none is given.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(
        "invalid tenant name {0:?}: use 1-64 characters from a-z, A-Z, 0-9, '.', '_', '-', \
         starting with a letter or digit"
    )]
    BadName(String),
    #[error("tenant {0} already exists; pick another name or delete it first")]
    Exists(String),
    #[error("unknown tenant {name}; `tenantfs tenant list` shows the tenants in {root}")]
    Unknown { name: String, root: PathBuf },
    #[error("tenant {0} is in use (mounted or open in another process); unmount it first")]
    InUse(String),
    #[error(
        "tenant {name} is in use by process {pid} ({command}): it has it mounted or open; \
         unmount it there first"
    )]
    InUseBy {
        name: String,
        pid: u32,
        command: String,
    },
    #[error(
        "tenant {name} is still held by process {pid}, which is exiting, after waiting {secs} \
         s; try again once it is gone"
    )]
    StillExiting { name: String, pid: u32, secs: u64 },
    #[error("invalid block size {0}: it must be a power of two from 4096 to 1048576 bytes")]
    BadBlockSize(u64),
    #[error(
        "tenant {0}: its key does not open under this master key; \
         use the master key the tenant was created with (nothing was changed)"
    )]
    WrongKey(String),
    #[error("tenant {name}: record {path} is damaged ({detail}); restore it from a backup")]
    BadRecord {
        name: String,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "tenant {0}: its keys were destroyed by a `tenant delete --shred` that was cut short; \
         run `tenantfs tenant delete {0} --shred` again to finish it"
    )]
    Shredded(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TenantError + '_ {
    move |source| TenantError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the registry knows about a tenant without opening its store.
#[derive(Clone, Debug, Serialize)]
pub struct TenantInfo {
    pub name: String,
    pub block_size: u32,
    pub created_unix: u64,
    /// Disk the tenant's directory takes (allocated bytes of its store files, preallocated
    /// space included).
    pub disk_bytes: u64,
    /// The base image the tenant was created from, if any.
    pub base: Option<String>,
    /// A block volume's device size (its store holds one device, `blockdev`); `None` for a
    /// filesystem tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_size: Option<u64>,
    /// What its files may take (see `quota`).
    #[serde(skip_serializing_if = "Quota::is_unlimited")]
    pub quota: Quota,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantRecord {
    format_version: u32,
    name: String,
    block_size: u32,
    created_unix: u64,
    /// Format 1: the tenant's one key, sealed under the master key (hex). Read as key
    /// `KeyId::FIRST` of a ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped_key: Option<String>,
    /// Format 2: the tenant's keys: its own and, for a fork, the keys of the files it shares
    /// with its source, each sealed under the master key bound to this tenant's name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    keys: Vec<RecordKey>,
    /// The id of the key its new files are sealed under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    writing_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<String>,
    /// Set for a block volume: the size of its device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device_size: Option<u64>,
    /// Absent when unlimited (a record with one is refused by a tenantfs without quotas).
    #[serde(default, skip_serializing_if = "Quota::is_unlimited")]
    quota: Quota,
}

/// One key of a tenant's ring in its record.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordKey {
    /// [`KeyId`] in hex: the id file headers name.
    id: String,
    /// The key sealed under the master key, bound to the tenant's name (hex).
    wrapped: String,
    /// The key of its base's template (format 3), whose files every tenant of the base shares:
    /// the base's, not the tenant's own (a shred does not count tenants that hold it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    base: bool,
    /// The key sealed under the master key a rotation moves to (format 4), while it is on
    /// its way: `wrapped` opens under the old master key, this under the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped_next: Option<String>,
}

impl TenantRecord {
    /// The record of new tenant `name`, made now, with `keys` (new files sealed under
    /// `writing`) and what `new` says (its block size aside: `block_size`).
    fn new(
        name: &str,
        block_size: u32,
        keys: Vec<RecordKey>,
        writing: KeyId,
        new: &NewTenant,
    ) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            name: name.to_owned(),
            block_size,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            wrapped_key: None,
            keys,
            writing_key: Some(writing.to_hex()),
            base: new.base.map(str::to_owned),
            device_size: new.device_size,
            quota: new.quota,
        }
    }

    /// The oldest format that holds the record: 4 only while a master key rotation gives a
    /// key a second seal, 3 only if a key is marked as its base's, so that an older tenantfs
    /// still reads every other record.
    fn settle_version(&mut self) {
        self.format_version = if self.keys.iter().any(|k| k.wrapped_next.is_some()) {
            4
        } else if self.keys.iter().any(|k| k.base) {
            3
        } else {
            2
        };
    }

    fn info(self, disk_bytes: u64) -> TenantInfo {
        TenantInfo {
            name: self.name,
            block_size: self.block_size,
            created_unix: self.created_unix,
            disk_bytes,
            base: self.base,
            device_size: self.device_size,
            quota: self.quota,
        }
    }
}

/// What a new tenant is: how its data is cut, where its tree comes from, what it holds.
#[derive(Clone, Debug, Default)]
pub struct NewTenant<'a> {
    /// Block size (default [`DEFAULT_BLOCK_SIZE`]).
    pub block_size: Option<u64>,
    /// The base image its tree comes from (the caller grafts it: see `base::create_tenant`).
    pub base: Option<&'a str>,
    /// A block volume's device size (the caller creates the device: see `blockdev`).
    pub device_size: Option<u64>,
    /// What its files may take.
    pub quota: Quota,
}

/// Checks a tenant name: safe as a path component and in logs.
pub fn validate_name(name: &str) -> Result<(), TenantError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(TenantError::BadName(name.to_owned()))
    }
}

fn validate_block_size(size: u64) -> Result<u32, TenantError> {
    if size.is_power_of_two() && (4096..=1 << 20).contains(&size) {
        Ok(size as u32)
    } else {
        Err(TenantError::BadBlockSize(size))
    }
}

/// An open tenant: its store, and the lock that says so to other processes.
pub struct Tenant {
    info: TenantInfo,
    db: TenantDb,
    lock: TenantLock,
    /// The ring its store seals and opens files with (a rotation changes it in place).
    keys: Arc<Keyring>,
}

impl Tenant {
    /// A store no tenant record describes, held under `lock`, as tenant `info` (a base's
    /// template while it is built: `base::template`).
    pub(crate) fn unlisted(
        info: TenantInfo,
        db: TenantDb,
        keys: Arc<Keyring>,
        lock: TenantLock,
    ) -> Self {
        Self {
            info,
            db,
            lock,
            keys,
        }
    }

    pub fn info(&self) -> &TenantInfo {
        &self.info
    }

    pub fn db(&self) -> &TenantDb {
        &self.db
    }

    /// The ring its store seals and opens files with.
    pub fn keys(&self) -> &Keyring {
        &self.keys
    }

    /// Another hold on the tenant's lock: it stays taken after this [`Tenant`] (and its
    /// store) closes, until the hold drops too (a mount that closes its idle store keeps
    /// the tenant its own: see [`open_locked`]).
    pub fn lock(&self) -> TenantLock {
        self.lock.clone()
    }
}

/// Creates a tenant with a fresh key and an empty store.
pub fn create(
    data: &DataDir,
    host: &StoreHost,
    name: &str,
    block_size: Option<u64>,
) -> Result<TenantInfo, TenantError> {
    let new = NewTenant {
        block_size,
        ..NewTenant::default()
    };
    create_as(data, host, name, &new)
}

/// Creates a tenant as `create` does, with what `new` records about it.
pub fn create_as(
    data: &DataDir,
    host: &StoreHost,
    name: &str,
    new: &NewTenant,
) -> Result<TenantInfo, TenantError> {
    let block_size = validate_block_size(new.block_size.unwrap_or(DEFAULT_BLOCK_SIZE as u64))?;
    create_staged(name, data, |staging| {
        let (id, key) = (KeyId::generate()?, TenantKey::generate()?);
        let keys = vec![RecordKey {
            id: id.to_hex(),
            wrapped: hex::encode(data.master_key().wrap_tenant_key(name, &key)?),
            base: false,
            wrapped_next: None,
        }];
        drop(TenantDb::open(
            host,
            name,
            &staging.join(DB),
            Encryption::Tenant(Arc::new(Keyring::single(id, key))),
            OpenMode::Create,
        )?);
        Ok(TenantRecord::new(name, block_size, keys, id, new))
    })
}

/// Makes tenant `name` appear whole: `build` fills a hidden staging directory (its store) and
/// returns the record, which is written there before the directory is renamed into place; a
/// failure removes the staging directory.
fn create_staged<E: From<TenantError>>(
    name: &str,
    data: &DataDir,
    build: impl FnOnce(&Path) -> Result<TenantRecord, E>,
) -> Result<TenantInfo, E> {
    validate_name(name)?;
    let root = data.tenants_dir();
    let dir = root.join(name);
    if dir.exists() {
        return Err(TenantError::Exists(name.to_owned()).into());
    }
    // (What a killed create left is not looked for here: that would read every tenant's
    // name. `delete --shred` removes it: a killed fork's holds its source's keys.)
    let staging = root.join(format!(".creating-{name}-{}", std::process::id()));
    let _keys = data.hold_keys().map_err(TenantError::from)?;
    // Taken by a create of the same name in this process, which goes on.
    fs::create_dir(&staging).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => TenantError::Exists(name.to_owned()),
        _ => io_err(&staging)(e),
    })?;
    let result = (|| {
        let mut record = build(&staging)?;
        record.settle_version();
        let json = serde_json::to_vec_pretty(&record).expect("record serialises");
        let record_path = staging.join(RECORD);
        write_atomic(&record_path, &json, 0o600).map_err(io_err(&record_path))?;
        // rename(2) will not replace a non-empty directory, so a racing create loses cleanly.
        fs::rename(&staging, &dir).map_err(|e| {
            if dir.exists() {
                TenantError::Exists(name.to_owned())
            } else {
                io_err(&dir)(e)
            }
        })?;
        sync_dir(&root).map_err(io_err(&root))?;
        Ok(record.info(tree_bytes(&dir)))
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

fn read_record(dir: &Path, name: &str) -> Result<TenantRecord, TenantError> {
    read_record_file(&dir.join(RECORD), name)
}

/// [`read_record`] of the record at `path` (a tenant's, or a restore's on its way).
fn read_record_file(path: &Path, name: &str) -> Result<TenantRecord, TenantError> {
    let path = path.to_owned();
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    if !bytes.is_empty() && bytes.iter().all(|&b| b == 0) {
        return Err(TenantError::Shredded(name.to_owned()));
    }
    let record: TenantRecord =
        serde_json::from_slice(&bytes).map_err(|e| TenantError::BadRecord {
            name: name.to_owned(),
            path: path.clone(),
            detail: e.to_string(),
        })?;
    let bad = |detail: String| TenantError::BadRecord {
        name: name.to_owned(),
        path: path.clone(),
        detail,
    };
    if record.name != name || !(1..=FORMAT_VERSION).contains(&record.format_version) {
        return Err(bad(format!(
            "it names tenant {:?} with format version {}; this tenantfs reads versions 1 to \
             {FORMAT_VERSION} (a newer tenantfs wrote it? use that one)",
            record.name, record.format_version
        )));
    }
    let mut record = record;
    let v1 = record.format_version == 1;
    match (v1, record.wrapped_key.take(), record.keys.is_empty()) {
        (true, Some(wrapped), true) if record.writing_key.is_none() => {
            record.keys = vec![RecordKey {
                id: KeyId::FIRST.to_hex(),
                wrapped,
                base: false,
                wrapped_next: None,
            }];
            record.writing_key = Some(KeyId::FIRST.to_hex());
            record.format_version = 2;
        }
        // A key marked as its base's needs format 3, a second seal format 4.
        (false, None, false)
            if (record.format_version >= 3 || !record.keys.iter().any(|k| k.base))
                && (record.format_version >= 4
                    || record.keys.iter().all(|k| k.wrapped_next.is_none())) => {}
        _ => {
            return Err(bad(format!(
                "its keys do not fit format version {}",
                record.format_version
            )))
        }
    }
    let ids: Option<Vec<KeyId>> = record.keys.iter().map(|k| KeyId::from_hex(&k.id)).collect();
    let writing = record.writing_key.as_deref().and_then(KeyId::from_hex);
    match (ids, writing) {
        (Some(ids), Some(w)) if ids.contains(&w) => Ok(record),
        _ => Err(bad(
            "a key id is not 16 hex digits, or the writing key is not among its keys".into(),
        )),
    }
}

fn tenant_dir(root: &Path, name: &str) -> Result<PathBuf, TenantError> {
    validate_name(name)?;
    let dir = tenants_dir(root).join(name);
    if dir.join(RECORD).exists() {
        Ok(dir)
    } else {
        Err(TenantError::Unknown {
            name: name.to_owned(),
            root: root.to_owned(),
        })
    }
}

/// One tenant's record and disk use, from its own directory only: commands about one tenant
/// cost the same however many tenants the data dir holds. Needs no key.
pub fn info(root: &Path, name: &str) -> Result<TenantInfo, TenantError> {
    let dir = tenant_dir(root, name)?;
    Ok(read_record(&dir, name)?.info(tree_bytes(&dir)))
}

/// Every tenant in the data dir at `root`, by name. Needs no key.
pub fn list(root: &Path) -> Result<Vec<TenantInfo>, TenantError> {
    let dir = tenants_dir(root);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(TenantError::Io {
                path: dir,
                source: e,
            })
        }
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if validate_name(&name).is_err() || !entry.path().join(RECORD).exists() {
            continue; // staging or deleting directories, stray files
        }
        let record = match read_record(&entry.path(), &name) {
            Err(TenantError::Shredded(_)) => continue, // on its way out
            r => r?,
        };
        out.push(record.info(tree_bytes(&entry.path())));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Takes tenant `name` of the data dir at `root` for this process (see [`tenant_lock`]), and
/// finishes (or undoes) a restore of it that was cut short, so that whoever holds the lock
/// sees the tenant whole.
fn lock(root: &Path, name: &str) -> Result<TenantLock, TenantError> {
    let lock = tenant_lock::lock(root, name).map_err(|e| match e {
        LockError::Held => TenantError::InUse(name.to_owned()),
        LockError::Io { path, source } => TenantError::Io {
            path: PathBuf::from(path),
            source,
        },
    })?;
    let dir = tenants_dir(root).join(name);
    if dir.join(RESTORING_RECORD).exists() || dir.join(REPLACED_DB).exists() {
        // It may put the restore's record in place: not beside a master key rotation.
        let _keys = crate::data_dir::hold_records(root)?;
        finish_restore(name, &dir)?;
    }
    Ok(lock)
}

/// Opens a tenant's store, holding its lock until the returned [`Tenant`] drops.
pub fn open(data: &DataDir, host: &StoreHost, name: &str) -> Result<Tenant, TenantError> {
    let dir = tenant_dir(data.root(), name)?;
    let record = read_record(&dir, name)?;
    // Unwrap before touching anything: a wrong key must change nothing at rest.
    keyring(data, name, &dir, &record)?;
    let lock = lock(data.root(), name)?;
    // Read again: taking the lock finished a restore that was cut short, if there was one.
    let record = read_record(&dir, name)?;
    let keys = keyring(data, name, &dir, &record)?;
    open_store(host, name, &dir, record, keys, lock)
}

/// Opens the store of a tenant this process holds locked already (`lock`, taken by an
/// earlier [`open`]), as [`open`] does.
pub fn open_locked(
    data: &DataDir,
    host: &StoreHost,
    name: &str,
    lock: TenantLock,
) -> Result<Tenant, TenantError> {
    let dir = tenant_dir(data.root(), name)?;
    let record = read_record(&dir, name)?;
    let key = keyring(data, name, &dir, &record)?;
    open_store(host, name, &dir, record, key, lock)
}

/// The directory of tenant `name` in the data dir at `root` (which must hold it).
pub(crate) fn dir_of(root: &Path, name: &str) -> Result<PathBuf, TenantError> {
    tenant_dir(root, name)
}

/// Takes tenant `name` for a change that needs it closed: one that is open anywhere is
/// refused, naming the process that holds it.
pub(crate) fn lock_closed(root: &Path, name: &str) -> Result<TenantLock, TenantError> {
    lock(root, name).map_err(|e| match (e, tenant_lock::holder(root, name)) {
        (TenantError::InUse(_), Some(pid)) => TenantError::InUseBy {
            name: name.to_owned(),
            pid,
            command: process::command(pid),
        },
        (e, _) => e,
    })
}

fn open_store(
    host: &StoreHost,
    name: &str,
    dir: &Path,
    record: TenantRecord,
    keys: Keyring,
    lock: TenantLock,
) -> Result<Tenant, TenantError> {
    let keys = Arc::new(keys);
    let db = TenantDb::open(
        host,
        name,
        &dir.join(DB),
        Encryption::Tenant(Arc::clone(&keys)),
        OpenMode::Existing,
    )?;
    Ok(Tenant {
        info: record.info(tree_bytes(dir)),
        db,
        lock,
        keys,
    })
}

/// Records a block volume's new device size. The caller holds the tenant open (`tenant`), so
/// no other process serves it meanwhile; the record is replaced atomically (`tenant`'s info
/// keeps the size it was opened with).
pub fn set_device_size(data: &DataDir, tenant: &Tenant, size: u64) -> Result<(), TenantError> {
    rewrite_record(data.root(), &tenant.info.name, |r| {
        r.device_size = Some(size)
    })
}

/// Records `tenant`'s new quota; the caller holds the tenant open (`tenant`, whose info keeps
/// the quota it was opened with) and applies it to what it serves.
pub fn set_quota_of_open(data: &DataDir, tenant: &Tenant, quota: Quota) -> Result<(), TenantError> {
    rewrite_record(data.root(), &tenant.info.name, |r| r.quota = quota)
}

/// Records the new quota of tenant `name`, which no process may have open (one that serves it
/// changes it through [`set_quota_of_open`]); it holds from the next mount on.
pub fn set_quota(root: &Path, name: &str, quota: Quota) -> Result<TenantInfo, TenantError> {
    tenant_dir(root, name)?;
    let _lock = lock(root, name)?;
    rewrite_record(root, name, |r| r.quota = quota)?;
    info(root, name)
}

/// Record changes in this process, one at a time: each reads the record, changes it and
/// writes it back (through a temporary file named for the process), and a rotation changes
/// the record and then the open ring, which two rotations must not interleave.
static RECORD_CHANGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn record_changes() -> std::sync::MutexGuard<'static, ()> {
    RECORD_CHANGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replaces tenant `name`'s record, changed by `change`, atomically.
fn rewrite_record(
    root: &Path,
    name: &str,
    change: impl FnOnce(&mut TenantRecord),
) -> Result<(), TenantError> {
    let _one = record_changes();
    rewrite_record_held(root, name, change)
}

/// [`rewrite_record`] for a caller that holds [`record_changes`].
fn rewrite_record_held(
    root: &Path,
    name: &str,
    change: impl FnOnce(&mut TenantRecord),
) -> Result<(), TenantError> {
    let dir = tenant_dir(root, name)?;
    let _keys = crate::data_dir::hold_records(root)?;
    let mut record = read_record(&dir, name)?;
    change(&mut record);
    record.settle_version();
    let json = serde_json::to_vec_pretty(&record).expect("record serialises");
    let path = dir.join(RECORD);
    write_atomic(&path, &json, 0o600).map_err(io_err(&path))
}

/// How long [`open_when_free`] waits for an exiting process to release a tenant (a server
/// killed a moment ago releases its files as its threads finish).
pub const EXITING_HOLDER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens a tenant as [`open`] does; while its lock is held only by processes that are going
/// away (exited, or killed and still releasing their files), waits up to
/// [`EXITING_HOLDER_PATIENCE`] for them, with one log line. A live holder is refused at once,
/// by pid and command.
pub fn open_when_free(data: &DataDir, host: &StoreHost, name: &str) -> Result<Tenant, TenantError> {
    let patience = EXITING_HOLDER_PATIENCE;
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        let err = match open(data, host, name) {
            Ok(t) => return Ok(t),
            Err(TenantError::InUse(_)) => {
                match tenant_lock::holder(data.root(), name) {
                    // Released in between (or the holder out of sight): try again shortly.
                    None => TenantError::InUse(name.to_owned()),
                    Some(pid) if !process::going_away(pid) => {
                        return Err(TenantError::InUseBy {
                            name: name.to_owned(),
                            pid,
                            command: process::command(pid),
                        })
                    }
                    Some(pid) => TenantError::StillExiting {
                        name: name.to_owned(),
                        pid,
                        secs: patience.as_secs(),
                    },
                }
            }
            Err(e) => return Err(e),
        };
        if start.elapsed() >= patience {
            return Err(err);
        }
        if let (false, TenantError::StillExiting { pid, .. }) = (said, &err) {
            tracing::info!(
                tenant = name,
                pid,
                "waiting for an exiting process to release the tenant's lock"
            );
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until no process holds the tenant open; `Ok(false)` if `timeout` passed first.
pub fn wait_until_closed(
    root: &Path,
    name: &str,
    timeout: std::time::Duration,
) -> Result<bool, TenantError> {
    tenant_dir(root, name)?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match lock(root, name) {
            Ok(_) => return Ok(true),
            Err(TenantError::InUse(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(TenantError::InUse(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// Removes the directories that creates and deletes of tenants killed on their way left
/// aside under `tenants/` (of processes that are gone); returns how many. The daemon does
/// this as it starts; a delete does it for its own name.
pub fn remove_leftovers(data: &DataDir) -> Result<usize, TenantError> {
    let root = data.tenants_dir();
    crate::fs_util::remove_leftovers(&root, None, false).map_err(io_err(&root))
}

/// Deletes a tenant and all its data. Refuses while the tenant is open anywhere.
pub fn delete(data: &DataDir, name: &str) -> Result<(), TenantError> {
    validate_name(name)?;
    let root = data.tenants_dir();
    // A delete of this name killed after its rename (or a create killed before its own) left
    // a directory aside: this one finishes it.
    let finished =
        crate::fs_util::remove_leftovers(&root, Some(name), false).map_err(io_err(&root))?;
    let dir = match tenant_dir(data.root(), name) {
        Err(TenantError::Unknown { .. }) if finished > 0 => return Ok(()),
        dir => dir?,
    };
    let lock = lock(data.root(), name)?;
    let doomed = root.join(format!(".deleting-{name}-{}", std::process::id()));
    {
        let _keys = crate::data_dir::hold_records(data.root())?;
        fs::rename(&dir, &doomed).map_err(io_err(&dir))?;
        sync_dir(&root).map_err(io_err(&root))?;
    }
    fail::fail_point!("delete-renamed");
    drop(lock);
    fs::remove_dir_all(&doomed).map_err(io_err(&doomed))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "tenant-1", "A.b_c", &"x".repeat(64)] {
            validate_name(ok).unwrap();
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "..",
            "a b",
            &"x".repeat(65),
            "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_record_of_format_1_reads_as_a_ring_of_its_key_and_is_written_as_format_2() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("tenants").join("old");
        fs::create_dir_all(&dir).unwrap();
        let v1 = r#"{"format_version":1,"name":"old","block_size":4096,"created_unix":1,"wrapped_key":"abcd"}"#;
        fs::write(dir.join(RECORD), v1).unwrap();
        let r = read_record(&dir, "old").unwrap();
        assert_eq!(r.format_version, 2);
        assert_eq!(r.keys.len(), 1);
        assert_eq!(r.keys[0].id, KeyId::FIRST.to_hex());
        assert_eq!(r.keys[0].wrapped, "abcd");
        assert_eq!(r.writing_key, Some(KeyId::FIRST.to_hex()));
        rewrite_record(d.path(), "old", |r| r.block_size = 8192).unwrap();
        let text = fs::read_to_string(dir.join(RECORD)).unwrap();
        assert!(
            text.contains("\"format_version\": 2")
                && text.contains("\"keys\"")
                && !text.contains("wrapped_key"),
            "{text}"
        );
        let id = KeyId::generate().unwrap().to_hex();
        for bad in [
            v1.replace("\"format_version\":1", "\"format_version\":4"),
            v1.replace(
                "}",
                &format!(",\"keys\":[{{\"id\":\"{id}\",\"wrapped\":\"ab\"}}]}}"),
            ),
            format!(
                r#"{{"format_version":2,"name":"old","block_size":4096,"created_unix":1,"keys":[{{"id":"{id}","wrapped":"ab"}}],"writing_key":"0000000000000001"}}"#
            ),
            // A key marked as the base's needs format 3.
            format!(
                r#"{{"format_version":2,"name":"old","block_size":4096,"created_unix":1,"keys":[{{"id":"{id}","wrapped":"ab","base":true}}],"writing_key":"{id}"}}"#
            ),
        ] {
            fs::write(dir.join(RECORD), &bad).unwrap();
            let e = read_record(&dir, "old").err().map(|e| e.to_string());
            assert!(
                e.as_ref().is_some_and(|e| e.contains("is damaged")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn block_sizes() {
        assert_eq!(validate_block_size(4096).unwrap(), 4096);
        assert_eq!(validate_block_size(65536).unwrap(), 65536);
        for bad in [0, 512, 4095, 6000, 2 << 20] {
            assert!(validate_block_size(bad).is_err());
        }
    }
}
