//! Requests and responses on the control socket (one JSON object per line).

use serde::{Deserialize, Serialize};

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
    /// Unmount the tenant mounted at `mountpoint` (daemon only).
    Umount { mountpoint: String },
    /// The daemon's mounts and host numbers (daemon only).
    Stats,
    /// The tenants this process serves, each with its mountpoints: `[{"name", "mounts"}]`.
    TenantList,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(result: serde_json::Value) -> Self {
        Self {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(message: impl Into<String>) -> Self {
        Self {
            ok: false,
            result: None,
            error: Some(message.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        let r: Request = serde_json::from_str(r#"{"op":"cache_release","bytes":42}"#).unwrap();
        assert_eq!(r, Request::CacheRelease { bytes: 42 });
        assert_eq!(
            serde_json::to_string(&Request::CacheStats).unwrap(),
            r#"{"op":"cache_stats"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"format_disk"}"#).is_err());
        let e = serde_json::to_string(&Response::err("no")).unwrap();
        assert_eq!(e, r#"{"ok":false,"error":"no"}"#);
    }
}
