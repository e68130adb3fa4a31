//! The 4096-byte header ("prefix") at the start of every file RocksDB writes for a tenant.
//!
//! Each file gets its own random AES-256 key and IV for its CTR body; they are stored in the
//! header sealed (AES-256-GCM) under one key of the tenant's ring (`crypto::Keyring`), which
//! the header names. The header is a full 4 KiB so the body stays aligned for O_DIRECT.
//! Layout:
//!
//! ```text
//! 0..8      magic "TFSFILE2"
//! 8..16     id of the tenant key that seals the file key
//! 16..108   sealed(that key, AAD = magic ‖ key id, file key[32] ‖ iv[16])
//!           (12 nonce + 48 + 16 tag)
//! 108..4096 zero
//! ```
//!
//! Files written before keyrings ("TFSFILE1": the sealed secret at 8..100, AAD = magic, no
//! key id) still open: under each key of the ring in turn (GCM tells the right one).

use zeroize::Zeroizing;

use crate::crypto::{self, FileCipher, KeyId, Keyring, KEY_ID_LEN, SEAL_OVERHEAD};

pub(crate) const PREFIX_LEN: usize = 4096;
const MAGIC: &[u8; 8] = b"TFSFILE2";
const MAGIC_V1: &[u8; 8] = b"TFSFILE1";
const SECRET_LEN: usize = 32 + 16;
const SEALED_LEN: usize = SECRET_LEN + SEAL_OVERHEAD;
const SEALED_AT: usize = MAGIC.len() + KEY_ID_LEN;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FileKeyError {
    #[error("file header is not a tenantfs header (bad magic or length)")]
    NotAHeader,
    #[error("file key does not open under this tenant's key")]
    WrongKey,
    #[error("file key is sealed under key {0}, which this tenant's keyring does not hold")]
    UnknownKey(KeyId),
    #[error(transparent)]
    Key(#[from] crypto::KeyError),
}

/// The AAD of a header sealed under key `id`.
fn aad(id: KeyId) -> [u8; SEALED_AT] {
    let mut aad = [0u8; SEALED_AT];
    aad[..MAGIC.len()].copy_from_slice(MAGIC);
    aad[MAGIC.len()..].copy_from_slice(&id.0);
    aad
}

/// Fills `out` (the whole prefix) with a fresh header sealed under the ring's writing key and
/// returns the file's cipher.
pub(crate) fn new_prefix(ring: &Keyring, out: &mut [u8]) -> Result<FileCipher, FileKeyError> {
    if out.len() != PREFIX_LEN {
        return Err(FileKeyError::NotAHeader);
    }
    let mut secret = Zeroizing::new([0u8; SECRET_LEN]);
    crypto::random_bytes(&mut secret[..])?;
    let (id, sealed) = ring.with_writing(|id, key| {
        crypto::seal(key.bytes(), &aad(id), &secret[..]).map(|sealed| (id, sealed))
    })?;
    debug_assert_eq!(sealed.len(), SEALED_LEN);
    out.fill(0);
    out[..MAGIC.len()].copy_from_slice(MAGIC);
    out[MAGIC.len()..SEALED_AT].copy_from_slice(&id.0);
    out[SEALED_AT..SEALED_AT + SEALED_LEN].copy_from_slice(&sealed);
    Ok(cipher_from(&secret))
}

/// The id of the key a header names (`None`: a header from before keyrings).
pub(crate) fn key_id(prefix: &[u8]) -> Result<Option<KeyId>, FileKeyError> {
    if prefix.len() < SEALED_AT + SEALED_LEN {
        return Err(FileKeyError::NotAHeader);
    }
    match &prefix[..MAGIC.len()] {
        m if m == MAGIC => Ok(Some(KeyId(
            prefix[MAGIC.len()..SEALED_AT].try_into().expect("8 bytes"),
        ))),
        m if m == MAGIC_V1 => Ok(None),
        _ => Err(FileKeyError::NotAHeader),
    }
}

/// What tells this file from every other: 16 bytes of its header's seal, which begins with
/// the seal's random 96-bit nonce (`crypto::seal`). A hard link of the file has the same; a
/// file written again gets a new header, so a new id. `None`: no tenantfs header.
pub(crate) fn file_id(prefix: &[u8]) -> Option<[u8; 16]> {
    let at = match key_id(prefix).ok()? {
        Some(_) => SEALED_AT,
        None => MAGIC_V1.len(),
    };
    prefix.get(at..at + 16)?.try_into().ok()
}

/// Opens a header written by [`new_prefix`] (or by a tenantfs from before keyrings).
pub(crate) fn open_prefix(ring: &Keyring, prefix: &[u8]) -> Result<FileCipher, FileKeyError> {
    if prefix.len() != PREFIX_LEN {
        return Err(FileKeyError::NotAHeader);
    }
    let secret = match key_id(prefix)? {
        Some(id) => {
            let sealed = &prefix[SEALED_AT..SEALED_AT + SEALED_LEN];
            ring.with_key(id, |key| crypto::open(key.bytes(), &aad(id), sealed))
                .ok_or(FileKeyError::UnknownKey(id))?
                .map_err(|_| FileKeyError::WrongKey)?
        }
        None => {
            let sealed = &prefix[MAGIC_V1.len()..MAGIC_V1.len() + SEALED_LEN];
            ring.find_map(|key| crypto::open(key.bytes(), MAGIC_V1, sealed).ok())
                .ok_or(FileKeyError::WrongKey)?
        }
    };
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
    use crate::crypto::TenantKey;

    fn ring() -> (KeyId, Keyring) {
        let id = KeyId::generate().unwrap();
        (id, Keyring::single(id, TenantKey::generate().unwrap()))
    }

    #[test]
    fn header_round_trip_and_errors() {
        let (id, t) = ring();
        let mut p = vec![0u8; PREFIX_LEN];
        let c = new_prefix(&t, &mut p).unwrap();
        assert_eq!(key_id(&p).unwrap(), Some(id));
        let mut data = *b"hello world, hello world";
        c.apply(4096, &mut data);
        open_prefix(&t, &p).unwrap().apply(4096, &mut data);
        assert_eq!(&data, b"hello world, hello world");
        assert!(matches!(
            open_prefix(&ring().1, &p),
            Err(FileKeyError::UnknownKey(k)) if k == id
        ));
        // The same id over another key: the seal does not open.
        let impostor = Keyring::single(id, TenantKey::generate().unwrap());
        assert!(matches!(
            open_prefix(&impostor, &p),
            Err(FileKeyError::WrongKey)
        ));
        p[0] = b'X';
        assert!(matches!(open_prefix(&t, &p), Err(FileKeyError::NotAHeader)));
        assert!(matches!(
            open_prefix(&t, &p[..100]),
            Err(FileKeyError::NotAHeader)
        ));
    }

    #[test]
    fn a_file_id_is_its_headers_and_new_with_each_header() {
        let (_, t) = ring();
        let mut p = vec![0u8; PREFIX_LEN];
        new_prefix(&t, &mut p).unwrap();
        let id = file_id(&p).unwrap();
        assert_eq!(
            file_id(&p.clone()),
            Some(id),
            "a copy of the header: the same file"
        );
        let mut q = vec![0u8; PREFIX_LEN];
        new_prefix(&t, &mut q).unwrap();
        assert_ne!(file_id(&q).unwrap(), id, "a new header: a new file");
        assert_eq!(file_id(&[0u8; PREFIX_LEN]), None);
    }

    #[test]
    fn a_header_names_the_writing_key_and_opens_under_the_ring_after_a_rotation() {
        let (first, t) = ring();
        let mut old = vec![0u8; PREFIX_LEN];
        new_prefix(&t, &mut old).unwrap();
        let second = KeyId::generate().unwrap();
        t.rotate_to(second, TenantKey::generate().unwrap());
        let mut new = vec![0u8; PREFIX_LEN];
        new_prefix(&t, &mut new).unwrap();
        assert_eq!(key_id(&old).unwrap(), Some(first));
        assert_eq!(key_id(&new).unwrap(), Some(second));
        open_prefix(&t, &old).unwrap();
        open_prefix(&t, &new).unwrap();
    }

    #[test]
    fn a_header_from_before_keyrings_opens_under_any_key_of_the_ring() {
        let key = TenantKey::generate().unwrap();
        let mut secret = [7u8; SECRET_LEN];
        secret[0] = 1;
        let sealed = crypto::seal(key.bytes(), MAGIC_V1, &secret).unwrap();
        let mut p = vec![0u8; PREFIX_LEN];
        p[..8].copy_from_slice(MAGIC_V1);
        p[8..8 + SEALED_LEN].copy_from_slice(&sealed);
        assert_eq!(key_id(&p).unwrap(), None);
        let both = Keyring::new(
            vec![
                (KeyId::generate().unwrap(), TenantKey::generate().unwrap()),
                (KeyId::FIRST, key),
            ],
            KeyId::FIRST,
        )
        .unwrap();
        both.rotate_to(KeyId::generate().unwrap(), TenantKey::generate().unwrap());
        let mut data = *b"abc";
        open_prefix(&both, &p).unwrap().apply(4096, &mut data);
        let mut want = *b"abc";
        cipher_from(&secret).apply(4096, &mut want);
        assert_eq!(data, want);
        assert!(matches!(
            open_prefix(&ring().1, &p),
            Err(FileKeyError::WrongKey)
        ));
    }
}
