//! Base templates: a base's tree grafted once into a store of its own, which every tenant
//! created from the base starts as a copy of, as a fork starts from a snapshot.
//!
//! Why: grafting the tree into each new tenant cost O(files) per tenant (20,000 files of 7
//! bytes: 194 ms and 4.29 MB each, most of it one WAL). A copy of the template links its table
//! files and copies only its MANIFEST, CURRENT and IDENTITY: the same few milliseconds and a
//! few KiB whatever the base holds, and the tenants' stores share the template's files on disk
//! and in the host cache (cache keys name files: `store::file_ids`). A tenant's changes,
//! deletions and renames of base entries included, are writes to its own store as any.
//!
//! Layout: `<data-dir>/base/templates/<base>/` holds `template.json` (format version, the
//! base's import time, the template's key sealed under the master key) and `db/`, a store
//! checkpoint never opened as a store (so it never changes). The template's files are sealed
//! under its own random key; each tenant's ring holds a copy of it, marked as its base's.
//! Built at the first tenant of a base (`base import` does not wait for it), in a staging
//! directory renamed into place, under a lock per base (the base store is one process's at a
//! time: `BaseStore::open`; the lock keeps two threads of it from building one template);
//! deleted with the base. A template whose record names another import
//! of the base (a base deleted and imported again under its name) is built again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{BaseError, BaseRecord, BaseStore};
use crate::crypto::{KeyId, Keyring, TenantKey};
use crate::data_dir::DataDir;
use crate::store::{Encryption, OpenMode, StoreHost, TenantDb};
use crate::tenants::Reseal;

/// Version 2 only while a master key rotation gives the key a second seal (version 1 readers
/// refuse it rather than miss that seal).
const FORMAT_VERSION: u32 = 2;
const RECORD: &str = "template.json";
const DB: &str = "db";
/// How long a create waits for another thread of this process building the same template
/// (the base store is one process's at a time).
const BUILD_PATIENCE: Duration = Duration::from_secs(600);

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateRecord {
    format_version: u32,
    base: String,
    /// The base's `created_unix`: which import of the base the template was built from.
    base_created_unix: u64,
    key_id: String,
    /// The template's key sealed under the master key, bound to [`key_name`] (hex).
    wrapped_key: String,
    /// During a master key rotation, the key sealed under the new master key (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped_key_next: Option<String>,
}

/// A base's template, ready to be copied.
pub(super) struct Template {
    pub db: PathBuf,
    pub key_id: KeyId,
    pub key: TenantKey,
}

/// What the template's key is sealed for (the master key binds a sealed key to a name).
fn key_name(base: &str) -> String {
    format!("base template {base}")
}

/// Where the template at `dir` is built before it is renamed into place.
pub(super) fn staging_of(dir: &Path) -> PathBuf {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    dir.with_file_name(format!(".building-{name}"))
}

/// The directory of base `base`'s template in the data dir at `root`.
pub(super) fn dir_of(root: &Path, base: &str) -> PathBuf {
    root.join("base").join("templates").join(base)
}

impl BaseStore {
    /// The template of ready base `record`, built first if it has none (or one of another
    /// import of the base).
    pub(super) fn template(
        &self,
        data: &DataDir,
        host: &StoreHost,
        record: &BaseRecord,
    ) -> Result<Template, BaseError> {
        if let Some(t) = read(data, record)? {
            return Ok(t);
        }
        let building = wait_for_lock(data.root(), &record.name)?;
        // Built by another while this one waited?
        if let Some(t) = read(data, record)? {
            return Ok(t);
        }
        let started = Instant::now();
        // Held until the template is in place: its key is sealed under the master key, which
        // a rotation must not change meanwhile (it reseals templates in place only).
        let _keys = data
            .hold_keys()
            .map_err(crate::tenants::TenantError::from)?;
        let dir = dir_of(data.root(), &record.name);
        let staging = staging_of(&dir);
        remove_if_there(&staging)?;
        remove_if_there(&dir)?;
        std::fs::create_dir_all(&staging).map_err(BaseError::io(&staging))?;
        let built = self.build_into(data, host, record, &staging, building.clone());
        if built.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        built?;
        std::fs::rename(&staging, &dir).map_err(BaseError::io(&dir))?;
        let parent = dir.parent().expect("a templates directory");
        crate::fs_util::sync_dir(parent).map_err(BaseError::io(parent))?;
        tracing::info!(
            base = %record.name,
            took_ms = started.elapsed().as_millis() as u64,
            "base template built"
        );
        read(data, record)?.ok_or_else(|| BaseError::TemplateDamaged {
            base: record.name.clone(),
            path: dir.clone(),
            detail: "it is gone just after it was built".into(),
        })
    }

