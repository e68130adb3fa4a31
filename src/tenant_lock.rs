//! A tenant's lock: the process that has a tenant's store open (mounted, attached, or open in
//! a command) holds it, so no other process opens, deletes or changes that tenant meanwhile.
//!
//! Why one file for all tenants: a mount whose idle store is closed (a dormant mount) still
//! holds its tenant, and a host of 10,000 such mounts has no descriptor to spare for each. So
//! every tenant of a data dir is locked in one file, `<data-dir>/tenants.locks`: a one-byte
//! POSIX record lock (`fcntl(F_SETLK)`) at an offset taken from the tenant's name
//! ([`offset_of`]), which the kernel releases when the holder exits, killed or not. The name's
//! 62-bit hash stands for the tenant: two names that shared one would only refuse each other.
//!
//! How it fails, and what guards against it:
//! - A process's record locks on a file all go when it closes *any* descriptor of that file.
//!   So a process keeps one copy of the lock file open per data dir ([`DataDirLocks`], found
//!   by the data dir's inode, whatever path names it), opens it again only once the path
//!   names another file, and nothing else in tenantfs opens it.
//! - Record locks do not exclude within one process: each data dir's state also keeps the
//!   offsets this process holds, and a second hold of one is refused like another process's.
//! - The lock file deleted or replaced while tenants are held (an operator's `rm`): the next
//!   lock or look-up opens the new file and takes every held tenant in it again, so other
//!   processes see them from then on.
//! - The holder of a refused lock is found with `F_GETLK` ([`holder`]), which names its pid.
//! - A process of a build from before this file held `tenants/<name>/tenant.lock` by flock:
//!   while that file exists, [`lock`] also checks that no such process holds it.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::fcntl::{fcntl, FcntlArg};

/// The lock file's name in the data dir.
pub const LOCK_FILE: &str = "tenants.locks";

/// Offsets are below 2^62, so `offset + 1` is a valid `off_t`.
const OFFSET_BITS: u32 = 62;

/// The data dirs this process has locked tenants in, by the data dir's device and inode.
static DATA_DIRS: Mutex<Vec<Arc<DataDirLocks>>> = Mutex::new(Vec::new());

/// A data dir's lock file as this process has it open, and the tenants it holds there.
struct DataDirLocks {
    dev: u64,
    ino: u64,
    state: Mutex<Option<Copy>>,
}

/// One open copy of the lock file: its device and inode, and the offsets held in it.
struct Copy {
    file: File,
    dev: u64,
    ino: u64,
    held: HashSet<i64>,
}

impl DataDirLocks {
    /// Whether its lock file is deleted and no tenant is held in it.
    fn is_gone(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .as_ref()
            .is_some_and(|c| c.held.is_empty() && c.file.metadata().is_ok_and(|m| m.nlink() == 0))
    }

    /// The state with the copy of the file `root`'s lock file names now: opened the first
    /// time, opened anew (every held tenant locked in it again) once the path names another
    /// file.
    fn current(&self, root: &Path) -> Result<MutexGuard<'_, Option<Copy>>, LockError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let path = root.join(LOCK_FILE);
        let named = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
        if let (Some(c), Some(id)) = (state.as_ref(), named) {
            if (c.dev, c.ino) == id && c.file.metadata().is_ok_and(|m| m.nlink() > 0) {
                return Ok(state);
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error(root, e))?;
        let meta = file.metadata().map_err(|e| io_error(root, e))?;
        let held = state.take().map(|old| old.held).unwrap_or_default();
        if !held.is_empty() {
            tracing::warn!(
                path = %path.display(),
                tenants = held.len(),
                "the tenants' lock file was replaced; taking the held tenants' locks in it again"
            );
        }
        for &offset in &held {
            if let Err(e) = fcntl(
                file.as_raw_fd(),
                FcntlArg::F_SETLK(&record(libc::F_WRLCK, offset)),
            ) {
                tracing::error!(offset, error = %e, "cannot take a held tenant's lock again");
            }
        }
        *state = Some(Copy {
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            held,
        });
        Ok(state)
    }
}

