//! One reply struct per control request: what the server sends and the CLI reads, field by
//! field. `tenantfs stats --json` and `cache stats --json` print these same structs.

use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cache::HostCacheStats;
use crate::io_limits::IoLimits;
use crate::metrics::MountActivity;
use crate::pressure::GovernorStats;
use crate::quota::{Quota, Usage};
use crate::store::StoreState;

/// `cache_stats` and `cache_budget`: one serving process's host cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheReport {
    /// Which process answers (`tenantfs daemon`, `mount of tenant NAME`).
    pub server: String,
    pub pid: u32,
    #[serde(flatten)]
    pub cache: HostCacheStats,
    pub process_rss_bytes: Option<u64>,
    /// The operator's ceiling (the governor may hold the budget lower).
    pub ceiling_bytes: u64,
    pub governor: Option<GovernorStats>,
}

/// `cache_release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheReleaseReply {
    pub server: String,
    pub pid: u32,
    pub requested_bytes: u64,
    pub released_bytes: u64,
    pub rss_before_bytes: Option<u64>,
    pub rss_after_bytes: Option<u64>,
}

/// `mount`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountReply {
    pub tenant: String,
    pub mountpoint: PathBuf,
    pub pid: u32,
}

/// `umount`: the tenant that was mounted (its store is flushed and closed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UmountReply {
    pub tenant: String,
}

/// Where and how an attached volume is served (in `volume_attach`'s reply and in `stats`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeServed {
    pub volume: String,
    /// `nbd` or `ublk` (replies of servers before ublk are NBD).
    #[serde(default = "nbd")]
    pub kind: String,
    /// `unix:PATH` or `HOST:PORT` (a port asked for as 0 resolved), or /dev/ublkbN.
    pub address: String,
    /// The same as an NBD URI (for `nbdinfo`, `nbdcopy`, `qemu-img`); empty for ublk.
    pub uri: String,
    pub size_bytes: u64,
}

fn nbd() -> String {
    "nbd".into()
}

/// `volume_attach`: where the volume is served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeAttachReply {
    #[serde(flatten)]
    pub served: VolumeServed,
    pub pid: u32,
}

/// `volume_detach`: the connections that were closed (the store is synced and closed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDetachReply {
    pub volume: String,
    pub connections_closed: u64,
}

/// One attached block volume in [`StatsReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeReport {
    #[serde(flatten)]
    pub served: VolumeServed,
    pub connections: u64,
    #[serde(flatten)]
    pub activity: MountActivity,
    /// Its IOPS and bandwidth limits.
    #[serde(flatten)]
    pub limits: LimitsInForce,
    /// The store's state (`None` if it closed meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreState>,
}

/// `set_limits`: the limits now in force on each mount of the tenant, or on the attached
/// block volume (its address as the mountpoint).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsReply {
    pub tenant: String,
    pub mounts: Vec<MountLimits>,
}

/// A snapshot just taken of a served tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotReply {
    pub snapshot: crate::snapshots::SnapshotInfo,
    /// How long taking it held the tenant's store, in microseconds.
    pub took_us: u64,
}

/// A fork just made of a served tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkReply {
    pub tenant: String,
    pub disk_bytes: u64,
    pub took_us: u64,
}

/// A served tenant moved to a new key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyReply {
    pub tenant: String,
    /// The new key's id (hex), which headers of the files it writes from now on name.
    pub key_id: String,
    /// What a rewrite did, if one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<RewriteReply>,
}

/// The data dir moved to a new master key (see `master_rotation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterKeyReply {
    /// Tenants whose keys moved.
    pub tenants: u64,
    /// Base templates whose keys moved.
    pub templates: u64,
    /// Where the data dir keeps the new key, if it keeps its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed: Option<String>,
    /// Whether this finished a rotation an earlier run committed.
    #[serde(default)]
    pub finished_earlier: bool,
    pub took_ms: u64,
}

/// A served tenant's files under older keys written again under its writing key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewriteReply {
    /// Bytes of bulk data moved out of extent files under older keys.
    pub moved_bytes: u64,
    /// Extent files the store let go of.
    pub extent_files: u64,
    /// Files of the store still sealed under an older key (none once the rewrite is done).
    pub left: Vec<String>,
}

/// A tenant's quota and what its files take, after `set_quota`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaReply {
    pub tenant: String,
    pub quota: Quota,
    pub usage: Usage,
}

