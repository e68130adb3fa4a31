//! Requests and responses on the control socket (one JSON object per line).
//!
//! Every request has one typed reply ([`Reply`], its structs in [`super::replies`]); a refusal
//! carries a stable [`RefusalCode`] that callers decide on, and a message for people. The
//! envelope is `{"ok":true,"result":{"reply":"...",...}}` or
//! `{"ok":false,"error":{"code":"...","message":"..."}}`.

use serde::{Deserialize, Serialize};

use super::replies::{
    CacheReleaseReply, CacheReport, ForkReply, KeyReply, LimitsReply, MasterKeyReply, MountReply,
    QuotaReply, SnapshotReply, StatsReply, TenantListReply, UmountReply, VolumeAttachReply,
    VolumeDetachReply,
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The host cache's numbers and the governor's state.
    CacheStats,
    /// Evict about `bytes` from the caches now, giving the memory back to the kernel.
    CacheRelease { bytes: u64 },
    /// Set the operator's budget ceiling (the governor may hold the budget lower).
    CacheBudget { bytes: u64 },
    /// Mount a tenant (daemon only). `options` as for `tenantfs mount -o`.
    Mount {
        tenant: String,
        mountpoint: String,
        #[serde(default)]
        options: String,
    },
    /// Unmount the tenant mounted at `mountpoint`.
    Umount { mountpoint: String },
    /// The process's mounts and host numbers.
    Stats,
    /// The tenants this process serves, each with its mountpoints.
    TenantList,
    /// Serve block volume `volume` (daemon only): over NBD at `nbd` (`unix:PATH` absolute,
    /// or a loopback `HOST:PORT`), with `ublk` as /dev/ublkbN, or with `nbd_device` as
    /// /dev/nbdN; one of the three (see [`AttachVia`]).
    VolumeAttach {
        volume: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nbd: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ublk: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        nbd_device: bool,
    },
    /// Stop serving block volume `volume` (its store is synced and closed).
    VolumeDetach { volume: String },
    /// Change the I/O limits of every mount of `tenant` this process serves, at once: for
    /// each limit, absent keeps it, 0 removes it, another number is the new limit (data
    /// requests a second; bytes a second; the weight among busy tenants, 0 the default).
    SetLimits {
        tenant: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iops: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bandwidth: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u64>,
    },
    /// Change the quota of `tenant`, which this process serves, at once and in its record:
    /// for each part, absent keeps it, 0 removes it, another number is the new quota (bytes
    /// as `du` counts them; inodes).
    SetQuota {
        tenant: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inodes: Option<u64>,
    },
    /// Take snapshot `name` of `tenant`, which this process serves (mounted or attached):
    /// its store at one instant, everything written before the request in it.
    SnapshotCreate { tenant: String, name: String },
    /// Fork `source`, which this process serves, into new tenant `new`: its store now, or as
    /// its snapshot `snapshot` holds it.
    TenantFork {
        source: String,
        new: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot: Option<String>,
    },
    /// Move `tenant`, which this process serves, to a new key for the files it writes; with
    /// `rewrite`, its files under older keys are then written again under it.
    RotateKey {
        tenant: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        rewrite: bool,
    },
    /// Move the data dir to the master key in the file `new_key` (an absolute path the
    /// server reads), this process with it.
    RotateMaster { new_key: String },
}

/// How a block volume is to be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachVia {
    /// An NBD export at this address (`unix:PATH` or a loopback `HOST:PORT`).
    Nbd(String),
    /// A ublk device, /dev/ublkbN.
    Ublk,
    /// A kernel NBD device, /dev/nbdN, set up by the daemon on its own NBD server.
    NbdDevice,
}

impl AttachVia {
    /// The way a `VolumeAttach` request's fields say, if they say exactly one.
    pub fn of(nbd: Option<String>, ublk: bool, nbd_device: bool) -> Option<Self> {
        match (nbd, ublk, nbd_device) {
            (Some(a), false, false) => Some(AttachVia::Nbd(a)),
            (None, true, false) => Some(AttachVia::Ublk),
            (None, false, true) => Some(AttachVia::NbdDevice),
            _ => None,
        }
    }
}

impl std::fmt::Display for AttachVia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachVia::Nbd(a) => write!(f, "nbd {a}"),
            AttachVia::Ublk => f.write_str("ublk"),
            AttachVia::NbdDevice => f.write_str("nbd device"),
        }
    }
}