/// A tenant held by this process; cloned holds share it, and it is released when the last
/// one drops.
#[derive(Clone)]
pub struct TenantLock {
    _held: Arc<Held>,
}

struct Held {
    dir: Arc<DataDirLocks>,
    offset: i64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut state = self.dir.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(copy) = state.as_mut() else { return };
        let unlock = record(libc::F_UNLCK, self.offset);
        if let Err(e) = fcntl(copy.file.as_raw_fd(), FcntlArg::F_SETLK(&unlock)) {
            // Only a bad descriptor fails here; the lock goes when the process exits.
            tracing::error!(offset = self.offset, error = %e, "cannot release a tenant's lock");
        }
        copy.held.remove(&self.offset);
    }
}

/// Why a tenant could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("held by another holder")]
    Held,
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

/// Where tenant `name` is locked in its data dir's lock file.
pub fn offset_of(name: &str) -> i64 {
    let hash = twox_hash::XxHash3_64::oneshot(name.as_bytes());
    (hash >> (64 - OFFSET_BITS)) as i64
}

/// Takes tenant `name` of the data dir at `root` for this process, without waiting.
pub fn lock(root: &Path, name: &str) -> Result<TenantLock, LockError> {
    let dir = data_dir(root)?;
    let offset = offset_of(name);
    let mut state = dir.current(root)?;
    let copy = state.as_mut().expect("current() leaves a copy");
    if copy.held.contains(&offset) || legacy_lock_held(root, name) {
        return Err(LockError::Held);
    }
    let want = record(libc::F_WRLCK, offset);
    match fcntl(copy.file.as_raw_fd(), FcntlArg::F_SETLK(&want)) {
        Ok(_) => {}
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => return Err(LockError::Held),
        Err(e) => return Err(io_error(root, e.into())),
    }
    copy.held.insert(offset);
    drop(state);
    Ok(TenantLock {
        _held: Arc::new(Held { dir, offset }),
    })
}

/// The pid of the process that holds tenant `name` (this process's own if it does), or
/// `None` if no process does or the holder cannot be seen (another pid namespace).
pub fn holder(root: &Path, name: &str) -> Option<u32> {
    let dir = data_dir(root).ok()?;
    let offset = offset_of(name);
    let state = dir.current(root).ok()?;
    let copy = state.as_ref()?;
    if copy.held.contains(&offset) {
        return Some(std::process::id());
    }
    let mut probe = record(libc::F_WRLCK, offset);
    fcntl(copy.file.as_raw_fd(), FcntlArg::F_GETLK(&mut probe)).ok()?;
    (probe.l_type != libc::F_UNLCK as libc::c_short && probe.l_pid > 0)
        .then_some(probe.l_pid as u32)
}

/// This process's locks in the data dir at `root`.
fn data_dir(root: &Path) -> Result<Arc<DataDirLocks>, LockError> {
    let meta = std::fs::metadata(root).map_err(|e| io_error(root, e))?;
    let mut dirs = DATA_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    // Data dirs deleted since (tests make many) hold nothing: their copies close.
    dirs.retain(|d| !d.is_gone());
    if let Some(d) = dirs
        .iter()
        .find(|d| (d.dev, d.ino) == (meta.dev(), meta.ino()))
    {
        return Ok(d.clone());
    }
    let dir = Arc::new(DataDirLocks {
        dev: meta.dev(),
        ino: meta.ino(),
        state: Mutex::new(None),
    });
    dirs.push(dir.clone());
    Ok(dir)
}

/// Whether a process of an older build holds tenant `name` by its flock on
/// `tenants/<name>/tenant.lock` (tried and released at once; no file, no holder).
fn legacy_lock_held(root: &Path, name: &str) -> bool {
    let path = root.join("tenants").join(name).join("tenant.lock");
    let Ok(file) = OpenOptions::new().write(true).open(path) else {
        return false;
    };
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
}

