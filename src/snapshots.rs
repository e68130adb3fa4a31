//! A tenant's snapshots: read-only points of its store, each in a directory of its own under
//! the tenant's, sharing the store's immutable files (`store::checkpoint`).
//!
//! ```text
//! tenants/<tenant>/snapshots/<name>/snapshot.json   format version, names, time, what the
//!                                                    tenant's record said then
//! tenants/<tenant>/snapshots/<name>/db/             a checkpoint of the tenant's store
//! ```
//!
//! Why here: a snapshot is the tenant's (its files are under the tenant's key, it goes with
//! the tenant when the tenant is deleted), and listing one tenant's snapshots reads that
//! tenant's directory only.
//!
//! A snapshot is taken of an open store ([`create`]: the mounted tenant's, through the
//! process that serves it, or one opened for it), at one instant: what was written before it
//! is in it, crash-consistent (a mounted tenant's snapshot opens as the store would after a
//! crash at that instant: its usage is counted again). A snapshot is never opened as a store:
//! a restore ([`restore`]) opens a copy of it, so a snapshot never changes after it is made.
//! It appears whole (built in `.creating-<name>-<pid>`, renamed into place) and is deleted by
//! renaming it away first, so a crash leaves a snapshot whole or absent, and a leftover
//! directory whose name no snapshot can have.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::fs_util::{sync_dir, tree_usage, write_atomic};
use crate::tenants::{self, Tenant, TenantError};

const SNAPSHOTS: &str = "snapshots";
const RECORD: &str = "snapshot.json";
const DB: &str = "db";
/// The snapshot record's layout; a record of another version is refused, never misread.
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "invalid snapshot name {0:?}: use 1-64 characters from a-z, A-Z, 0-9, '.', '_', '-', \
         starting with a letter or digit"
    )]
    BadName(String),
    #[error(
        "tenant {tenant} has a snapshot {name} already; pick another name or delete it first \
         (`tenantfs snapshot delete {tenant} {name}`)"
    )]
    Exists { tenant: String, name: String },
    #[error(
        "tenant {tenant} has no snapshot {name}; `tenantfs snapshot list {tenant}` shows its \
         snapshots"
    )]
    Unknown { tenant: String, name: String },
    #[error(
        "snapshot {name} of tenant {tenant}: record {path} is damaged or of another version \
         ({detail}); nothing was changed (`tenantfs snapshot delete {tenant} {name}` removes \
         it)"
    )]
    BadRecord {
        tenant: String,
        name: String,
        path: PathBuf,
        detail: String,
    },
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a snapshot is, from its record and its directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub tenant: String,
    pub name: String,
    pub created_unix: u64,
    /// Disk its files take, each once (most are shared with its tenant's store).
    pub disk_bytes: u64,
    /// Disk only it holds: what deleting it gives back (files that its tenant's store, and
    /// every other snapshot, no longer name).
    pub own_bytes: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotRecord {
    format_version: u32,
    tenant: String,
    name: String,
    created_unix: u64,
    /// The tenant's block size (it never changes).
    block_size: u32,
    /// A block volume's device size then (a restore puts it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device_size: Option<u64>,
}

impl SnapshotRecord {
    fn info(self, dir: &Path) -> SnapshotInfo {
        let usage = tree_usage(dir);
        SnapshotInfo {
            tenant: self.tenant,
            name: self.name,
            created_unix: self.created_unix,
            disk_bytes: usage.total,
            own_bytes: usage.own,
        }
    }
}

/// A snapshot just taken, and how long its checkpoint took.
#[derive(Clone, Debug)]
pub struct Taken {
    pub info: SnapshotInfo,
    pub took: std::time::Duration,
}

fn validate_name(name: &str) -> Result<(), SnapshotError> {
    tenants::validate_name(name).map_err(|_| SnapshotError::BadName(name.to_owned()))
}

/// Where tenant `tenant`'s snapshots live.
fn snapshots_dir(root: &Path, tenant: &str) -> Result<PathBuf, SnapshotError> {
    Ok(tenants::dir_of(root, tenant)?.join(SNAPSHOTS))
}

/// The directory of snapshot `name` of `tenant`, which must exist.
fn snapshot_dir(root: &Path, tenant: &str, name: &str) -> Result<PathBuf, SnapshotError> {
    validate_name(name)?;
    let dir = snapshots_dir(root, tenant)?.join(name);
    if dir.join(RECORD).exists() {
        Ok(dir)
    } else {
        Err(SnapshotError::Unknown {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
        })
    }
}

fn read_record(dir: &Path, tenant: &str, name: &str) -> Result<SnapshotRecord, SnapshotError> {
    let path = dir.join(RECORD);
    let bad = |detail: String| SnapshotError::BadRecord {
        tenant: tenant.to_owned(),
        name: name.to_owned(),
        path: path.clone(),
        detail,
    };
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    let record: SnapshotRecord = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if record.format_version != FORMAT_VERSION {
        return Err(bad(format!(
            "format version {}; this tenantfs reads version {FORMAT_VERSION}",
            record.format_version
        )));
    }
    if record.tenant != tenant || record.name != name {
        return Err(bad(format!(
            "it names snapshot {:?} of tenant {:?}",
            record.name, record.tenant
        )));
    }
    Ok(record)
}