/// A mount's I/O limits (absent: none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountLimits {
    pub mountpoint: PathBuf,
    #[serde(flatten)]
    pub limits: LimitsInForce,
}

/// The limits and weight in force on a mount, as replies show them (absent: none, or the
/// default weight).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsInForce {
    /// Requests a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_limit: Option<u32>,
    /// Bytes a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_limit: Option<u64>,
    /// Its weight among busy tenants, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl From<IoLimits> for LimitsInForce {
    fn from(l: IoLimits) -> Self {
        LimitsInForce {
            iops_limit: l.iops.map(NonZeroU32::get),
            bandwidth_limit: l.bandwidth.map(NonZeroU64::get),
            weight: l.weight.map(NonZeroU32::get),
        }
    }
}

/// One served mount in [`StatsReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountReport {
    pub tenant: String,
    pub mountpoint: PathBuf,
    #[serde(flatten)]
    pub activity: MountActivity,
    /// Whether the store takes writes (absent once the session has ended, and while dormant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreState>,
    /// The mount is idle and its store closed; the next request opens it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dormant: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_io: Option<bool>,
    /// Its I/O limits and weight.
    #[serde(flatten)]
    pub limits: LimitsInForce,
    /// The tenant's quota (absent: none) and what its files take (absent once the session
    /// has ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A configured mount the daemon has not mounted yet, and when it tries again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingMountReport {
    pub tenant: String,
    pub mountpoint: PathBuf,
    pub error: String,
    pub attempts: u32,
    pub since_unix: u64,
    pub next_attempt_in_ms: u64,
}

/// A configured `[[volume]]` the daemon could not attach yet (retried like a mount).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingVolumeReport {
    pub volume: String,
    /// `ublk`, or the NBD address.
    pub via: String,
    pub error: String,
    pub attempts: u32,
    pub next_attempt_in_ms: u64,
}

/// `stats`: the process's mounts and host numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsReply {
    pub pid: u32,
    pub mounts: Vec<MountReport>,
    /// Attached block volumes (absent in a reply from an older server).
    #[serde(default)]
    pub volumes: Vec<VolumeReport>,
    pub waiting_mounts: Vec<WaitingMountReport>,
    #[serde(default)]
    pub waiting_volumes: Vec<WaitingVolumeReport>,
    pub cache: CacheReport,
    pub log_lines_dropped: u64,
}

/// One tenant a process serves, with its mountpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedTenant {
    pub name: String,
    pub mounts: Vec<PathBuf>,
    /// What its files take, as its quota counts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `tenant_list`: what this process serves (the CLI merges it into the data dir's list).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantListReply {
    pub tenants: Vec<ServedTenant>,
}

#[cfg(test)]
mod tests {
    use super::super::protocol::{Reply, Response};
    use super::*;
    use crate::metrics::OpSummary;

