//! Dormant mounts: a mounted tenant's store closes once the mount has been idle a while, and
//! opens again at its next request.
//!
//! An open store is most of what an idle mount costs the daemon: RocksDB's version set,
//! column families, table readers and memtables, and a dozen descriptors. A host mounts many
//! more tenants than are busy at once, so a mount that has answered no request for
//! `[store] close_idle_after` closes its store and keeps only what the kernel's side of the
//! mount needs: the FUSE connection and its lookup counts (in `Operations`), the tenant's lock
//! (no other process may open the store meanwhile) and what `stats` reports of it. The next
//! request opens the store again (a few milliseconds, as a mount does) and is answered as if
//! the store had stayed open: files stay open (the kernel holds no per-file state here: a
//! FUSE file handle is stateless), files unlinked while open stay until the kernel forgets
//! them ([`Opening::Woken`]), and the quota and usage are the store's own, kept at close.
//!
//! Requests take the volume under a read lock; resting takes the write lock only if no
//! request holds it (`try_write`), so a request is never held behind a store that is closing
//! because of it, and a store never closes under a request.

use std::error::Error;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use crate::quota::{Quota, Usage};
use crate::volume::{Volume, VolumeError};

/// Opens the tenant's volume again ([`Opening::Woken`](crate::volume::Opening::Woken)), on
/// the lock the mount kept.
pub type Reopen = Box<dyn Fn() -> Result<Volume, Box<dyn Error + Send + Sync>> + Send + Sync>;

/// What a dormant mount keeps of its closed store.
struct Closed {
    usage: Usage,
    quota: Quota,
    direct_io: bool,
    /// The files unlinked while open, waiting for the kernel's forget: a forget of any other
    /// inode has nothing to free, and need not open the store (the kernel forgets inodes by
    /// the thousand when it drops its caches).
    orphans: Vec<u64>,
}

enum State {
    /// Boxed: a dormant mount keeps only the small variant.
    Awake(Box<Volume>),
    Dormant(Closed),
}

/// The volume a mount serves: open, or closed while the mount is idle.
pub struct ServedVolume {
    tenant: String,
    block_size: u32,
    state: RwLock<State>,
    /// `None`: the store stays open while mounted.
    reopen: Option<Reopen>,
    /// The mount's request count when last looked at, and since when it has not changed.
    quiet: Mutex<(u64, Instant)>,
    rests: AtomicU64,
    wakes: AtomicU64,
}

/// The open volume, held for one request (the store cannot close meanwhile).
pub(crate) struct Awake<'a>(RwLockReadGuard<'a, State>);

impl Deref for Awake<'_> {
    type Target = Volume;
    fn deref(&self) -> &Volume {
        match &*self.0 {
            State::Awake(v) => v,
            State::Dormant(_) => unreachable!("an Awake guard is made only over an open volume"),
        }
    }
}

fn closed(volume: &Volume) -> Result<Closed, VolumeError> {
    Ok(Closed {
        usage: volume.usage(),
        quota: volume.quota(),
        direct_io: volume.tenant().db().direct_io(),
        orphans: volume.orphans()?,
    })
}

impl ServedVolume {
    /// Serves `volume`; with `reopen`, its store may close while idle ([`Self::rest_if_idle`]).
    pub fn new(volume: Volume, reopen: Option<Reopen>) -> Self {
        Self {
            tenant: volume.tenant().info().name.clone(),
            block_size: volume.block_size(),
            state: RwLock::new(State::Awake(Box::new(volume))),
            reopen,
            quiet: Mutex::new((0, Instant::now())),
            rests: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
        }
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The open volume, opening it again first if it rested.
    pub(crate) fn get(&self) -> Result<Awake<'_>, VolumeError> {
        loop {
            let state = self.read();
            if let State::Awake(_) = *state {
                return Ok(Awake(state));
            }
            drop(state);
            self.wake()?;
        }
    }

