//! The host data dir: where the master key comes from, and the check that it is the right one.
//!
//! Layout:
//!
//! ```text
//! <data-dir>/master.key     the master key, only when `init` created it (mode 0600)
//! <data-dir>/master.check   a record sealed under the master key; a different key fails to open it
//! <data-dir>/keys.lock      held (flock) shared by every writer of a wrapped key or of a
//!                           record holding one, exclusively by a master key rotation
//! <data-dir>/master.rotation, master.key.next
//!                           a master key rotation on its way (see `master_rotation`)
//! <data-dir>/tenants/       one directory per tenant (see `tenants`)
//! ```
//!
//! The master key is taken from, in order: `--master-key FILE`,
//! `$CREDENTIALS_DIRECTORY/tenantfs-master-key` (systemd LoadCredential), `<data-dir>/master.key`.
//!
//! `init` writes the key to `<data-dir>/master.key`, and that file is the one place the
//! shipped `tenantfs.service` loads it from (`LoadCredential=` of the default data dir's key),
//! so `tenantfs init` followed by starting the unit works as written. When that file is
//! missing the unit still starts the daemon, with a blank credential (`SetCredential=`, a
//! newline, which systemd uses when `LoadCredential=` finds nothing): a blank credential counts
//! as none, so the daemon looks for the key itself and says what it found, instead of systemd
//! failing the unit before the daemon runs: a data dir never initialised (run `tenantfs
//! init`), or one initialised with a key that is gone (every place looked at; put the key
//! back: a new key would open nothing, so `init` refuses to make one there).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::crypto::{KeyError, MasterKey};
use crate::fs_util::write_atomic;

/// The data dir when neither `--data-dir` nor `$TENANTFS_DATA_DIR` names one; the shipped
/// `tenantfs.service` runs the daemon on it and loads [`key_file`] of it as its credential
/// (tests/it/systemd_units.rs checks the unit says so).
pub const DEFAULT_ROOT: &str = "/var/lib/tenantfs";

const KEY_FILE: &str = "master.key";
const CHECK_FILE: &str = "master.check";
const KEYS_LOCK: &str = "keys.lock";
/// A rotation's record (see `master_rotation`): its presence means one is on its way.
pub(crate) const ROTATION_FILE: &str = "master.rotation";
/// The new master key, in a data dir whose key lives in it, from the start of a rotation until
/// it replaces `master.key`.
pub(crate) const NEXT_KEY_FILE: &str = "master.key.next";
const TENANTS: &str = "tenants";
const CREDENTIAL_NAME: &str = "tenantfs-master-key";

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error(
        "data dir {0} is not initialised; run `tenantfs --data-dir {0} init` first \
         (or set --data-dir / TENANTFS_DATA_DIR to the right place)"
    )]
    NotInitialised(PathBuf),
    #[error(
        "no master key: looked at {looked}; data dir {root} was initialised with a key that is \
         not there: put that key file back at {key} (mode 0600{unit}) or pass --master-key \
         FILE (`tenantfs init` makes a key only for a data dir that has none)",
        unit = unit_loads_it(.root)
    )]
    NoKey {
        root: PathBuf,
        /// Where `init` put the key: [`key_file`] of `root`.
        key: PathBuf,
        looked: String,
    },
    #[error(
        "the master key from {key} is not the key data dir {root} was initialised with; \
         nothing was changed; use the original key file"
    )]
    WrongKey { key: PathBuf, root: PathBuf },
    #[error(
        "data dir {root} moved to a new master key (a rotation to the key in {new_key} was \
         committed): the key from {key} opens nothing there now; use the new key (and run \
         `tenantfs key rotate-master --new-key {new_key}` again if the rotation did not finish)"
    )]
    Rotated {
        key: PathBuf,
        root: PathBuf,
        new_key: PathBuf,
    },
    #[error(
        "data dir {0} moved to a new master key while this process ran with the old one: \
         nothing was changed; restart this process (its mounts come back under the new key)"
    )]
    StaleKey(PathBuf),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Where the master key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `--master-key FILE`
    Explicit(PathBuf),
    /// systemd credential
    Credential(PathBuf),
    /// `<data-dir>/master.key`
    DataDir(PathBuf),
}

impl KeySource {
    pub fn path(&self) -> &Path {
        match self {
            KeySource::Explicit(p) | KeySource::Credential(p) | KeySource::DataDir(p) => p,
        }
    }

    /// Picks the source by the documented order. A blank credential is none: it is what
    /// systemd passes when the unit's `LoadCredential=` found no file (`SetCredential=`).
    pub fn resolve(explicit: Option<&Path>, root: &Path) -> Self {
        if let Some(p) = explicit {
            return KeySource::Explicit(p.to_owned());
        }
        if let Some(p) = credential_file() {
            if p.exists() && !blank(&p) {
                return KeySource::Credential(p);
            }
        }
        KeySource::DataDir(key_file(root))
    }
}

/// Whether the file at `path` holds no key at all: shorter than any key (32 bytes) and only
/// whitespace (an empty file, a newline). One that cannot be read is not blank: loading it
/// says why.
fn blank(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(32).read_to_end(&mut head))
        .is_ok_and(|n| n < 32 && head.iter().all(u8::is_ascii_whitespace))
}

