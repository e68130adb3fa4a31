//! AES-256-GCM sealing of small records (wrapped keys, file-key headers).
//!
//! Sealed layout: 12-byte random nonce, then ciphertext, then the 16-byte tag. The AAD binds a
//! record to its purpose (and, for tenant keys, the tenant's name and format version) so that a
//! record copied to another place does not open there.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use zeroize::Zeroizing;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Bytes a sealed record adds to its plaintext.
pub(crate) const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// A sealed record did not open: wrong key, wrong AAD, or damaged bytes (GCM cannot tell which).
#[derive(Debug, thiserror::Error)]
#[error("sealed record does not open (wrong key or damaged data)")]
pub(crate) struct SealError;

pub(crate) fn seal(
    key: &[u8; 32],
    aad: &[u8],
    plaintext: &[u8],
) -> Result<Vec<u8>, super::KeyError> {
    let mut nonce = [0u8; NONCE_LEN];
    super::random_bytes(&mut nonce)?;
    let cipher = Aes256Gcm::new(key.into());
    let body = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| super::KeyError::Random("AES-GCM encryption failed".into()))?;
    let mut out = Vec::with_capacity(NONCE_LEN + body.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&body);
    Ok(out)
}

pub(crate) fn open(
    key: &[u8; 32],
    aad: &[u8],
    sealed: &[u8],
) -> Result<Zeroizing<Vec<u8>>, SealError> {
    if sealed.len() < SEAL_OVERHEAD {
        return Err(SealError);
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let cipher = Aes256Gcm::new(key.into());
    cipher
        .decrypt(Nonce::from_slice(nonce), Payload { msg: body, aad })
        .map(Zeroizing::new)
        .map_err(|_| SealError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tamper() {
        let key = [7u8; 32];
        let sealed = seal(&key, b"aad", b"secret").unwrap();
        assert_eq!(sealed.len(), 6 + SEAL_OVERHEAD);
        assert_eq!(&open(&key, b"aad", &sealed).unwrap()[..], b"secret");
        assert!(open(&key, b"other", &sealed).is_err());
        assert!(open(&[8u8; 32], b"aad", &sealed).is_err());
        let mut bad = sealed.clone();
        bad[20] ^= 1;
        assert!(open(&key, b"aad", &bad).is_err());
        assert!(open(&key, b"aad", &sealed[..10]).is_err());
    }
}