    /// Opens the store again (once, however many requests ask at the same time).
    fn wake(&self) -> Result<(), VolumeError> {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        let State::Dormant(_) = &*state else {
            return Ok(()); // another request woke it
        };
        let reopen = self
            .reopen
            .as_ref()
            .expect("only a volume with a reopen rests");
        let start = Instant::now();
        let volume = reopen().map_err(|e| {
            tracing::error!(tenant = %self.tenant, error = %e, "cannot open the store of an idle mount again");
            VolumeError::Unwoken {
                tenant: self.tenant.clone(),
                detail: e.to_string(),
            }
        })?;
        *state = State::Awake(Box::new(volume));
        self.wakes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(tenant = %self.tenant, took_us = start.elapsed().as_micros() as u64, "idle mount's store opened again");
        Ok(())
    }

    /// `f` of the open volume, or `None` while the store rests (it is not opened for this).
    pub fn if_awake<R>(&self, f: impl FnOnce(&Volume) -> R) -> Option<R> {
        match &*self.read() {
            State::Awake(v) => Some(f(v)),
            State::Dormant(_) => None,
        }
    }

    /// `f` of the open volume, opening it again first if it rested.
    pub fn woken<R>(&self, f: impl FnOnce(&Volume) -> R) -> Result<R, VolumeError> {
        let volume = self.get()?;
        Ok(f(&volume))
    }

    /// Whether forgetting `ino` may have a file to free, so the store must be open for it
    /// (always while awake; while dormant, only for a file unlinked while open).
    pub(crate) fn forget_needs_store(&self, ino: u64) -> bool {
        match &*self.read() {
            State::Awake(_) => true,
            State::Dormant(c) => c.orphans.contains(&ino),
        }
    }

    /// Whether the store is closed while the mount stays.
    pub fn is_dormant(&self) -> bool {
        matches!(*self.read(), State::Dormant(_))
    }

    /// What the tenant's files take (kept at close while dormant).
    pub fn usage(&self) -> Usage {
        match &*self.read() {
            State::Awake(v) => v.usage(),
            State::Dormant(c) => c.usage,
        }
    }

    /// The tenant's quota.
    pub fn quota(&self) -> Quota {
        match &*self.read() {
            State::Awake(v) => v.quota(),
            State::Dormant(c) => c.quota,
        }
    }

    /// Whether the store reads and writes with O_DIRECT.
    pub fn direct_io(&self) -> bool {
        match &*self.read() {
            State::Awake(v) => v.tenant().db().direct_io(),
            State::Dormant(c) => c.direct_io,
        }
    }

    /// How many times the store closed while idle, and opened again.
    pub fn rests_and_wakes(&self) -> (u64, u64) {
        (
            self.rests.load(Ordering::Relaxed),
            self.wakes.load(Ordering::Relaxed),
        )
    }

