//! The master key and tenant keys.
//!
//! A master key file holds 32 raw bytes or 64 hex characters (a trailing newline is fine). It
//! must be readable by its owner only, and owned by the user who runs tenantfs: a key that
//! others can read is not a secret. Tenant keys are random; they exist on disk only wrapped
//! (AES-256-GCM) under the master key, with AAD binding the tenant's name and the format
//! version, so a wrapped key moved to another tenant does not open.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::{open, seal};

/// Length of every key in the hierarchy.
pub const KEY_LEN: usize = 32;

/// Format version bound into every wrapped tenant key.
const TENANT_KEY_FORMAT: u32 = 1;
/// Plaintext of the data dir's key check record (see [`MasterKey::check_record`]).
const CHECK_PLAINTEXT: &[u8] = b"tenantfs master key check v1";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read master key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "master key file {path} is readable by group or others (mode {mode:o}); \
         run `chmod 600 {path}` and try again"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error(
        "master key file {path} is owned by uid {owner}, not by the caller (uid {caller}); \
         run `chown {caller} {path}` or use your own key file"
    )]
    WrongOwner {
        path: PathBuf,
        owner: u32,
        caller: u32,
    },
    #[error(
        "master key file {path} must hold 32 raw bytes or 64 hex characters, found {len} bytes"
    )]
    BadFormat { path: PathBuf, len: usize },
    #[error("cannot create master key file {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the system random source failed: {0}")]
    Random(String),
}

/// The host's root key. Zeroized on drop; `Debug` never shows it.
pub struct MasterKey(Zeroizing<[u8; KEY_LEN]>);

/// One tenant's key: it wraps the per-file keys of that tenant's store. A clone is zeroized
/// on drop as the original is (a ring given to a new tenant copies its source's keys).
#[derive(Clone)]
pub struct TenantKey(Zeroizing<[u8; KEY_LEN]>);

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantKey(<redacted>)")
    }
}

fn random_key() -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let mut k = Zeroizing::new([0u8; KEY_LEN]);
    super::random_bytes(&mut k[..])?;
    Ok(k)
}

fn tenant_aad(tenant: &str) -> Vec<u8> {
    let mut aad = b"tenantfs tenant key\0".to_vec();
    aad.extend_from_slice(&TENANT_KEY_FORMAT.to_be_bytes());
    aad.extend_from_slice(tenant.as_bytes());
    aad
}

