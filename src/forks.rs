//! Forks: a new tenant that starts as another tenant's store at one instant, or as one of
//! its snapshots, and then goes its own way. The fork shares the source's immutable files
//! (a checkpoint, or a copy of the snapshot's, links them), reads them under the source's
//! keys, and seals everything it writes under a key of its own; the source moves to a new
//! key at the fork, so neither can read what the other writes afterwards
//! (`tenants::create_fork` holds the steps and their order).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::data_dir::DataDir;
use crate::snapshots::{self, SnapshotError};
use crate::store::TenantDb;
use crate::tenants::{self, Tenant, TenantError, TenantInfo};

/// A fork just made, and how long it took.
#[derive(Clone, Debug)]
pub struct Forked {
    pub info: TenantInfo,
    pub took: Duration,
}

/// Forks `source` (open in this process, mounted or not) into new tenant `new`: its store
/// as it is now, or as its snapshot `snapshot` holds it.
pub fn fork(
    data: &DataDir,
    source: &Tenant,
    new: &str,
    snapshot: Option<&str>,
) -> Result<Forked, SnapshotError> {
    let started = Instant::now();
    let name = &source.info().name;
    let info = match snapshot {
        None => tenants::create_fork(data, source, new, source.info().device_size, |db| {
            source.db().checkpoint(db).map_err(TenantError::from)
        })?,
        Some(snapshot) => {
            let (from, device_size) = snapshots::store_of(data.root(), name, snapshot)?;
            tenants::create_fork(data, source, new, device_size, |db: &Path| {
                TenantDb::copy_checkpoint(new, &from, db).map_err(TenantError::from)
            })?
        }
    };
    Ok(Forked {
        info,
        took: started.elapsed(),
    })
}

#[cfg(test)]
mod key_and_delete_kills;
#[cfg(test)]
mod tests;