    /// Grafts `record`'s tree into a store of its own under a new key, takes a checkpoint of
    /// it into `staging/db` (the store itself, with its logs, goes) and writes the record.
    fn build_into(
        &self,
        data: &DataDir,
        host: &StoreHost,
        record: &BaseRecord,
        staging: &Path,
        lock: crate::tenant_lock::TenantLock,
    ) -> Result<(), BaseError> {
        let base = record.name.as_str();
        let name = key_name(base);
        let (key_id, key) = (KeyId::generate()?, TenantKey::generate()?);
        let wrapped = hex::encode(data.master_key().wrap_tenant_key(&name, &key)?);
        let ring = Arc::new(Keyring::single(key_id, key));
        let build = staging.join("build");
        let db = TenantDb::open(
            host,
            &name,
            &build,
            Encryption::Tenant(Arc::clone(&ring)),
            OpenMode::Create,
        )?;
        let info = crate::tenants::TenantInfo {
            name: name.clone(),
            block_size: record.block_size,
            created_unix: super::now_unix(),
            disk_bytes: 0,
            base: Some(base.to_owned()),
            device_size: None,
            quota: Default::default(),
        };
        let tenant = crate::tenants::Tenant::unlisted(info, db, Arc::clone(&ring), lock);
        let volume = crate::volume::Volume::open(tenant)?;
        let (_, nodes) = self.graft_nodes(base)?;
        volume.graft(base, nodes)?;
        // Closed: the volume stores its usage counts as whole, which each copy then reads
        // instead of counting its inode records again.
        drop(volume);
        let db = TenantDb::open(
            host,
            &name,
            &build,
            Encryption::Tenant(ring),
            OpenMode::Existing,
        )?;
        // Flushed and compacted: the checkpoint copies no WAL, and its MANIFEST is short.
        db.flush()?;
        db.compact()?;
        db.checkpoint(&staging.join(DB))?;
        drop(db);
        std::fs::remove_dir_all(&build).map_err(BaseError::io(&build))?;
        let json = serde_json::to_vec_pretty(&TemplateRecord {
            format_version: 1,
            base: base.to_owned(),
            base_created_unix: record.created_unix,
            key_id: key_id.to_hex(),
            wrapped_key: wrapped,
            wrapped_key_next: None,
        })
        .expect("a template record serialises");
        let path = staging.join(RECORD);
        crate::fs_util::write_atomic(&path, &json, 0o600).map_err(BaseError::io(&path))
    }
}

/// Base `record`'s template, if one of this import of it is in place.
fn read(data: &DataDir, record: &BaseRecord) -> Result<Option<Template>, BaseError> {
    let dir = dir_of(data.root(), &record.name);
    let path = dir.join(RECORD);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BaseError::io(&path)(e)),
    };
    let bad = |detail: String| BaseError::TemplateDamaged {
        base: record.name.clone(),
        path: dir.clone(),
        detail: format!("its record {}: {detail}", path.display()),
    };
    let t: TemplateRecord = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if t.format_version > FORMAT_VERSION {
        return Err(BaseError::NewerFormat {
            base: format!("{}'s template", record.name),
            found: t.format_version,
            known: FORMAT_VERSION,
        });
    }
    if t.format_version == 0 || t.base != record.name {
        return Err(bad(format!(
            "format version {} of base {:?}; this tenantfs reads version {FORMAT_VERSION}",
            t.format_version, t.base
        )));
    }
    if t.base_created_unix != record.created_unix {
        return Ok(None); // of an earlier import of a base of that name
    }
    let key_id = KeyId::from_hex(&t.key_id).ok_or_else(|| bad("a bad key id".into()))?;
    let key = open_key(data, &record.name, &t)
        .ok_or_else(|| bad("its key does not open under this master key".into()))?;
    Ok(Some(Template {
        db: dir.join(DB),
        key_id,
        key,
    }))
}