    fn round_trip(reply: Reply) -> serde_json::Value {
        let text = serde_json::to_string(&Response::from(Ok(reply.clone()))).unwrap();
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(back.into_result().unwrap().unwrap(), reply, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["result"].clone()
    }

    fn cache_report() -> CacheReport {
        CacheReport {
            server: "tenantfs daemon".into(),
            pid: 7,
            cache: HostCacheStats {
                budget_bytes: 1 << 30,
                used_bytes: 5,
                ..HostCacheStats::default()
            },
            process_rss_bytes: Some(9),
            ceiling_bytes: 2 << 30,
            governor: Some(GovernorStats {
                last_decision: Some("shrink".into()),
                ..GovernorStats::default()
            }),
        }
    }

    #[test]
    fn every_reply_round_trips() {
        // The cache's own numbers sit beside the report's fields (flattened), as the CLI and
        // scripts reading `cache stats --json` expect.
        let v = round_trip(Reply::Cache(cache_report()));
        assert_eq!(v["reply"], "cache");
        assert_eq!(v["budget_bytes"], 1u64 << 30);
        assert_eq!(v["blocks"]["hits"], 0);
        assert_eq!(v["governor"]["last_decision"], "shrink");
        round_trip(Reply::CacheRelease(CacheReleaseReply {
            server: "x".into(),
            pid: 1,
            requested_bytes: 10,
            released_bytes: 8,
            rss_before_bytes: None,
            rss_after_bytes: Some(3),
        }));
        let v = round_trip(Reply::Mount(MountReply {
            tenant: "a".into(),
            mountpoint: "/m/a".into(),
            pid: 3,
        }));
        assert_eq!(v["mountpoint"], "/m/a");
        round_trip(Reply::Umount(UmountReply { tenant: "a".into() }));
        let mut activity = MountActivity::default();
        activity.ops.insert(
            "read".into(),
            OpSummary {
                calls: 4,
                errors: 1,
                p50_us_le: 16,
                p99_us_le: 64,
            },
        );
        activity.read_bytes = 4096;
        let v = round_trip(Reply::Stats(StatsReply {
            pid: 1,
            mounts: vec![
                MountReport {
                    tenant: "a".into(),
                    mountpoint: "/m/a".into(),
                    activity: activity.clone(),
                    store: Some(StoreState::NoSpace {
                        since_unix: 5,
                        detail: "full".into(),
                        free_bytes: 1,
                        needs_free_bytes: 2,
                    }),
                    dormant: false,
                    direct_io: Some(true),
                    limits: LimitsInForce {
                        iops_limit: Some(1000),
                        bandwidth_limit: None,
                        weight: Some(300),
                    },
                    quota: Some(Quota {
                        bytes: std::num::NonZeroU64::new(1 << 30),
                        inodes: None,
                    }),
                    usage: Some(Usage {
                        bytes: 4096,
                        inodes: 2,
                    }),
                },
                MountReport {
                    tenant: "b".into(),
                    mountpoint: "/m/b".into(),
                    activity: activity.clone(),
                    store: None,
                    dormant: true,
                    direct_io: None,
                    limits: LimitsInForce::default(),
                    quota: None,
                    usage: None,
                },
            ],
            volumes: vec![VolumeReport {
                served: VolumeServed {
                    volume: "v".into(),
                    kind: "nbd".into(),
                    address: "unix:/run/v.sock".into(),
                    uri: "nbd+unix:///?socket=/run/v.sock".into(),
                    size_bytes: 1 << 30,
                },
                connections: 2,
                activity,
                limits: LimitsInForce {
                    iops_limit: Some(200),
                    ..LimitsInForce::default()
                },
                store: Some(StoreState::Writable),
            }],
            waiting_mounts: vec![WaitingMountReport {
                tenant: "c".into(),
                mountpoint: "/m/c".into(),
                error: "no such tenant".into(),
                attempts: 2,
                since_unix: 9,
                next_attempt_in_ms: 1000,
            }],
            waiting_volumes: vec![WaitingVolumeReport {
                volume: "w".into(),
                via: "ublk".into(),
                error: "no ublk driver".into(),
                attempts: 3,
                next_attempt_in_ms: 4000,
            }],
            cache: cache_report(),
            log_lines_dropped: 0,
        }));
        assert_eq!(v["mounts"][0]["ops"]["read"]["p99_us_le"], 64);
        assert_eq!(v["mounts"][0]["store"]["state"], "no_space");
        assert!(v["mounts"][1].get("store").is_none());
        // Limits are fields of the mount itself on the wire, absent when none.
        assert_eq!(v["mounts"][0]["iops_limit"], 1000);
        assert_eq!(v["mounts"][0]["weight"], 300);
        assert!(v["mounts"][0].get("bandwidth_limit").is_none());
        assert!(v["mounts"][1].get("weight").is_none());
        assert_eq!(v["volumes"][0]["ops"]["read"]["calls"], 4);
        assert_eq!(v["volumes"][0]["connections"], 2);
        round_trip(Reply::VolumeAttach(VolumeAttachReply {
            served: VolumeServed {
                volume: "v".into(),
                kind: "ublk".into(),
                address: "/dev/ublkb0".into(),
                uri: String::new(),
                size_bytes: 512,
            },
            pid: 1,
        }));
        // A server from before ublk sends no kind: its volumes are NBD exports.
        let old = serde_json::json!({"volume": "v", "address": "127.0.0.1:10809",
            "uri": "nbd://127.0.0.1:10809/", "size_bytes": 512, "pid": 1});
        let r: VolumeAttachReply = serde_json::from_value(old).unwrap();
        assert_eq!(r.served.kind, "nbd");
        round_trip(Reply::VolumeDetach(VolumeDetachReply {
            volume: "v".into(),
            connections_closed: 1,
        }));
        round_trip(Reply::TenantList(TenantListReply {
            tenants: vec![ServedTenant {
                name: "a".into(),
                mounts: vec!["/m/a".into(), "/m/a2".into()],
                usage: Some(Usage::default()),
            }],
        }));
    }
}
