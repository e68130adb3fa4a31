//! Snapshots, forks and key rotations of the tenants a serving host has open: done through
//! the process that serves the tenant, since only it may open the tenant's store
//! (`snapshots`, `forks` and `tenants` do the work).

use std::path::Path;

use super::ServingHost;
use crate::control::replies::{ForkReply, KeyReply, MasterKeyReply, RewriteReply, SnapshotReply};
use crate::control::{Refusal, RefusalCode};

impl ServingHost {
    /// Takes snapshot `name` of `tenant`, mounted or attached here (see
    /// `Request::SnapshotCreate`): writes acknowledged before it are in it.
    pub fn snapshot(&self, tenant: &str, name: &str) -> Result<SnapshotReply, Refusal> {
        let taken = self
            .with_served(tenant, |v| {
                crate::snapshots::create(self.data.root(), v.tenant(), name)
            })?
            .map_err(|e| {
                Refusal::new(
                    RefusalCode::SnapshotFailed,
                    format!("no snapshot {name} of tenant {tenant} was taken: {e}"),
                )
            })?;
        let took_us = taken.took.as_micros() as u64;
        tracing::info!(tenant, snapshot = name, took_us, "snapshot taken");
        Ok(SnapshotReply {
            snapshot: taken.info,
            took_us,
        })
    }

    /// Forks `source`, mounted or attached here, into new tenant `new` (see
    /// `Request::TenantFork`).
    pub fn fork(
        &self,
        source: &str,
        new: &str,
        snapshot: Option<&str>,
    ) -> Result<ForkReply, Refusal> {
        let forked = self
            .with_served(source, |v| {
                crate::forks::fork(&self.data, v.tenant(), new, snapshot)
            })?
            .map_err(|e| {
                Refusal::new(
                    RefusalCode::SnapshotFailed,
                    format!("tenant {source} was not forked into {new}: {e}"),
                )
            })?;
        let took_us = forked.took.as_micros() as u64;
        tracing::info!(tenant = source, fork = new, took_us, "tenant forked");
        Ok(ForkReply {
            tenant: new.to_owned(),
            disk_bytes: forked.info.disk_bytes,
            took_us,
        })
    }

    /// Moves the data dir to the master key in file `new_key` (made there if there is none),
    /// this process with it (see `master_rotation`).
    pub fn rotate_master(&self, new_key: &Path) -> Result<MasterKeyReply, Refusal> {
        let failed = |e: String| {
            Refusal::new(
                RefusalCode::RotationFailed,
                format!("the master key was not rotated: {e}"),
            )
        };
        let (next, _) =
            crate::master_rotation::new_key_file(new_key).map_err(|e| failed(e.to_string()))?;
        let done = crate::master_rotation::rotate_master(&self.data, next, new_key).map_err(
            |e| match e {
                // Committed: the message says so, and what finishes it.
                crate::master_rotation::RotationError::Unfinished { .. } => {
                    Refusal::new(RefusalCode::RotationFailed, e.to_string())
                }
                e => failed(e.to_string()),
            },
        )?;
        Ok(MasterKeyReply {
            tenants: done.tenants as u64,
            templates: done.templates as u64,
            installed: done.installed.map(|p| p.display().to_string()),
            finished_earlier: done.finished_earlier,
            took_ms: done.took.as_millis() as u64,
        })
    }

    /// Moves `tenant`, mounted or attached here, to a new key, and with `rewrite` writes its
    /// files under older keys again (see `Request::RotateKey`).
    pub fn rotate_key(&self, tenant: &str, rewrite: bool) -> Result<KeyReply, Refusal> {
        let failed = |what: &str, e: String| {
            Refusal::new(
                RefusalCode::SnapshotFailed,
                format!("tenant {tenant}: {what} failed: {e}"),
            )
        };
        let (id, rewritten) = self.with_served(tenant, |v| {
            if rewrite {
                v.check_room_for_rewrite()
                    .map_err(|e| failed("the rewrite under a new key", e.to_string()))?;
            }
            let id = crate::tenants::rotate_key(&self.data, v.tenant())
                .map_err(|e| failed("the key rotation", e.to_string()))?;
            tracing::info!(tenant, key = %id, "tenant key rotated");
            let rewritten = match rewrite {
                true => Some(
                    v.rewrite_under_writing_key()
                        .map_err(|e| failed("the rewrite under the new key", e.to_string()))?,
                ),
                false => None,
            };
            Ok::<_, Refusal>((id, rewritten))
        })??;
        let rewrite = rewritten.map(|r| {
            tracing::info!(
                tenant,
                moved_bytes = r.moved_bytes,
                left = r.left.len(),
                "tenant files rewritten under its new key"
            );
            RewriteReply {
                moved_bytes: r.moved_bytes,
                extent_files: r.extent_files,
                left: r.left.iter().map(|p| p.display().to_string()).collect(),
            }
        });
        Ok(KeyReply {
            tenant: tenant.to_owned(),
            key_id: id.to_hex(),
            rewrite,
        })
    }
}
