//! The host's base keys: the pack key, which seals every block in the base packs, and the
//! index key, which seals the base index store's files. Until the master key is first
//! rotated they are derived from it (BLAKE3 `derive_key`: nothing to store); a rotation keeps
//! them in `base/keys.json`, sealed under the master key as tenant keys are, so that a new
//! master key seals the same keys again instead of leaving every pack unreadable. A record
//! of another format version is refused, never misread.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::BaseError;
use crate::crypto::{MasterKey, TenantKey};
use crate::data_dir::DataDir;
use crate::tenants::Reseal;

const FILE: &str = "keys.json";
const FORMAT_VERSION: u32 = 1;

/// Which of the host's base keys.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HostKey {
    Pack,
    Index,
}

impl HostKey {
    /// What the key was derived for before it was kept (and still is, where it is not).
    fn purpose(self) -> &'static str {
        match self {
            HostKey::Pack => "tenantfs 2026-11 base pack key v1",
            HostKey::Index => "tenantfs 2026-11 base index key v1",
        }
    }

    /// The name a sealed copy is bound to (the master key binds a sealed key to a name).
    fn sealed_for(self) -> &'static str {
        match self {
            HostKey::Pack => "host base pack key",
            HostKey::Index => "host base index key",
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysRecord {
    format_version: u32,
    pack: Sealed,
    index: Sealed,
}

/// A key sealed under the master key (hex); during a rotation also under the new one.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    wrapped: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped_next: Option<String>,
}

fn path(data: &DataDir) -> PathBuf {
    data.root().join("base").join(FILE)
}

fn damaged(path: &Path, detail: String) -> BaseError {
    BaseError::HostKeys {
        path: path.to_owned(),
        detail,
    }
}

fn read(path: &Path) -> Result<Option<KeysRecord>, BaseError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BaseError::io(path)(e)),
    };
    let record: KeysRecord =
        serde_json::from_slice(&bytes).map_err(|e| damaged(path, e.to_string()))?;
    if record.format_version != FORMAT_VERSION {
        return Err(damaged(
            path,
            format!(
                "format version {}; this tenantfs reads version {FORMAT_VERSION}",
                record.format_version
            ),
        ));
    }
    Ok(Some(record))
}

/// `sealed`'s key under `master`, from either of its seals.
fn open_sealed(master: &MasterKey, which: HostKey, sealed: &Sealed) -> Option<TenantKey> {
    let open = |hex_key: &str| {
        let bytes = hex::decode(hex_key).ok()?;
        master.unwrap_tenant_key(which.sealed_for(), &bytes)
    };
    open(&sealed.wrapped).or_else(|| sealed.wrapped_next.as_deref().and_then(open))
}

/// The host's key `which`.
pub(crate) fn host_key(data: &DataDir, which: HostKey) -> Result<TenantKey, BaseError> {
    let path = path(data);
    // The file first, the key after: a rotation in this process settles the file only
    // after this process moved to the new key.
    let record = read(&path)?;
    let master = data.master_key();
    match record {
        None => Ok(master.derive(which.purpose())),
        Some(record) => {
            let sealed = match which {
                HostKey::Pack => &record.pack,
                HostKey::Index => &record.index,
            };
            open_sealed(&master, which, sealed).ok_or_else(|| {
                damaged(
                    &path,
                    format!("the {which:?} key opens under neither of its seals"),
                )
            })
        }
    }
}

/// Takes step `step` of a master key rotation on the host's base keys (see
/// `tenants::reseal`): `Add` keeps them in the file, sealed under the data dir's key and the
/// new one. The caller holds the data dir's keys alone.
pub(crate) fn reseal(data: &DataDir, step: Reseal) -> Result<(), BaseError> {
    let path = path(data);
    let master = data.master_key();
    let record = match step {
        Reseal::Add(next) => {
            let seal = |which: HostKey| -> Result<Sealed, BaseError> {
                let key = host_key(data, which)?;
                Ok(Sealed {
                    wrapped: hex::encode(master.wrap_tenant_key(which.sealed_for(), &key)?),
                    wrapped_next: Some(hex::encode(
                        next.wrap_tenant_key(which.sealed_for(), &key)?,
                    )),
                })
            };
            KeysRecord {
                format_version: FORMAT_VERSION,
                pack: seal(HostKey::Pack)?,
                index: seal(HostKey::Index)?,
            }
        }
        Reseal::Settle => {
            let record = read(&path)?.ok_or_else(|| {
                damaged(
                    &path,
                    "it is missing, and a rotation keeps the keys in it before it commits".into(),
                )
            })?;
            let settle = |which: HostKey, sealed: &Sealed| -> Result<Sealed, BaseError> {
                let key = open_sealed(&master, which, sealed).ok_or_else(|| {
                    damaged(&path, format!("the {which:?} key opens under no seal"))
                })?;
                Ok(Sealed {
                    wrapped: hex::encode(master.wrap_tenant_key(which.sealed_for(), &key)?),
                    wrapped_next: None,
                })
            };
            KeysRecord {
                format_version: FORMAT_VERSION,
                pack: settle(HostKey::Pack, &record.pack)?,
                index: settle(HostKey::Index, &record.index)?,
            }
        }
    };
    let json = serde_json::to_vec_pretty(&record).expect("the keys record serialises");
    std::fs::create_dir_all(path.parent().expect("under base/")).map_err(BaseError::io(&path))?;
    crate::fs_util::write_atomic(&path, &json, 0o600).map_err(BaseError::io(&path))
}
