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
//!   So a process opens the lock file once ([`LockFile`], kept in [`OPEN`]) and never a
//!   second time while that copy is open, and nothing else in tenantfs opens it.
//! - Record locks do not exclude within one process: each [`LockFile`] also keeps the offsets
//!   this process holds, and a second hold of one is refused like another process's.
//! - A data dir deleted and made anew (tests do) has a new lock file, perhaps with the old
//!   one's inode number: a copy whose file has no links left is never used again.
//! - The holder of a refused lock is found with `F_GETLK` ([`holder`]), which names its pid.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::fcntl::{fcntl, FcntlArg};

/// The lock file's name in the data dir.
pub const LOCK_FILE: &str = "tenants.locks";

/// Offsets are below 2^62, so `offset + 1` is a valid `off_t`.
const OFFSET_BITS: u32 = 62;

/// The lock files this process has open, one per data dir (and per incarnation of one).
static OPEN: Mutex<Vec<Arc<LockFile>>> = Mutex::new(Vec::new());

/// One copy of a data dir's lock file, and the tenants this process holds in it.
struct LockFile {
    file: File,
    dev: u64,
    ino: u64,
    held: Mutex<HashSet<i64>>,
}

impl LockFile {
    fn held(&self) -> MutexGuard<'_, HashSet<i64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the path still names this copy's file (not deleted, not replaced).
    fn is_current(&self, dev: u64, ino: u64) -> bool {
        self.dev == dev && self.ino == ino && self.file.metadata().is_ok_and(|m| m.nlink() > 0)
    }
}

/// A tenant held by this process; cloned holds share it, and it is released when the last
/// one drops.
#[derive(Clone)]
pub struct TenantLock {
    _held: Arc<Held>,
}

struct Held {
    file: Arc<LockFile>,
    offset: i64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.file.held();
        if let Err(e) = fcntl(
            self.file.file.as_raw_fd(),
            FcntlArg::F_SETLK(&record(libc::F_UNLCK, self.offset)),
        ) {
            // Only a bad descriptor fails here; the lock goes when the process exits.
            tracing::error!(offset = self.offset, error = %e, "cannot release a tenant's lock");
        }
        held.remove(&self.offset);
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
    let file = open(root)?;
    let offset = offset_of(name);
    let mut held = file.held();
    if held.contains(&offset) {
        return Err(LockError::Held);
    }
    match fcntl(
        file.file.as_raw_fd(),
        FcntlArg::F_SETLK(&record(libc::F_WRLCK, offset)),
    ) {
        Ok(_) => {}
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => return Err(LockError::Held),
        Err(e) => return Err(io_error(root, e.into())),
    }
    held.insert(offset);
    drop(held);
    Ok(TenantLock {
        _held: Arc::new(Held { file, offset }),
    })
}

/// The pid of the process that holds tenant `name` (this process's own if it does), or
/// `None` if no process does or the holder cannot be seen (another pid namespace).
pub fn holder(root: &Path, name: &str) -> Option<u32> {
    let file = open(root).ok()?;
    let offset = offset_of(name);
    if file.held().contains(&offset) {
        return Some(std::process::id());
    }
    let mut probe = record(libc::F_WRLCK, offset);
    fcntl(file.file.as_raw_fd(), FcntlArg::F_GETLK(&mut probe)).ok()?;
    (probe.l_type != libc::F_UNLCK as libc::c_short && probe.l_pid > 0)
        .then_some(probe.l_pid as u32)
}

/// This process's copy of the lock file of the data dir at `root`, opened (and created) the
/// first time.
fn open(root: &Path) -> Result<Arc<LockFile>, LockError> {
    let path = root.join(LOCK_FILE);
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    // Copies of files since deleted are dropped from the list (holds keep theirs open).
    open.retain(|f| f.file.metadata().is_ok_and(|m| m.nlink() > 0));
    if let Ok(meta) = std::fs::metadata(&path) {
        if let Some(f) = open.iter().find(|f| f.is_current(meta.dev(), meta.ino())) {
            return Ok(f.clone());
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io_error(root, e))?;
    let meta = file.metadata().map_err(|e| io_error(root, e))?;
    let copy = Arc::new(LockFile {
        file,
        dev: meta.dev(),
        ino: meta.ino(),
        held: Mutex::new(HashSet::new()),
    });
    open.push(copy.clone());
    Ok(copy)
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

    /// Another process sees the lock, and names this one as its holder; it may take the
    /// tenant once this process releases it.
    #[test]
    fn another_process_is_refused_and_told_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path(), "t").unwrap();
        let probe = |name: &str| {
            let script = format!(
                "import fcntl, os, struct, sys\n\
                 f = open({path:?}, 'r+')\n\
                 try:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {offset}); print('free')\n\
                 except OSError:\n    print('held')\n",
                path = dir.path().join(LOCK_FILE).to_str().unwrap(),
                offset = offset_of(name),
            );
            let out = std::process::Command::new("python3")
                .args(["-c", &script])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        };
        assert_eq!(probe("t"), "held");
        assert_eq!(probe("other"), "free");
        drop(held);
        assert_eq!(probe("t"), "free");
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
        let new = lock(&root, "t").unwrap();
        assert!(matches!(lock(&root, "t"), Err(LockError::Held)));
        drop((old, new));
    }
}
