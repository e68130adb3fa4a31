//! The 4096-byte header ("prefix") at the start of every file RocksDB writes for a tenant.
//!
//! Each file gets its own random AES-256 key and IV for its CTR body; they are stored in the
//! header sealed (AES-256-GCM) under the tenant key. The header is a full 4 KiB so the body stays
//! aligned for O_DIRECT. Layout:
//!
//! ```text
//! 0..8      magic "TFSFILE1"
//! 8..100    sealed(tenant key, AAD = magic, file key[32] || iv[16])  (12 nonce + 48 + 16 tag)
//! 100..4096 zero
//! ```

use zeroize::Zeroizing;

use crate::crypto::{self, FileCipher, TenantKey, SEAL_OVERHEAD};

pub(crate) const PREFIX_LEN: usize = 4096;
const MAGIC: &[u8; 8] = b"TFSFILE1";
const SECRET_LEN: usize = 32 + 16;
const SEALED_LEN: usize = SECRET_LEN + SEAL_OVERHEAD;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FileKeyError {
    #[error("file header is not a tenantfs header (bad magic or length)")]
    NotAHeader,
    #[error("file key does not open under this tenant's key")]
    WrongKey,
    #[error(transparent)]
    Key(#[from] crypto::KeyError),
}

/// Fills `out` (the whole prefix) with a fresh header and returns the file's cipher.
pub(crate) fn new_prefix(tenant: &TenantKey, out: &mut [u8]) -> Result<FileCipher, FileKeyError> {
    if out.len() != PREFIX_LEN {
        return Err(FileKeyError::NotAHeader);
    }
    let mut secret = Zeroizing::new([0u8; SECRET_LEN]);
    crypto::random_bytes(&mut secret[..])?;
    let sealed = crypto::seal(tenant.bytes(), MAGIC, &secret[..])?;
    debug_assert_eq!(sealed.len(), SEALED_LEN);
    out.fill(0);
    out[..MAGIC.len()].copy_from_slice(MAGIC);
    out[MAGIC.len()..MAGIC.len() + SEALED_LEN].copy_from_slice(&sealed);
    Ok(cipher_from(&secret))
}

/// Opens a header written by [`new_prefix`].
pub(crate) fn open_prefix(tenant: &TenantKey, prefix: &[u8]) -> Result<FileCipher, FileKeyError> {
    if prefix.len() != PREFIX_LEN || &prefix[..MAGIC.len()] != MAGIC {
        return Err(FileKeyError::NotAHeader);
    }
    let sealed = &prefix[MAGIC.len()..MAGIC.len() + SEALED_LEN];
    let secret = crypto::open(tenant.bytes(), MAGIC, sealed).map_err(|_| FileKeyError::WrongKey)?;
    let secret: &[u8; SECRET_LEN] = secret
        .as_slice()
        .try_into()
        .map_err(|_| FileKeyError::NotAHeader)?;
    Ok(cipher_from(secret))
}

fn cipher_from(secret: &[u8; SECRET_LEN]) -> FileCipher {
    let (key, iv) = secret.split_at(32);
    FileCipher::new(key.try_into().unwrap(), iv.try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_errors() {
        let t = TenantKey::generate().unwrap();
        let mut p = vec![0u8; PREFIX_LEN];
        let c = new_prefix(&t, &mut p).unwrap();
        let mut data = *b"hello world, hello world";
        c.apply(4096, &mut data);
        open_prefix(&t, &p).unwrap().apply(4096, &mut data);
        assert_eq!(&data, b"hello world, hello world");
        assert!(matches!(
            open_prefix(&TenantKey::generate().unwrap(), &p),
            Err(FileKeyError::WrongKey)
        ));
        p[0] = b'X';
        assert!(matches!(open_prefix(&t, &p), Err(FileKeyError::NotAHeader)));
        assert!(matches!(
            open_prefix(&t, &p[..100]),
            Err(FileKeyError::NotAHeader)
        ));
    }
}
