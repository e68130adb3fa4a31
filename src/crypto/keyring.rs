//! A tenant's keyring: every key its store's files may be sealed under, each with an id, and
//! the one that seals the files it writes now.
//!
//! Why: a fork shares its source's files and must read them under the source's keys, while
//! everything it writes afterwards is sealed under a key of its own that the source never
//! holds; the source, for its part, moves to a new key at the fork, so the fork holds no key
//! to what the source writes later. A rotation does the same without a fork. Each file's
//! header names the id of the key that seals its file key (`store::file_key`), so a file
//! opens with one lookup, and a file sealed under a key the ring lacks is refused by id.
//!
//! The ring changes while a store is open (a fork or rotation of a mounted tenant adds a key
//! and writes under it from then on), so it sits behind a lock that file creation and file
//! opening take briefly, never on a read or write of file data.

use std::fmt;
use std::sync::RwLock;

use super::{KeyError, TenantKey};

/// Bytes of a key id in a file header and, as hex, in a tenant record.
pub const KEY_ID_LEN: usize = 8;

/// A key's name in its tenant's ring and in the headers of the files it seals: random, so
/// that a fork's keys and its source's never collide.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; KEY_ID_LEN]);

impl KeyId {
    /// The id of a tenant's key from before keyrings (a record of format 1): its files'
    /// headers name no key, and are tried under every key of the ring.
    pub const FIRST: KeyId = KeyId([0; KEY_ID_LEN]);

    pub fn generate() -> Result<Self, KeyError> {
        let mut id = [0u8; KEY_ID_LEN];
        super::random_bytes(&mut id)?;
        Ok(Self(id))
    }

    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(text: &str) -> Option<Self> {
        let mut id = [0u8; KEY_ID_LEN];
        hex::decode_to_slice(text, &mut id).ok()?;
        Some(Self(id))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", self.to_hex())
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Keys by id and the one new files are sealed under. `Debug` shows ids only.
pub struct Keyring {
    inner: RwLock<Ring>,
}

struct Ring {
    keys: Vec<(KeyId, TenantKey)>,
    /// Index in `keys` of the key new files are sealed under.
    writing: usize,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ring = self.read();
        f.debug_struct("Keyring")
            .field(
                "ids",
                &ring.keys.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            )
            .field("writing", &ring.keys[ring.writing].0)
            .finish()
    }
}

impl Keyring {
    /// A ring of `keys` (at least one, ids distinct) sealing new files under `writing`,
    /// which must be one of them.
    pub fn new(keys: Vec<(KeyId, TenantKey)>, writing: KeyId) -> Option<Self> {
        let at = keys.iter().position(|(id, _)| *id == writing)?;
        let distinct = keys
            .iter()
            .enumerate()
            .all(|(i, (id, _))| keys[..i].iter().all(|(other, _)| other != id));
        distinct.then(|| Self {
            inner: RwLock::new(Ring { keys, writing: at }),
        })
    }

    /// A ring of one key, which seals everything.
    pub fn single(id: KeyId, key: TenantKey) -> Self {
        Self {
            inner: RwLock::new(Ring {
                keys: vec![(id, key)],
                writing: 0,
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` of the key new files are sealed under, and its id.
    pub(crate) fn with_writing<R>(&self, f: impl FnOnce(KeyId, &TenantKey) -> R) -> R {
        let ring = self.read();
        let (id, key) = &ring.keys[ring.writing];
        f(*id, key)
    }

    /// `f` of key `id`, if the ring holds it.
    pub(crate) fn with_key<R>(&self, id: KeyId, f: impl FnOnce(&TenantKey) -> R) -> Option<R> {
        let ring = self.read();
        ring.keys
            .iter()
            .find(|(k, _)| *k == id)
            .map(|(_, key)| f(key))
    }

    /// The first `Some` of `f` over every key, the writing key first.
    pub(crate) fn find_map<R>(&self, mut f: impl FnMut(&TenantKey) -> Option<R>) -> Option<R> {
        let ring = self.read();
        let writing = &ring.keys[ring.writing].1;
        f(writing).or_else(|| {
            ring.keys
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != ring.writing)
                .find_map(|(_, (_, key))| f(key))
        })
    }

    /// Adds `key` as `id` and seals new files under it from now on.
    pub fn rotate_to(&self, id: KeyId, key: TenantKey) {
        let mut ring = self.inner.write().unwrap_or_else(|e| e.into_inner());
        ring.keys.push((id, key));
        ring.writing = ring.keys.len() - 1;
    }

    /// The ids of its keys, and the writing key's.
    pub fn ids(&self) -> (Vec<KeyId>, KeyId) {
        let ring = self.read();
        (
            ring.keys.iter().map(|(id, _)| *id).collect(),
            ring.keys[ring.writing].0,
        )
    }

    /// `f` of each key with its id, in the ring's order.
    pub fn for_each(&self, mut f: impl FnMut(KeyId, &TenantKey)) {
        for (id, key) in &self.read().keys {
            f(*id, key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_finds_keys_by_id_and_rotates() {
        let (a, b) = (KeyId::generate().unwrap(), KeyId::generate().unwrap());
        let key_a = TenantKey::generate().unwrap();
        let a_bytes = *key_a.bytes();
        let ring = Keyring::single(a, key_a);
        assert_eq!(ring.with_writing(|id, _| id), a);
        assert_eq!(ring.with_key(a, |k| *k.bytes()), Some(a_bytes));
        assert!(ring.with_key(b, |_| ()).is_none());
        ring.rotate_to(b, TenantKey::generate().unwrap());
        assert_eq!(ring.ids(), (vec![a, b], b));
        assert_eq!(ring.with_key(a, |k| *k.bytes()), Some(a_bytes));
        assert_eq!(KeyId::from_hex(&a.to_hex()), Some(a));
        assert!(KeyId::from_hex("xyz").is_none());
        assert!(!format!("{ring:?}").contains(&hex::encode(a_bytes)));
    }

    #[test]
    fn a_ring_needs_its_writing_key_and_distinct_ids() {
        let a = KeyId::generate().unwrap();
        let key = || TenantKey::generate().unwrap();
        assert!(Keyring::new(vec![(a, key())], KeyId::FIRST).is_none());
        assert!(Keyring::new(vec![(a, key()), (a, key())], a).is_none());
        assert!(Keyring::new(vec![(KeyId::FIRST, key()), (a, key())], a).is_some());
    }
}
