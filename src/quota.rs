//! A tenant's quota: how many bytes its files may take and how many inodes it may hold.
//!
//! The quota is part of the tenant's record (`tenants`), so it holds from the first mount on
//! and an older tenantfs, which would not enforce it, refuses the record instead of ignoring
//! it. The volume charges against it (`volume::usage`): bytes are what `du` inside the mount
//! counts (each regular file's size rounded up to whole blocks, whatever of it is shared with
//! a base), inodes are every file, directory, link and node, the root included.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

/// A tenant's quota; `None`: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Bytes its regular files may take, counted as `du` counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<NonZeroU64>,
    /// Inodes it may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<NonZeroU64>,
}

impl Quota {
    pub fn is_unlimited(&self) -> bool {
        self.bytes.is_none() && self.inodes.is_none()
    }

    /// This quota with the parts `change` names replaced.
    pub fn changed(self, change: QuotaChange) -> Self {
        Quota {
            bytes: change.bytes.unwrap_or(self.bytes),
            inodes: change.inodes.unwrap_or(self.inodes),
        }
    }
}

/// A change to a quota: `None` leaves a part as it is, `Some(None)` removes its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaChange {
    pub bytes: Option<Option<NonZeroU64>>,
    pub inodes: Option<Option<NonZeroU64>>,
}

impl QuotaChange {
    pub fn is_empty(&self) -> bool {
        self.bytes.is_none() && self.inodes.is_none()
    }
}

/// What a tenant's files take now, as its quota counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub bytes: u64,
    pub inodes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_replaces_only_what_it_names() {
        let gib = NonZeroU64::new(1 << 30);
        let q = Quota {
            bytes: gib,
            inodes: NonZeroU64::new(10),
        };
        let lifted = q.changed(QuotaChange {
            bytes: None,
            inodes: Some(None),
        });
        assert_eq!(lifted.bytes, gib);
        assert_eq!(lifted.inodes, None);
        assert!(!lifted.is_unlimited());
        assert!(q.changed(QuotaChange::default()) == q);
    }

    #[test]
    fn the_record_form_omits_what_is_unlimited() {
        let q = Quota {
            bytes: NonZeroU64::new(4096),
            inodes: None,
        };
        let json = serde_json::to_string(&q).unwrap();
        assert_eq!(json, r#"{"bytes":4096}"#);
        assert_eq!(serde_json::from_str::<Quota>(&json).unwrap(), q);
        assert!(serde_json::from_str::<Quota>(r#"{"bytes":0}"#).is_err());
        assert!(serde_json::from_str::<Quota>(r#"{"files":1}"#).is_err());
    }
}