/// Where `init` writes the master key of the data dir at `root` (and the shipped unit's
/// `LoadCredential=` reads it for the default data dir).
pub fn key_file(root: &Path) -> PathBuf {
    root.join(KEY_FILE)
}

/// What the `NoKey` error adds about the shipped unit: it loads the key from [`key_file`] of
/// [`DEFAULT_ROOT`] only, so it is named for that data dir and no other (a unit edited for
/// another data dir is the editor's to know about).
fn unit_loads_it(root: &Path) -> &'static str {
    let is_default = std::path::absolute(root).is_ok_and(|r| r == Path::new(DEFAULT_ROOT));
    if is_default {
        "; tenantfs.service loads it from there"
    } else {
        ""
    }
}

/// The systemd credential's file, when systemd passed credentials.
fn credential_file() -> Option<PathBuf> {
    std::env::var_os("CREDENTIALS_DIRECTORY").map(|dir| Path::new(&dir).join(CREDENTIAL_NAME))
}

/// No key anywhere: the error names every place looked at and why each gave no key.
fn no_key(root: &Path) -> DataDirError {
    let mut looked = Vec::new();
    if let Some(p) = credential_file() {
        let why = if p.exists() {
            "blank: the unit's LoadCredential= found no key file"
        } else {
            "not there"
        };
        looked.push(format!("{} ({why})", p.display()));
    }
    looked.push(format!("{} (not there)", key_file(root).display()));
    DataDirError::NoKey {
        root: root.to_owned(),
        key: key_file(root),
        looked: looked.join(" and "),
    }
}

/// What `init` did.
#[derive(Debug)]
pub struct InitReport {
    pub root: PathBuf,
    pub key: KeySource,
    pub created_key: bool,
    pub already_initialised: bool,
}

/// An initialised data dir whose master key has been checked.
pub struct DataDir {
    root: PathBuf,
    /// Replaced when this process rotates the master key (see `master_rotation`).
    master: RwLock<Arc<MasterKey>>,
}

