//! Changes to a served tenant's settings while it is mounted: its I/O limits (per mount or
//! attached block volume, in force until it is unmounted or detached) and its quota (in its record too, so it holds at every later
//! mount).

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use super::ServingHost;
use crate::control::replies::{LimitsReply, MountLimits, QuotaReply};
use crate::control::{LimitsChange, Refusal, RefusalCode};
use crate::fair_share::MAX_WEIGHT;
use crate::io_limits::IoLimits;
use crate::quota::QuotaChange;
use crate::tenants;

impl ServingHost {
    /// Changes the I/O limits of every mount of `tenant` here, or of the block volume `tenant`
    /// attached here (see `Request::SetLimits`).
    pub fn set_limits(&self, tenant: &str, change: LimitsChange) -> Result<LimitsReply, Refusal> {
        let LimitsChange {
            iops,
            bandwidth,
            weight,
        } = change;
        let too_big = |what: &str| {
            Refusal::new(
                RefusalCode::BadRequest,
                format!(
                    "an {what} limit of more than {} is no limit: use 0 for none",
                    u32::MAX
                ),
            )
        };
        let iops = match iops {
            Some(n) => Some(NonZeroU32::new(
                u32::try_from(n).map_err(|_| too_big("IOPS"))?,
            )),
            None => None,
        };
        let weight = match weight {
            Some(w) if w > u64::from(MAX_WEIGHT) => {
                return Err(Refusal::new(
                    RefusalCode::BadRequest,
                    format!("a weight is at most {MAX_WEIGHT}: use 0 for the default"),
                ))
            }
            Some(w) => Some(NonZeroU32::new(w as u32)),
            None => None,
        };
        let sessions: Vec<_> = self
            .all_sessions()
            .into_iter()
            .filter(|s| s.tenant() == tenant)
            .collect();
        let device = super::lock(&self.exports)
            .get(tenant)
            .map(|a| (a.address(), Arc::clone(a.device())));
        if sessions.is_empty() && device.is_none() {
            return Err(Refusal::new(
                RefusalCode::NotServed,
                format!("tenant {tenant} is not mounted or attached by this process; its limits apply while it is served (-o iops=N,bandwidth=SIZE)"),
            ));
        }
        let changed = |mut limits: IoLimits| {
            if let Some(iops) = iops {
                limits.iops = iops;
            }
            if let Some(bytes) = bandwidth {
                limits.bandwidth = NonZeroU64::new(bytes);
            }
            if let Some(weight) = weight {
                limits.weight = weight;
            }
            limits
        };
        let mut mounts = Vec::new();
        if let Some((address, device)) = device {
            let limits = changed(device.limits());
            device.set_limits(limits);
            mounts.push(MountLimits {
                mountpoint: address.into(),
                limits: limits.into(),
            });
        }
        for s in sessions {
            let limits = changed(s.limits());
            if s.set_limits(limits) {
                mounts.push(MountLimits {
                    mountpoint: s.path().to_owned(),
                    limits: limits.into(),
                });
            }
        }
        Ok(LimitsReply {
            tenant: tenant.to_owned(),
            mounts,
        })
    }

    /// Changes the quota of `tenant`, mounted or attached here, in its record and at once (see
    /// `Request::SetQuota`).
    pub fn set_quota(
        &self,
        tenant: &str,
        bytes: Option<u64>,
        inodes: Option<u64>,
    ) -> Result<QuotaReply, Refusal> {
        let change = QuotaChange {
            bytes: bytes.map(NonZeroU64::new),
            inodes: inodes.map(NonZeroU64::new),
        };
        let not_changed = |e: &dyn std::fmt::Display| {
            Refusal::new(
                RefusalCode::Internal,
                format!("tenant {tenant}: the quota was not changed: {e}"),
            )
        };
        // The record and the counts change together.
        let (quota, usage) = self
            .with_served(tenant, |volume| {
                let quota = volume.quota().changed(change);
                tenants::set_quota_of_open(&self.data, volume.tenant(), quota)?;
                volume.set_quota(quota);
                Ok::<_, tenants::TenantError>((quota, volume.usage()))
            })?
            .map_err(|e| not_changed(&e))?;
        tracing::info!(tenant, ?quota, "quota set");
        Ok(QuotaReply {
            tenant: tenant.to_owned(),
            quota,
            usage,
        })
    }
}