/// A one-byte record of the lock file at `offset`, of lock type `kind`.
fn record(kind: libc::c_int, offset: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: offset,
        l_len: 1,
        l_pid: 0,
    }
}

fn io_error(root: &Path, source: io::Error) -> LockError {
    LockError::Io {
        path: root.join(LOCK_FILE).display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_stable_and_in_range() {
        // The offset is part of how processes of different builds exclude each other.
        assert_eq!(offset_of("t"), offset_of("t"));
        assert_ne!(offset_of("t"), offset_of("u"));
        for name in ["a", "tenant-1", &"x".repeat(64)] {
            let o = offset_of(name);
            assert!((0..1 << OFFSET_BITS).contains(&o), "{name}: {o}");
        }
    }

    #[test]
    fn one_hold_per_process_until_the_last_clone_drops() {
        let dir = tempfile::tempdir().unwrap();
        let a = lock(dir.path(), "a").unwrap();
        assert!(matches!(lock(dir.path(), "a"), Err(LockError::Held)));
        let b = lock(dir.path(), "b").unwrap();
        assert_eq!(holder(dir.path(), "a"), Some(std::process::id()));
        let again = a.clone();
        drop(a);
        assert!(matches!(lock(dir.path(), "a"), Err(LockError::Held)));
        drop(again);
        assert_eq!(holder(dir.path(), "a"), None);
        let a = lock(dir.path(), "a").unwrap();
        drop((a, b));
    }

    /// Another process sees the lock; it may take the tenant once this process releases it.
    #[test]
    fn another_process_is_refused_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path(), "t").unwrap();
        let path = dir.path().join(LOCK_FILE);
        assert_eq!(python_probe(&path, "t"), "held");
        assert_eq!(python_probe(&path, "other"), "free");
        drop(held);
        assert_eq!(python_probe(&path, "t"), "free");
    }

    /// A data dir made anew at the same path gets a new lock file, not the old copy.
    #[test]
    fn a_data_dir_made_anew_is_locked_in_its_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir(&root).unwrap();
        let old = lock(&root, "t").unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::create_dir(&root).unwrap();
        // (The new directory may reuse the old one's inode: the old hold then stays until it
        // drops.)
        let new = lock(&root, "u").unwrap();
        assert!(matches!(lock(&root, "u"), Err(LockError::Held)));
        assert!(root.join(LOCK_FILE).exists());
        drop((old, new));
        lock(&root, "t").unwrap();
    }

    /// The lock file removed under held tenants: the next lock takes them again in the new
    /// file, so another process sees them held; the file is the owner's alone.
    #[test]
    fn a_replaced_lock_file_gets_the_held_tenants_again() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path(), "t").unwrap();
        let path = dir.path().join(LOCK_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_file(&path).unwrap();
        let other = lock(dir.path(), "u").unwrap();
        assert_eq!(python_probe(&path, "t"), "held");
        assert_eq!(python_probe(&path, "u"), "held");
        drop(held);
        assert_eq!(python_probe(&path, "t"), "free");
        drop(other);
    }

    /// A tenant an older build holds by its flock is not taken.
    #[test]
    fn a_legacy_flock_holder_is_respected() {
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("tenants").join("t");
        std::fs::create_dir_all(&tdir).unwrap();
        let file = File::create(tdir.join("tenant.lock")).unwrap();
        let flock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        assert!(matches!(lock(dir.path(), "t"), Err(LockError::Held)));
        drop(flock);
        lock(dir.path(), "t").unwrap();
    }

    /// "held" or "free": what another process finds at `name`'s offset of lock file `path`.
    fn python_probe(path: &Path, name: &str) -> String {
        let script = format!(
            "import fcntl\n\
             f = open({path:?}, 'r+')\n\
             try:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {offset}); print('free')\n\
             except OSError:\n    print('held')\n",
            path = path.to_str().unwrap(),
            offset = offset_of(name),
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}