/// Takes snapshot `name` of `tenant` (open in this process, mounted or not): its store as it
/// is now, in a directory of its own that shares the store's immutable files.
pub fn create(root: &Path, tenant: &Tenant, name: &str) -> Result<Taken, SnapshotError> {
    validate_name(name)?;
    let info = tenant.info();
    let dir = snapshots_dir(root, &info.name)?;
    let target = dir.join(name);
    let exists = || SnapshotError::Exists {
        tenant: info.name.clone(),
        name: name.to_owned(),
    };
    if target.exists() {
        return Err(exists());
    }
    // One create at a time in this process: what is named for this process's pid and not
    // in place is then a leftover (of an earlier process with the same pid, or a panic).
    static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    crate::fs_util::remove_leftovers(&dir, Some(name), true).map_err(io_err(&dir))?;
    let staging = dir.join(format!(".creating-{name}-{}", std::process::id()));
    let started = Instant::now();
    fs::create_dir(&staging).map_err(io_err(&staging))?;
    let result = (|| {
        tenant.db().checkpoint(&staging.join(DB))?;
        let took = started.elapsed();
        let record = SnapshotRecord {
            format_version: FORMAT_VERSION,
            tenant: info.name.clone(),
            name: name.to_owned(),
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            block_size: info.block_size,
            device_size: info.device_size,
        };
        let json = serde_json::to_vec_pretty(&record).expect("record serialises");
        let path = staging.join(RECORD);
        write_atomic(&path, &json, 0o600).map_err(io_err(&path))?;
        fail::fail_point!("snapshot-staged");
        // rename(2) will not replace a non-empty directory: a racing create loses cleanly.
        fs::rename(&staging, &target).map_err(|e| {
            if target.exists() {
                exists()
            } else {
                io_err(&target)(e)
            }
        })?;
        sync_dir(&dir).map_err(io_err(&dir))?;
        Ok(Taken {
            info: record.info(&target),
            took,
        })
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

/// Takes snapshot `name` of tenant `tenant`, which no process serves: opens its store for
/// it (see [`create`]).
pub fn create_closed(
    data: &crate::data_dir::DataDir,
    host: &crate::store::StoreHost,
    tenant: &str,
    name: &str,
) -> Result<Taken, SnapshotError> {
    validate_name(name)?;
    let open = tenants::open_when_free(data, host, tenant)?;
    create(data.root(), &open, name)
}

/// Snapshot `name` of `tenant`.
pub fn info(root: &Path, tenant: &str, name: &str) -> Result<SnapshotInfo, SnapshotError> {
    let dir = snapshot_dir(root, tenant, name)?;
    Ok(read_record(&dir, tenant, name)?.info(&dir))
}

/// The snapshots of `tenant`, or of every tenant, by tenant and time. Needs no key.
pub fn list(root: &Path, tenant: Option<&str>) -> Result<Vec<SnapshotInfo>, SnapshotError> {
    let tenants: Vec<String> = match tenant {
        Some(t) => {
            tenants::dir_of(root, t)?;
            vec![t.to_owned()]
        }
        None => tenants::list(root)?.into_iter().map(|t| t.name).collect(),
    };
    let mut out = Vec::new();
    for tenant in tenants {
        let dir = snapshots_dir(root, &tenant)?;
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(&dir)(e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if validate_name(&name).is_err() || !entry.path().join(RECORD).exists() {
                continue; // being created or deleted
            }
            out.push(read_record(&entry.path(), &tenant, &name)?.info(&entry.path()));
        }
    }
    out.sort_by(|a, b| {
        (&a.tenant, a.created_unix, &a.name).cmp(&(&b.tenant, b.created_unix, &b.name))
    });
    Ok(out)
}

/// Deletes snapshot `name` of `tenant` (mounted or not: the tenant's store does not name
/// the snapshot's files), a damaged one too. The disk its own files took comes back (the
/// bytes returned); files the store or another snapshot shares stay.
pub fn delete(root: &Path, tenant: &str, name: &str) -> Result<u64, SnapshotError> {
    let dir = snapshot_dir(root, tenant, name)?;
    let own = tree_usage(&dir).own;
    let parent = snapshots_dir(root, tenant)?;
    let doomed = parent.join(format!(".deleting-{name}-{}", std::process::id()));
    fs::rename(&dir, &doomed).map_err(io_err(&dir))?;
    sync_dir(&parent).map_err(io_err(&parent))?;
    fs::remove_dir_all(&doomed).map_err(io_err(&doomed))?;
    Ok(own)
}

/// The store directory of snapshot `name` of `tenant` (a checkpoint never opened) and the
/// device size it records (a block volume's), for a copy of it.
pub(crate) fn store_of(
    root: &Path,
    tenant: &str,
    name: &str,
) -> Result<(PathBuf, Option<u64>), SnapshotError> {
    let dir = snapshot_dir(root, tenant, name)?;
    let record = read_record(&dir, tenant, name)?;
    Ok((dir.join(DB), record.device_size))
}

/// Puts tenant `tenant` back to snapshot `name`: its store becomes a copy of the snapshot's
/// (sharing its files; the snapshot stays as it is), and its device size, for a block volume,
/// the snapshot's. Refused while any process has the tenant open (mounted, attached).
pub fn restore(root: &Path, tenant: &str, name: &str) -> Result<SnapshotInfo, SnapshotError> {
    let dir = snapshot_dir(root, tenant, name)?;
    let closed = tenants::lock_closed(root, tenant)?;
    let record = read_record(&dir, tenant, name)?;
    tenants::replace_store(root, tenant, &closed, &dir.join(DB), record.device_size)?;
    Ok(record.info(&dir))
}

#[cfg(test)]
mod tests;