impl Request {
    /// The request that attaches `volume` as `via` says.
    pub fn volume_attach(volume: &str, via: &AttachVia) -> Self {
        Request::VolumeAttach {
            volume: volume.to_owned(),
            nbd: match via {
                AttachVia::Nbd(a) => Some(a.clone()),
                _ => None,
            },
            ublk: *via == AttachVia::Ublk,
            nbd_device: *via == AttachVia::NbdDevice,
        }
    }
}

/// The answer to one request: `cache_stats` and `cache_budget` both answer [`Reply::Cache`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Cache(CacheReport),
    CacheRelease(CacheReleaseReply),
    Mount(MountReply),
    Umount(UmountReply),
    Stats(StatsReply),
    TenantList(TenantListReply),
    VolumeAttach(VolumeAttachReply),
    VolumeDetach(VolumeDetachReply),
    Limits(LimitsReply),
    Quota(QuotaReply),
    Snapshot(SnapshotReply),
    Fork(ForkReply),
    Key(KeyReply),
    MasterKey(MasterKeyReply),
}

/// Why a request was not carried out. Callers decide on `code`; `message` is for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
}

/// Stable refusal codes (their snake_case names are the wire format; new ones may be added,
/// and a client reads a code it does not know as [`RefusalCode::Unknown`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// The request line is not a request this server knows.
    BadRequest,
    /// The peer is neither root nor the server's user.
    PermissionDenied,
    /// Serving the request panicked; the server goes on.
    Internal,
    /// A mount request to a process that serves one mount (only the daemon takes them).
    DaemonOnly,
    /// The mountpoint is mounted already.
    AlreadyMounted,
    /// Another mount of that mountpoint is under way.
    MountInProgress,
    /// The tenant could not be opened or mounted (the message says why).
    MountFailed,
    /// Nothing is served at that mountpoint by this process.
    NotServed,
    /// The mount is in use (the message says what to do).
    Busy,
    /// The unmount failed for another reason.
    UnmountFailed,
    /// The volume could not be opened or served (the message says why).
    AttachFailed,
    /// The volume is attached already.
    AlreadyAttached,
    /// This process does not serve that volume.
    NotAttached,
    /// A snapshot, fork or key rotation failed (the message says why and what was done).
    SnapshotFailed,
    /// A master key rotation failed (the message says why and what to do).
    RotationFailed,
    /// A code from a newer server.
    #[serde(other)]
    Unknown,
}

impl Refusal {
    pub fn new(code: RefusalCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Reply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Refusal>,
}

impl From<Result<Reply, Refusal>> for Response {
    fn from(r: Result<Reply, Refusal>) -> Self {
        match r {
            Ok(reply) => Self {
                ok: true,
                result: Some(reply),
                error: None,
            },
            Err(refusal) => Self {
                ok: false,
                result: None,
                error: Some(refusal),
            },
        }
    }
}

impl Response {
    /// The reply, or the refusal; a response that has neither is reported as `None`.
    pub fn into_result(self) -> Option<Result<Reply, Refusal>> {
        match (self.ok, self.result, self.error) {
            (true, Some(reply), _) => Some(Ok(reply)),
            (false, _, Some(refusal)) => Some(Err(refusal)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_on_the_wire() {
        let r: Request = serde_json::from_str(r#"{"op":"cache_release","bytes":42}"#).unwrap();
        assert_eq!(r, Request::CacheRelease { bytes: 42 });
        assert_eq!(
            serde_json::to_string(&Request::CacheStats).unwrap(),
            r#"{"op":"cache_stats"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"format_disk"}"#).is_err());
        let m: Request =
            serde_json::from_str(r#"{"op":"mount","tenant":"a","mountpoint":"/m"}"#).unwrap();
        assert_eq!(
            m,
            Request::Mount {
                tenant: "a".into(),
                mountpoint: "/m".into(),
                options: String::new()
            }
        );
    }

    #[test]
    fn refusals_on_the_wire() {
        let e = Response::from(Err(Refusal::new(RefusalCode::NotServed, "no")));
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(
            text,
            r#"{"ok":false,"error":{"code":"not_served","message":"no"}}"#
        );
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(back, e);
        let newer: Response = serde_json::from_str(
            r#"{"ok":false,"error":{"code":"quota_exceeded","message":"later"}}"#,
        )
        .unwrap();
        let refusal = newer.into_result().unwrap().unwrap_err();
        assert_eq!(refusal.code, RefusalCode::Unknown);
        assert_eq!(refusal.to_string(), "later");
        let empty: Response = serde_json::from_str(r#"{"ok":true}"#).unwrap();
        assert!(empty.into_result().is_none());
    }
}
