//! Master key rotation: every key the data dir keeps sealed under the master key (each
//! tenant's ring, the record of a restore on its way, each base template's key, the host's
//! base pack and index keys) and the check record move to a new master key, in steps after
//! which the data dir opens either under the old key or under the new one, never under
//! neither, and that a rerun finishes.
//!
//! The data dir's keys are held alone throughout (`DataDir::hold_keys_alone`): no create,
//! fork, key rotation, template build or record change runs meanwhile, in any process. Then:
//!
//! 1. `master.rotation` records the rotation (the new key's check record and where its file
//!    is); a data dir that keeps its key (`master.key`) gets the new one as `master.key.next`.
//! 2. Add: every key gets a second seal, under the new key. All still opens under the old.
//! 3. Commit: `master.check` is replaced by the new key's, in one rename. From here the data
//!    dir opens under the new key only (each key from its second seal). A process that opens
//!    it with the old `master.key` finds `master.key.next` committed and installs it.
//! 4. `master.key.next` replaces `master.key`; this process wraps under the new key.
//! 5. Settle: each key keeps only its seal under the new key; the old key opens nothing.
//! 6. `master.rotation` goes.
//!
//! A rerun before the commit repeats it all (and may name another new key: the rotation then
//! goes there); after it, it repeats steps 4-6, with the committed key only.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::crypto::{KeyError, MasterKey};
use crate::data_dir::{self, DataDir, DataDirError, NEXT_KEY_FILE, ROTATION_FILE};
use crate::fs_util::{sync_dir, write_atomic};
use crate::tenants::{Reseal, TenantError};

const FORMAT_VERSION: u32 = 1;
const CHECK_FILE: &str = "master.check";

#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error(
        "the key in {0} is the data dir's master key already; nothing was changed (make a new \
         key file, or name one that does not exist yet and it is made)"
    )]
    Same(PathBuf),
    #[error(
        "a rotation to the key in {committed} was committed and has not finished: run the \
         command again with that key file (`--new-key {committed}`) to finish it, then rotate \
         to {asked}"
    )]
    OtherCommitted { committed: PathBuf, asked: PathBuf },
    #[error(
        "process(es) serving mounts of this data dir in the foreground ({}) hold the master key \
         in memory; unmount those mounts (or serve them from the daemon) and run the command \
         again (nothing was changed)",
        .0.join(", ")
    )]
    ForegroundServers(Vec<String>),
    #[error("the master key rotation record {path} is damaged: {detail}; delete it and run the command again if the data dir still opens under the old key")]
    BadRecord { path: PathBuf, detail: String },
    /// Failed after the commit: the data dir is under the new key already.
    #[error(
        "the data dir moved to the master key in {new_key}, but the rotation did not finish \
         ({detail}); run `tenantfs key rotate-master --new-key {new_key}` again to finish it"
    )]
    Unfinished { new_key: PathBuf, detail: String },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error(transparent)]
    Base(#[from] crate::base::BaseError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RotationError + '_ {
    move |source| RotationError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a rotation did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RotationReport {
    /// Tenants whose keys moved (shredded ones have none).
    pub tenants: usize,
    /// Base templates whose keys moved.
    pub templates: usize,
    /// Where the new key now is in the data dir (`master.key`), when the data dir keeps its
    /// key; `None`: the operator keeps it where `--master-key` or the credential points.
    pub installed: Option<PathBuf>,
    /// Whether this run finished a rotation an earlier one committed.
    pub finished_earlier: bool,
    pub took: Duration,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotationRecord {
    format_version: u32,
    /// The new key's check record (hex): which key the rotation goes to.
    new_check: String,
    /// Where the operator's new key file is (for messages).
    new_key: PathBuf,
}

/// The new master key in `path`, made there (a random key, mode 0600) when no file is.
pub fn new_key_file(path: &Path) -> Result<(MasterKey, bool), KeyError> {
    match path.exists() {
        true => Ok((MasterKey::load(path)?, false)),
        false => Ok((MasterKey::create_file(path)?, true)),
    }
}

/// Moves data dir `data` to the master key `next` (from the file `next_path`); this process
/// wraps and unwraps under it afterwards. Refused while a foreground mount's process serves
/// the data dir: it would keep wrapping under the old key.
pub fn rotate_master(
    data: &DataDir,
    next: MasterKey,
    next_path: &Path,
) -> Result<RotationReport, RotationError> {
    let started = Instant::now();
    let root = data.root().to_owned();
    let _alone = data.hold_keys_alone()?;
    let foreground = foreground_servers(&root)?;
    if !foreground.is_empty() {
        return Err(RotationError::ForegroundServers(foreground));
    }
    let check_path = root.join(CHECK_FILE);
    let check = std::fs::read(&check_path).map_err(io_err(&check_path))?;
    let record = read_record(&root)?;
    let committed = next.matches_check_record(&check);
    let finished_earlier = committed && record.is_some();
    if committed && record.is_none() {
        return Err(RotationError::Same(next_path.to_owned()));
    }
    if !committed {
        if !data.master_key().matches_check_record(&check) {
            // This process's key is not the data dir's: another process committed a rotation.
            return Err(DataDirError::StaleKey(root.clone()).into());
        }
        if let Some(r) = &record {
            let committed_to = hex::decode(&r.new_check).unwrap_or_default();
            if data.master_key().matches_check_record(&committed_to) {
                // The data dir's key is that rotation's: it committed and did not finish.
                return Err(RotationError::OtherCommitted {
                    committed: r.new_key.clone(),
                    asked: next_path.to_owned(),
                });
            }
            if !next.matches_check_record(&committed_to) {
                tracing::warn!(
                    earlier = %r.new_key.display(),
                    "a master key rotation to another key that did not commit is abandoned"
                );
            }
        }
        let new_check = start(&root, &next, next_path)?;
        fail::fail_point!("rotation-recorded");
        reseal_all(data, Reseal::Add(&next))?;
        fail::fail_point!("rotation-added");
        // The very bytes the rotation's record names: whoever opens the data dir with the
        // old key can tell this rotation committed.
        write_atomic(&check_path, &new_check, 0o600).map_err(io_err(&check_path))?;
        tracing::info!(data_dir = %root.display(), "master key rotation committed");
        fail::fail_point!("rotation-committed");
    } else if let Some(r) = &record {
        if !next.matches_check_record(&hex::decode(&r.new_check).unwrap_or_default()) {
            return Err(RotationError::OtherCommitted {
                committed: r.new_key.clone(),
                asked: next_path.to_owned(),
            });
        }
    }
    data.set_master_key(next);
    let unfinished = |e: RotationError| RotationError::Unfinished {
        new_key: next_path.to_owned(),
        detail: e.to_string(),
    };
    let installed = install(&root).map_err(unfinished)?;
    fail::fail_point!("rotation-installed");
    let (tenants, templates) = reseal_all(data, Reseal::Settle).map_err(unfinished)?;
    fail::fail_point!("rotation-settled");
    let rotation = root.join(ROTATION_FILE);
    std::fs::remove_file(&rotation)
        .and_then(|()| sync_dir(&root))
        .map_err(|e| unfinished(io_err(&rotation)(e)))?;
    tracing::info!(
        data_dir = %root.display(),
        tenants,
        templates,
        "master key rotation finished"
    );
    Ok(RotationReport {
        tenants,
        templates,
        installed,
        finished_earlier,
        took: started.elapsed(),
    })
}

/// The control sockets of foreground mounts' processes that answer.
fn foreground_servers(root: &Path) -> Result<Vec<String>, RotationError> {
    match crate::control::serving_sockets(root) {
        Ok(sockets) => Ok(sockets.iter().map(|s| s.display().to_string()).collect()),
        Err(crate::control::ControlError::NoServer(_)) => Ok(Vec::new()),
        Err(e) => Err(RotationError::ForegroundServers(vec![e.to_string()])),
    }
}

fn read_record(root: &Path) -> Result<Option<RotationRecord>, RotationError> {
    let path = root.join(ROTATION_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path)(e)),
    };
    let bad = |detail: String| RotationError::BadRecord {
        path: path.clone(),
        detail,
    };
    let record: RotationRecord = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if record.format_version != FORMAT_VERSION {
        return Err(bad(format!(
            "format version {}; this tenantfs reads version {FORMAT_VERSION}",
            record.format_version
        )));
    }
    Ok(Some(record))
}

