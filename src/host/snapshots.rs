//! Snapshots of the tenants a serving host has open: taken through the process that serves
//! the tenant, since only it may open the tenant's store (`snapshots` does the work).

use std::sync::Arc;

use super::ServingHost;
use crate::control::replies::SnapshotReply;
use crate::control::{Refusal, RefusalCode};
use crate::snapshots::{self, SnapshotError};
use crate::tenants::Tenant;

impl ServingHost {
    /// Takes snapshot `name` of `tenant`, mounted or attached here (see
    /// `Request::SnapshotCreate`): writes acknowledged before it are in it.
    pub fn snapshot(&self, tenant: &str, name: &str) -> Result<SnapshotReply, Refusal> {
        let root = self.data.root();
        let taken = |open: &Tenant| snapshots::create(root, open, name);
        let failed = |e: &dyn std::fmt::Display| {
            Refusal::new(
                RefusalCode::SnapshotFailed,
                format!("no snapshot {name} of tenant {tenant} was taken: {e}"),
            )
        };
        let device = super::lock(&self.exports)
            .get(tenant)
            .map(|a| Arc::clone(a.device()));
        let result = if let Some(device) = device {
            taken(device.volume().tenant())
        } else {
            // A tenant's lock lets one session of this process serve it.
            let Some(served) = self
                .all_sessions()
                .into_iter()
                .filter(|s| s.tenant() == tenant)
                .find_map(|s| s.volume())
            else {
                return Err(Refusal::new(
                    RefusalCode::NotServed,
                    format!("tenant {tenant} is not mounted or attached by this process"),
                ));
            };
            // A dormant mount's store opens for it.
            served
                .woken(|volume| taken(volume.tenant()))
                .map_err(|e| failed(&e))?
        };
        let taken = result.map_err(|e: SnapshotError| failed(&e))?;
        tracing::info!(
            tenant,
            snapshot = name,
            took_us = taken.took.as_micros() as u64,
            "snapshot taken"
        );
        Ok(SnapshotReply {
            snapshot: taken.info,
            took_us: taken.took.as_micros() as u64,
        })
    }
}