/// A hold on the data dir's keys (see [`DataDir::hold_keys`]); released when dropped.
pub struct KeysHold(#[allow(dead_code)] nix::fcntl::Flock<fs::File>);

impl DataDir {
    /// Creates the data dir and, when no key is given by flag or credential, a new master key
    /// file. Safe to run again: with the same key it changes nothing.
    pub fn init(root: &Path, explicit_key: Option<&Path>) -> Result<InitReport, DataDirError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(io_err(root))?;
        let source = KeySource::resolve(explicit_key, root);
        let check = root.join(CHECK_FILE);
        let already_initialised = check.exists();
        let mut created_key = false;
        let master = match &source {
            // A data dir made under a key that is gone: a new key would open none of it.
            KeySource::DataDir(p) if !p.exists() && already_initialised => {
                return Err(no_key(root))
            }
            KeySource::DataDir(p) if !p.exists() => {
                created_key = true;
                MasterKey::create_file(p)?
            }
            other => MasterKey::load(other.path())?,
        };
        if already_initialised {
            verify(root, &source, &master)?;
        } else {
            write_atomic(&check, &master.check_record()?, 0o600).map_err(io_err(&check))?;
        }
        let tenants = root.join(TENANTS);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tenants)
            .map_err(io_err(&tenants))?;
        Ok(InitReport {
            root: root.to_owned(),
            key: source,
            created_key,
            already_initialised,
        })
    }

    /// Opens an initialised data dir, loading and checking the master key.
    pub fn open(root: &Path, explicit_key: Option<&Path>) -> Result<Self, DataDirError> {
        if !root.join(CHECK_FILE).exists() {
            return Err(DataDirError::NotInitialised(root.to_owned()));
        }
        let source = KeySource::resolve(explicit_key, root);
        if !source.path().exists() && matches!(source, KeySource::DataDir(_)) {
            return Err(no_key(root));
        }
        let given = MasterKey::load(source.path())?;
        let master = match verify(root, &source, &given) {
            Ok(()) => given,
            Err(e) => match committed_next_key(root)? {
                Some(next) => next,
                None => return Err(rotated(root, &source).unwrap_or(e)),
            },
        };
        Ok(Self {
            root: root.to_owned(),
            master: RwLock::new(Arc::new(master)),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn master_key(&self) -> Arc<MasterKey> {
        Arc::clone(&self.master.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// From now on this process wraps and unwraps keys under `key` (a rotation it made).
    pub(crate) fn set_master_key(&self, key: MasterKey) {
        *self.master.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
    }

    /// Holds the data dir's keys shared, for a change that writes a wrapped key or a record
    /// that holds some: a master key rotation (which holds them exclusively) waits for it, and
    /// it for the rotation. Refused when the data dir moved to another master key since this
    /// process opened it: what it would wrap would open under no key.
    pub fn hold_keys(&self) -> Result<KeysHold, DataDirError> {
        let hold = hold_records(&self.root)?;
        let check = self.root.join(CHECK_FILE);
        let record = fs::read(&check).map_err(io_err(&check))?;
        if !self.master_key().matches_check_record(&record) {
            return Err(DataDirError::StaleKey(self.root.clone()));
        }
        Ok(hold)
    }

    /// Holds the data dir's keys alone: no other change of a key or record runs meanwhile,
    /// in this process or any other.
    pub(crate) fn hold_keys_alone(&self) -> Result<KeysHold, DataDirError> {
        lock_keys(&self.root, nix::fcntl::FlockArg::LockExclusive)
    }

    /// The directory holding one directory per tenant.
    pub fn tenants_dir(&self) -> PathBuf {
        tenants_dir(&self.root)
    }
}

/// The tenants directory of a data dir (usable without the key, e.g. for listing).
pub fn tenants_dir(root: &Path) -> PathBuf {
    root.join(TENANTS)
}

/// Holds the keys of the data dir at `root` shared, for a change of a record that holds
/// wrapped keys and wraps none (it copies them as they are): [`DataDir::hold_keys`] without
/// the check of this process's master key.
pub(crate) fn hold_records(root: &Path) -> Result<KeysHold, DataDirError> {
    lock_keys(root, nix::fcntl::FlockArg::LockShared)
}

fn lock_keys(root: &Path, how: nix::fcntl::FlockArg) -> Result<KeysHold, DataDirError> {
    let path = root.join(KEYS_LOCK);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io_err(&path))?;
    nix::fcntl::Flock::lock(file, how)
        .map(KeysHold)
        .map_err(|(_, errno)| io_err(&path)(errno.into()))
}

/// The key a rotation committed to but did not install yet ([`NEXT_KEY_FILE`]), once it is
/// the data dir's key: it replaces `master.key` now (a rotation killed between its commit and
/// that rename), and the rotation's rerun finishes the rest.
fn committed_next_key(root: &Path) -> Result<Option<MasterKey>, DataDirError> {
    let next = root.join(NEXT_KEY_FILE);
    if !next.exists() {
        return Ok(None);
    }
    let key = MasterKey::load(&next)?;
    if verify(root, &KeySource::DataDir(next.clone()), &key).is_err() {
        return Ok(None); // not committed: the old key is the data dir's
    }
    let installed = key_file(root);
    match fs::rename(&next, &installed) {
        // Installed meanwhile, by the rotation or another process opening the data dir.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        r => r.map_err(io_err(&next))?,
    }
    crate::fs_util::sync_dir(root).map_err(io_err(root))?;
    tracing::warn!(
        data_dir = %root.display(),
        "a master key rotation was cut short after its commit: its new key is now {}; run \
         `tenantfs key rotate-master --new-key {}` to finish it",
        installed.display(),
        installed.display()
    );
    Ok(Some(key))
}

/// The error for a key that is not the data dir's because a rotation moved it to another.
fn rotated(root: &Path, source: &KeySource) -> Option<DataDirError> {
    let text = fs::read(root.join(ROTATION_FILE)).ok()?;
    let record: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let committed_to = hex::decode(record["new_check"].as_str()?).ok()?;
    let check = fs::read(root.join(CHECK_FILE)).ok()?;
    if committed_to != check {
        return None; // not committed: the old key is still the data dir's
    }
    Some(DataDirError::Rotated {
        key: source.path().to_owned(),
        root: root.to_owned(),
        new_key: PathBuf::from(record["new_key"].as_str()?),
    })
}

fn verify(root: &Path, source: &KeySource, master: &MasterKey) -> Result<(), DataDirError> {
    let check = root.join(CHECK_FILE);
    let record = fs::read(&check).map_err(io_err(&check))?;
    if master.matches_check_record(&record) {
        Ok(())
    } else {
        Err(DataDirError::WrongKey {
            key: source.path().to_owned(),
            root: root.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_key_message(root: &Path) -> String {
        DataDirError::NoKey {
            root: root.to_owned(),
            key: key_file(root),
            looked: format!("{} (not there)", key_file(root).display()),
        }
        .to_string()
    }

    /// The unit is named only for the data dir it loads the key of; the path to put the key
    /// back at is `key_file` of the data dir, however the data dir was written.
    #[test]
    fn no_key_names_the_unit_only_for_its_data_dir() {
        for default in [DEFAULT_ROOT, "/var/lib/tenantfs/", "/var/lib//tenantfs"] {
            let msg = no_key_message(Path::new(default));
            assert!(
                msg.contains(&format!(
                    "put that key file back at {} (mode 0600; tenantfs.service loads it from \
                     there)",
                    key_file(Path::new(default)).display()
                )),
                "{default}: {msg}"
            );
        }
        let other = Path::new("/srv/tenantfs");
        let msg = no_key_message(other);
        assert!(
            msg.contains("put that key file back at /srv/tenantfs/master.key (mode 0600) or"),
            "{msg}"
        );
        assert!(!msg.contains("tenantfs.service"), "{msg}");
        // A data dir beside the default, not the default.
        let msg = no_key_message(Path::new("/var/lib/tenantfs2"));
        assert!(!msg.contains("tenantfs.service"), "{msg}");
    }
}