impl MasterKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A host-wide key for one purpose (BLAKE3 `derive_key` with a context naming it): nothing
    /// to store, and another master key derives another key.
    pub(crate) fn derive(&self, purpose: &'static str) -> TenantKey {
        TenantKey(Zeroizing::new(blake3::derive_key(purpose, &self.0[..])))
    }

    pub fn generate() -> Result<Self, KeyError> {
        Ok(Self(random_key()?))
    }

    /// Reads a key file, refusing one that group or others can read or that another user owns.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let read_err = |source| KeyError::Read {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::TooOpen {
                path: path.to_owned(),
                mode,
            });
        }
        let caller = nix::unistd::geteuid().as_raw();
        if meta.uid() != caller {
            return Err(KeyError::WrongOwner {
                path: path.to_owned(),
                owner: meta.uid(),
                caller,
            });
        }
        let mut raw = Zeroizing::new(Vec::with_capacity(80));
        file.take(1024).read_to_end(&mut raw).map_err(read_err)?;
        Self::parse(&raw).ok_or(KeyError::BadFormat {
            path: path.to_owned(),
            len: raw.len(),
        })
    }

    /// 32 raw bytes, or 64 hex characters with optional trailing newline.
    fn parse(raw: &[u8]) -> Option<Self> {
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        if raw.len() == KEY_LEN {
            key.copy_from_slice(raw);
            return Some(Self(key));
        }
        let text = raw.strip_suffix(b"\n").unwrap_or(raw);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.len() == 2 * KEY_LEN && hex::decode_to_slice(text, &mut key[..]).is_ok() {
            return Some(Self(key));
        }
        None
    }

    /// Creates a new random key file (mode 0600; fails if the file exists) and returns the key.
    pub fn create_file(path: &Path) -> Result<Self, KeyError> {
        let key = Self::generate()?;
        let create_err = |source| KeyError::Create {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(create_err)?;
        file.write_all(&key.0[..]).map_err(create_err)?;
        file.sync_all().map_err(create_err)?;
        Ok(key)
    }

    /// Writes the key to `path` (mode 0600), replacing what is there in one rename.
    pub(crate) fn write_file(&self, path: &Path) -> std::io::Result<()> {
        crate::fs_util::write_atomic(path, &self.0[..], 0o600)
    }

    /// Wraps a tenant key for storage, bound to the tenant's name.
    pub fn wrap_tenant_key(&self, tenant: &str, key: &TenantKey) -> Result<Vec<u8>, KeyError> {
        seal(&self.0, &tenant_aad(tenant), &key.0[..])
    }

    /// Unwraps a stored tenant key; `None` means this master key (or this tenant name) is not
    /// the one it was wrapped with, or the record is damaged.
    pub fn unwrap_tenant_key(&self, tenant: &str, wrapped: &[u8]) -> Option<TenantKey> {
        let plain = open(&self.0, &tenant_aad(tenant), wrapped).ok()?;
        let bytes: [u8; KEY_LEN] = plain.as_slice().try_into().ok()?;
        Some(TenantKey(Zeroizing::new(bytes)))
    }

    /// A record that only this key opens: stored in the data dir so that a wrong master key is
    /// caught before anything is created or opened with it.
    pub fn check_record(&self) -> Result<Vec<u8>, KeyError> {
        seal(&self.0, b"tenantfs master check", CHECK_PLAINTEXT)
    }

    /// Whether `record` was made by [`Self::check_record`] with this key.
    pub fn matches_check_record(&self, record: &[u8]) -> bool {
        open(&self.0, b"tenantfs master check", record)
            .map(|p| p.as_slice() == CHECK_PLAINTEXT)
            .unwrap_or(false)
    }
}

impl TenantKey {
    pub fn generate() -> Result<Self, KeyError> {
        Ok(Self(random_key()?))
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_depend_on_purpose_and_master() {
        let m = MasterKey::from_bytes([1; 32]);
        let a = m.derive("tenantfs test a");
        assert_eq!(a.bytes(), m.derive("tenantfs test a").bytes());
        assert_ne!(a.bytes(), m.derive("tenantfs test b").bytes());
        assert_ne!(
            a.bytes(),
            MasterKey::from_bytes([2; 32])
                .derive("tenantfs test a")
                .bytes()
        );
    }

    #[test]
    fn parse_raw_and_hex() {
        assert!(MasterKey::parse(&[9u8; 32]).is_some());
        let hex = "ab".repeat(32);
        assert_eq!(MasterKey::parse(hex.as_bytes()).unwrap().0[0], 0xab);
        assert!(MasterKey::parse(format!("{hex}\n").as_bytes()).is_some());
        assert!(MasterKey::parse(b"short").is_none());
        assert!(MasterKey::parse("zz".repeat(32).as_bytes()).is_none());
    }

    #[test]
    fn tenant_key_is_bound_to_name_and_master() {
        let m = MasterKey::from_bytes([1u8; 32]);
        let t = TenantKey::generate().unwrap();
        let w = m.wrap_tenant_key("alpha", &t).unwrap();
        assert_eq!(m.unwrap_tenant_key("alpha", &w).unwrap().0, t.0);
        assert!(m.unwrap_tenant_key("beta", &w).is_none());
        assert!(MasterKey::from_bytes([2u8; 32])
            .unwrap_tenant_key("alpha", &w)
            .is_none());
    }

    #[test]
    fn check_record_tells_keys_apart() {
        let m = MasterKey::from_bytes([1u8; 32]);
        let rec = m.check_record().unwrap();
        assert!(m.matches_check_record(&rec));
        assert!(!MasterKey::from_bytes([2u8; 32]).matches_check_record(&rec));
    }

    #[test]
    fn debug_redacts() {
        let m = MasterKey::from_bytes([0x41; 32]);
        assert_eq!(format!("{m:?}"), "MasterKey(<redacted>)");
    }

    #[test]
    fn load_refuses_open_modes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        MasterKey::create_file(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(MasterKey::load(&p).is_ok());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = MasterKey::load(&p).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
    }
}