/// Template `t`'s key (of base `base`), from either of its seals.
fn open_key(data: &DataDir, base: &str, t: &TemplateRecord) -> Option<TenantKey> {
    let master = data.master_key();
    let open = |hex_key: &str| {
        let bytes = hex::decode(hex_key).ok()?;
        master.unwrap_tenant_key(&key_name(base), &bytes)
    };
    open(&t.wrapped_key).or_else(|| t.wrapped_key_next.as_deref().and_then(open))
}

/// Takes step `step` of a master key rotation on every template's record (see
/// `tenants::reseal`). The caller holds the data dir's keys alone. Returns how many it wrote.
pub(crate) fn reseal(data: &DataDir, step: Reseal) -> Result<usize, BaseError> {
    let templates = data.root().join("base").join("templates");
    let entries = match std::fs::read_dir(&templates) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(BaseError::io(&templates)(e)),
    };
    let mut written = 0;
    for entry in entries {
        let entry = entry.map_err(BaseError::io(&templates))?;
        let base = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path().join(RECORD);
        if base.starts_with('.') || !path.exists() {
            continue; // a build on its way (holding the keys), or one a kill left
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // deleted meanwhile
            Err(e) => return Err(BaseError::io(&path)(e)),
        };
        let damaged = |detail: String| BaseError::TemplateDamaged {
            base: base.clone(),
            path: entry.path(),
            detail,
        };
        let mut t: TemplateRecord =
            serde_json::from_slice(&bytes).map_err(|e| damaged(e.to_string()))?;
        if t.format_version > FORMAT_VERSION {
            return Err(BaseError::NewerFormat {
                base: format!("{base}'s template"),
                found: t.format_version,
                known: FORMAT_VERSION,
            });
        }
        let key = open_key(data, &base, &t)
            .ok_or_else(|| damaged("its key does not open under this master key".into()))?;
        let master = data.master_key();
        match step {
            Reseal::Add(next) => {
                t.wrapped_key = hex::encode(master.wrap_tenant_key(&key_name(&base), &key)?);
                t.wrapped_key_next =
                    Some(hex::encode(next.wrap_tenant_key(&key_name(&base), &key)?));
                t.format_version = 2;
            }
            Reseal::Settle => {
                t.wrapped_key = hex::encode(master.wrap_tenant_key(&key_name(&base), &key)?);
                t.wrapped_key_next = None;
                t.format_version = 1;
            }
        }
        let json = serde_json::to_vec_pretty(&t).expect("a template record serialises");
        crate::fs_util::write_atomic(&path, &json, 0o600).map_err(BaseError::io(&path))?;
        written += 1;
    }
    Ok(written)
}

/// This process's hold on building base `base`'s template, once no other holds it.
fn wait_for_lock(root: &Path, base: &str) -> Result<crate::tenant_lock::TenantLock, BaseError> {
    let name = key_name(base);
    let started = Instant::now();
    loop {
        match crate::tenant_lock::lock(root, &name) {
            Ok(lock) => return Ok(lock),
            Err(crate::tenant_lock::LockError::Held) if started.elapsed() < BUILD_PATIENCE => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(crate::tenant_lock::LockError::Held) => {
                let by = crate::tenant_lock::holder(root, &name)
                    .map_or_else(|| "another process".into(), |pid| format!("process {pid}"));
                return Err(BaseError::TemplateBusy {
                    base: base.to_owned(),
                    by,
                });
            }
            Err(crate::tenant_lock::LockError::Io { path, source }) => {
                return Err(BaseError::Io {
                    path: path.into(),
                    source,
                })
            }
        }
    }
}

/// Removes directory `dir` and what it holds, if it is there.
pub(super) fn remove_if_there(dir: &Path) -> Result<(), BaseError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BaseError::io(dir)(e)),
        _ => Ok(()),
    }
}
