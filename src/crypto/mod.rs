//! Keys and ciphers: the master key, wrapped tenant keys, sealed (AES-256-GCM) records and bulk
//! AES-256-CTR for file bodies.
//!
//! The key hierarchy is master key -> tenant key (a tenant holds a ring of them: `keyring`)
//! -> per-file key. The master key never leaves
//! this process and is zeroized on drop; tenant keys are stored only wrapped under it; per-file
//! keys are stored only wrapped under the tenant key (see `store::file_key`). Nothing here logs
//! key material, and no key type implements a revealing `Debug`.

mod bulk;
mod keyring;
mod keys;
mod seal;

pub use bulk::FileCipher;
pub use keyring::{KeyId, Keyring, KEY_ID_LEN};
pub use keys::{KeyError, MasterKey, TenantKey, KEY_LEN};
pub(crate) use seal::{open, seal, SEAL_OVERHEAD};

/// Fills `buf` from the operating system's CSPRNG.
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<(), KeyError> {
    getrandom::getrandom(buf).map_err(|e| KeyError::Random(e.to_string()))
}