/// Step 1: the rotation's record, and the new key beside the data dir's own. Returns the
/// new key's check record, which the commit puts in place.
fn start(root: &Path, next: &MasterKey, next_path: &Path) -> Result<Vec<u8>, RotationError> {
    let new_check = next.check_record()?;
    let record = RotationRecord {
        format_version: FORMAT_VERSION,
        new_check: hex::encode(&new_check),
        new_key: std::path::absolute(next_path).unwrap_or_else(|_| next_path.to_owned()),
    };
    let json = serde_json::to_vec_pretty(&record).expect("a rotation record serialises");
    let path = root.join(ROTATION_FILE);
    write_atomic(&path, &json, 0o600).map_err(io_err(&path))?;
    if data_dir::key_file(root).exists() {
        let path = root.join(NEXT_KEY_FILE);
        next.write_file(&path).map_err(io_err(&path))?;
    }
    Ok(new_check)
}

/// Step 4: the committed key in place of `master.key`, where the data dir keeps its key.
fn install(root: &Path) -> Result<Option<PathBuf>, RotationError> {
    let (next, key) = (root.join(NEXT_KEY_FILE), data_dir::key_file(root));
    match std::fs::rename(&next, &key) {
        // Not kept here, or installed already (by a process that opened the data dir).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        r => r.map_err(io_err(&next))?,
    }
    sync_dir(root).map_err(io_err(root))?;
    Ok(key.exists().then_some(key))
}

/// Step 2 or 5 on every record: each tenant's, then the base side's. Returns how many
/// tenants and templates it changed.
fn reseal_all(data: &DataDir, step: Reseal) -> Result<(usize, usize), RotationError> {
    let dir = data.tenants_dir();
    // What killed creates left holds keys under the old key: it goes first.
    crate::fs_util::remove_leftovers(&dir, None, false).map_err(io_err(&dir))?;
    let mut tenants = 0;
    for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
        let entry = entry.map_err(io_err(&dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::tenants::validate_name(&name).is_err() {
            continue;
        }
        if crate::tenants::reseal(data, &name, step)? > 0 {
            tenants += 1;
        }
        fail::fail_point!("rotation-tenant-resealed");
    }
    let templates = crate::base::reseal(data, step)? - 1;
    Ok((tenants, templates))
}

#[cfg(test)]
mod tests;