    /// Closes the store if the mount's request count (`requests`) has not changed for
    /// `after` and no request holds the volume. Says whether it closed now.
    pub fn rest_if_idle(&self, requests: u64, after: Duration) -> bool {
        if self.reopen.is_none() {
            return false;
        }
        {
            let mut quiet = self.quiet.lock().unwrap_or_else(|p| p.into_inner());
            if quiet.0 != requests {
                *quiet = (requests, Instant::now());
                return false;
            }
            if quiet.1.elapsed() < after {
                return false;
            }
        }
        // A request holding the volume, or one waking it, keeps it as it is.
        let Ok(mut state) = self.state.try_write() else {
            return false;
        };
        let State::Awake(v) = &*state else {
            return false;
        };
        let rested = match closed(v) {
            Ok(c) => State::Dormant(c),
            Err(e) => {
                tracing::warn!(tenant = %self.tenant, error = %e, "an idle mount's store stays open");
                return false;
            }
        };
        let State::Awake(volume) = std::mem::replace(&mut *state, rested) else {
            unreachable!("checked above under the same lock");
        };
        let start = Instant::now();
        // Closing stops the volume's jobs, keeps its usage and syncs the store; requests that
        // come meanwhile wait for the lock, then open it again.
        drop(volume);
        drop(state);
        self.rests.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(tenant = %self.tenant, took_us = start.elapsed().as_micros() as u64, "idle mount's store closed");
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::volume::{FileKind, Owner, TestStore, ROOT_INO};

    const OWNER: Owner = Owner { uid: 0, gid: 0 };

    /// The test tenant's volume, served with a reopen on its lock.
    fn served(store: &Arc<TestStore>) -> ServedVolume {
        let tenant = store.open_tenant();
        let (lock, again) = (tenant.lock(), store.clone());
        let reopen: Reopen = Box::new(move || Ok(again.open_woken(lock.clone())?));
        ServedVolume::new(Volume::open(tenant).unwrap(), Some(reopen))
    }

    #[test]
    fn an_idle_store_closes_keeps_its_lock_and_opens_again_at_the_next_request() {
        let store = Arc::new(TestStore::new());
        let served = served(&store);
        let f = served
            .woken(|v| v.mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0))
            .unwrap()
            .unwrap();
        served
            .woken(|v| v.write(f.ino, 0, b"kept"))
            .unwrap()
            .unwrap();
        let usage = served.usage();

        // Requests seen since the last look: not idle yet.
        assert!(!served.rest_if_idle(7, Duration::ZERO));
        assert!(!served.is_dormant());
        // A request holds the volume: it stays open.
        let held = served.get().unwrap();
        assert!(!served.rest_if_idle(7, Duration::ZERO));
        drop(held);
        assert!(served.rest_if_idle(7, Duration::ZERO));
        assert!(served.is_dormant());
        assert_eq!(served.if_awake(|_| ()), None);
        assert_eq!(served.usage(), usage);
        // The tenant stays this process's: nothing else opens its store meanwhile.
        assert!(matches!(
            crate::tenants::open(store.data_dir(), store.store_host(), "t"),
            Err(crate::tenants::TenantError::InUse(_))
        ));

        let read = served.woken(|v| v.read(f.ino, 0, 10)).unwrap().unwrap();
        assert_eq!(read, b"kept");
        assert!(!served.is_dormant());
        assert_eq!(served.rests_and_wakes(), (1, 1));
        assert_eq!(served.usage(), usage);
    }

    #[test]
    fn a_file_unlinked_while_open_outlives_a_rest_until_the_kernel_forgets_it() {
        let store = Arc::new(TestStore::new());
        let served = served(&store);
        let f = served
            .woken(|v| {
                let f = v.mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)?;
                v.write(f.ino, 0, b"still open")?;
                v.unlink(ROOT_INO, b"f")?;
                Ok::<_, VolumeError>(f)
            })
            .unwrap()
            .unwrap();
        assert!(served.rest_if_idle(0, Duration::ZERO));
        // Forgetting anything else has nothing to free: the store stays closed for it.
        assert!(!served.forget_needs_store(ROOT_INO));
        assert!(served.forget_needs_store(f.ino));
        let read = served.woken(|v| v.read(f.ino, 0, 20)).unwrap().unwrap();
        assert_eq!(read, b"still open");
        served.woken(|v| v.forget(f.ino)).unwrap().unwrap();
        let gone = served.woken(|v| v.getattr(f.ino)).unwrap();
        assert!(matches!(gone, Err(VolumeError::NotFound)));
    }

    #[test]
    fn requests_beside_rests_all_find_the_volume_open() {
        let store = Arc::new(TestStore::new());
        let served = Arc::new(served(&store));
        let f = served
            .woken(|v| v.mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0))
            .unwrap()
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..3u8)
            .map(|i| {
                let (served, stop) = (served.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let at = u64::from(i) * 4096;
                        served
                            .woken(|v| v.write(f.ino, at, &[i; 16]))
                            .unwrap()
                            .unwrap();
                        let back = served.woken(|v| v.read(f.ino, at, 16)).unwrap().unwrap();
                        assert_eq!(back, [i; 16]);
                        n += 1;
                        // Gaps between requests, for rests to fall into.
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    n
                })
            })
            .collect();
        let start = Instant::now();
        while served.rests_and_wakes().1 < 20 && start.elapsed() < Duration::from_secs(30) {
            served.rest_if_idle(0, Duration::ZERO);
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        let done: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let (rests, wakes) = served.rests_and_wakes();
        assert!(rests >= 20 && wakes >= 20, "rests {rests}, wakes {wakes}");
        assert!(done > 0);
    }
}
