//! Dormant mounts: a mounted tenant's store closes once the mount has been idle a while, and
//! opens again at its next request.
//!
//! An open store is most of what an idle mount costs the daemon: RocksDB's version set,
//! column families, table readers and memtables, and a dozen descriptors. A host mounts many
//! more tenants than are busy at once, so a mount that has answered no request for
//! `[store] close_idle_after_secs` closes its store (the rest) and keeps only what the
//! kernel's side of the mount needs: the FUSE connection and its lookup counts (in
//! `Operations`), the tenant's lock (no other process may open the store meanwhile), and what
//! `stats`, `statfs` and the host's reserve need of it. The next request opens the store again
//! (the wake: a few milliseconds, as a mount) and is answered as if the store had stayed open:
//! files stay open (a FUSE file handle is stateless here), files unlinked while open stay until
//! the kernel forgets them ([`Opening::Woken`](crate::volume::Opening::Woken)), inode numbers
//! go on from where they were, and the quota and usage are the store's own, kept at close.
//!
//! Only a writable store with no background work queued or running rests. STATFS does not
//! count as use (monitoring asks every mount) and is answered while dormant.
//!
//! Requests take the volume under a read lock; a rest takes the write lock only if no
//! request holds it (`try_write`), so a request is never held behind a store that is closing
//! because of it, and a store never closes under a request.

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use crate::quota::{Quota, Usage};
use crate::store::{BackgroundSink, ExtentLineage, StoreState};
use crate::volume::{StatFs, Volume, VolumeError};

/// Opens the tenant's volume again ([`Opening::Woken`](crate::volume::Opening::Woken)), on
/// the lock the mount kept.
pub type Reopen = Box<dyn Fn() -> Result<Volume, VolumeError> + Send + Sync>;

/// After a wake fails, requests fail at once for this long instead of each trying again.
const RETRY_WAKE_AFTER: Duration = Duration::from_secs(1);

/// Stores of idle mounts opened again by a request, in this process.
static WAKES: AtomicU64 = AtomicU64::new(0);

/// How many idle mounts' stores requests have opened again in this process.
pub fn wakes() -> u64 {
    WAKES.load(Ordering::Relaxed)
}

/// What a dormant mount keeps of its closed store.
struct Closed {
    usage: Usage,
    quota: Quota,
    direct_io: bool,
    /// The store's directory, for statfs.
    path: PathBuf,
    next_ino: u64,
    /// Its extent files' cache keys and next number: the pieces cached before the rest are
    /// found again after the wake.
    extents: ExtentLineage,
    /// The files unlinked while open, waiting for the kernel's forget: a forget of any other
    /// inode has nothing to free, and need not open the store (the kernel forgets inodes by
    /// the thousand when it drops its caches).
    orphans: Vec<u64>,
    /// What the host's reserve counts the tenant to hold (see `space`): kept so that it
    /// still counts among the largest tenants while dormant.
    _space_hold: Arc<AtomicU64>,
}

enum State {
    /// Boxed: a dormant mount keeps only the small variant.
    Awake(Box<Volume>),
    Dormant(Closed),
}

/// The last failed wake: when, and what it said.
struct WakeFailure {
    at: Instant,
    detail: String,
    no_space: bool,
}

/// The volume a mount serves: open, or closed while the mount is idle.
pub struct ServedVolume {
    tenant: String,
    block_size: u32,
    state: RwLock<State>,
    /// `None`: the store stays open while mounted.
    reopen: Option<Reopen>,
    /// The mount's use (requests less STATFS) when last looked at, and since when it has not
    /// changed.
    quiet: Mutex<(u64, Instant)>,
    statfs_calls: AtomicU64,
    failed_wake: Mutex<Option<WakeFailure>>,
    rests: AtomicU64,
    wakes: AtomicU64,
    /// Where each store opened for the mount reports its background work.
    background: std::sync::OnceLock<BackgroundSink>,
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

/// What `volume` keeps when it rests, or why it does not rest now.
fn closed(volume: &Volume) -> Result<Closed, String> {
    let db = volume.tenant().db();
    if db.state() != StoreState::Writable {
        // Opening it again may need the room it lacks: it stays open, serving reads.
        return Err("its store does not take writes".into());
    }
    if volume.has_background_work() {
        return Err("background work is queued or runs".into());
    }
    Ok(Closed {
        usage: volume.usage(),
        quota: volume.quota(),
        direct_io: db.direct_io(),
        path: db.path().to_owned(),
        next_ino: volume.next_ino(),
        extents: db.extent_files().lineage(),
        orphans: volume.orphans().map_err(|e| e.to_string())?,
        _space_hold: volume.space_hold(),
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
            statfs_calls: AtomicU64::new(0),
            failed_wake: Mutex::new(None),
            rests: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            background: std::sync::OnceLock::new(),
        }
    }

    /// From now on, the store reports its background work to `sink`, and so does each store
    /// opened again after a rest (once; later calls are ignored).
    pub(crate) fn set_background_sink(&self, sink: BackgroundSink) {
        if self.background.set(sink.clone()).is_err() {
            return;
        }
        if let State::Awake(v) = &*self.read() {
            v.tenant().db().background().set_sink(sink);
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
        // Opening takes milliseconds: the ring's crew serves other tenants meanwhile.
        crate::serving::will_wait();
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        let State::Dormant(closed) = &*state else {
            return Ok(()); // another request woke it
        };
        let mut failed = self.failed_wake.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = failed
            .as_ref()
            .filter(|f| f.at.elapsed() < RETRY_WAKE_AFTER)
        {
            return Err(VolumeError::Unwoken {
                tenant: self.tenant.clone(),
                detail: f.detail.clone(),
                no_space: f.no_space,
            });
        }
        let reopen = self
            .reopen
            .as_ref()
            .expect("only a volume with a reopen rests");
        let start = Instant::now();
        let volume = match reopen() {
            Ok(v) => v,
            Err(e) => {
                let no_space = e.errno() == libc::ENOSPC;
                // Logged once per run of failures, then each retry quietly.
                if failed.is_none() {
                    tracing::error!(tenant = %self.tenant, error = %e, "cannot open the store of an idle mount again; requests fail until it opens (tried again each second)");
                } else {
                    tracing::debug!(tenant = %self.tenant, error = %e, "the store of an idle mount still does not open");
                }
                *failed = Some(WakeFailure {
                    at: Instant::now(),
                    detail: e.to_string(),
                    no_space,
                });
                return Err(e);
            }
        };
        if failed.take().is_some() {
            tracing::info!(tenant = %self.tenant, "the store of an idle mount opened again");
        }
        volume.give_inodes_from(closed.next_ino);
        volume
            .tenant()
            .db()
            .extent_files()
            .go_on_from(closed.extents);
        if let Some(sink) = self.background.get() {
            volume.tenant().db().background().set_sink(sink.clone());
        }
        *state = State::Awake(Box::new(volume));
        // The next rest is a whole idle time away, whatever woke it (a forget, a quota).
        self.quiet.lock().unwrap_or_else(|p| p.into_inner()).1 = Instant::now();
        self.wakes.fetch_add(1, Ordering::Relaxed);
        WAKES.fetch_add(1, Ordering::Relaxed);
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

    /// The filesystem's numbers for statfs(2), from the closed store's while dormant (not a
    /// use of the mount: it does not keep the store open).
    pub(crate) fn statfs(&self) -> Result<StatFs, VolumeError> {
        self.statfs_calls.fetch_add(1, Ordering::Relaxed);
        match &*self.read() {
            State::Awake(v) => v.statfs(),
            State::Dormant(c) => {
                let (free, total) = crate::store::disk_space_at(&self.tenant, &c.path)?;
                Ok(crate::volume::statfs_of(
                    c.quota,
                    c.usage,
                    u64::from(self.block_size),
                    free,
                    total,
                ))
            }
        }
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

    /// Closes the store if the mount's use (`requests` answered, less STATFS) has not changed
    /// for `after`, no request holds the volume, the store takes writes and no background
    /// work is queued or runs. Says whether it closed now.
    pub fn rest_if_idle(&self, requests: u64, after: Duration) -> bool {
        if self.reopen.is_none() {
            return false;
        }
        let used = requests.wrapping_sub(self.statfs_calls.load(Ordering::Relaxed));
        {
            let mut quiet = self.quiet.lock().unwrap_or_else(|p| p.into_inner());
            if quiet.0 != used {
                *quiet = (used, Instant::now());
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
            Err(why) => {
                tracing::debug!(tenant = %self.tenant, why, "an idle mount's store stays open");
                return false;
            }
        };
        let State::Awake(volume) = std::mem::replace(&mut *state, rested) else {
            unreachable!("checked above under the same lock");
        };
        let start = Instant::now();
        // Closing stops the volume's jobs (none runs), keeps its usage and syncs the store;
        // requests that come meanwhile wait for the lock, then open it again.
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
        let reopen: Reopen = Box::new(move || again.open_woken(lock.clone()));
        ServedVolume::new(Volume::open(tenant).unwrap(), Some(reopen))
    }

    /// A file `name` in the root holding `data`, written through `served`.
    fn file(served: &ServedVolume, name: &[u8], data: &[u8]) -> crate::volume::Attr {
        served
            .woken(|v| {
                let f = v.mknod(ROOT_INO, name, FileKind::File, 0o644, OWNER, 0)?;
                v.write(f.ino, 0, data)?;
                Ok::<_, VolumeError>(f)
            })
            .unwrap()
            .unwrap()
    }

    #[test]
    fn an_idle_store_closes_keeps_its_lock_and_opens_again_at_the_next_request() {
        let store = Arc::new(TestStore::new());
        let served = served(&store);
        let f = file(&served, b"f", b"kept");
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
    fn statfs_is_answered_while_dormant_and_does_not_keep_the_store_open() {
        let store = Arc::new(TestStore::new());
        let served = served(&store);
        let _f = file(&served, b"f", &[1; 10_000]);
        let awake = served.statfs().unwrap();
        // Three requests answered, all of them STATFS: no use since the first look.
        assert!(!served.rest_if_idle(10, Duration::ZERO));
        served.statfs().unwrap();
        served.statfs().unwrap();
        assert!(served.rest_if_idle(12, Duration::ZERO));
        let dormant = served.statfs().unwrap();
        assert!(served.is_dormant());
        assert_eq!(
            (
                dormant.blocks_free.abs_diff(awake.blocks_free) < 1024,
                dormant.files_free
            ),
            (true, awake.files_free)
        );
        assert_eq!(
            (dormant.block_size, dormant.files),
            (awake.block_size, awake.files)
        );
    }

    #[test]
    fn inode_numbers_go_on_from_where_they_were_after_a_wake() {
        let store = Arc::new(TestStore::new());
        let served = served(&store);
        let mk = |name: &[u8]| {
            served
                .woken(|v| v.mknod(ROOT_INO, name, FileKind::File, 0o644, OWNER, 0))
                .unwrap()
                .unwrap()
                .ino
        };
        let (a, b) = (mk(b"a"), mk(b"b"));
        // The newest file is removed and freed: its number is the store's highest no more.
        served
            .woken(|v| {
                v.unlink(ROOT_INO, b"b")?;
                v.forget(b)
            })
            .unwrap()
            .unwrap();
        assert!(served.rest_if_idle(0, Duration::ZERO));
        let c = mk(b"c");
        assert!(c > b && b > a, "{a} {b} {c}");
    }

    #[test]
    fn extent_pieces_cached_before_a_rest_are_found_after_the_wake() {
        let store = Arc::new(TestStore::with_cache(64 << 20));
        let served = served(&store);
        let data = crate::volume::noise(1 << 20, 7);
        let f = served
            .woken(|v| {
                let f = v.mknod(ROOT_INO, b"big", FileKind::File, 0o644, OWNER, 0)?;
                v.write(f.ino, 0, &data)?; // bulk: into an extent file
                v.fsync()?;
                Ok::<_, VolumeError>(f)
            })
            .unwrap()
            .unwrap();
        let read_all = || {
            (0..16u64)
                .map(|i| {
                    let at = i * (64 << 10);
                    served
                        .woken(|v| v.read(f.ino, at, 64 << 10))
                        .unwrap()
                        .unwrap()
                })
                .collect::<Vec<_>>()
                .concat()
        };
        assert_eq!(read_all(), data);
        let misses = crate::cache::thread_misses();
        assert_eq!(read_all(), data);
        assert_eq!(
            crate::cache::thread_misses(),
            misses,
            "not cached before the rest"
        );
        assert!(served.rest_if_idle(0, Duration::ZERO));
        served.woken(|v| v.getattr(f.ino)).unwrap().unwrap(); // the wake
        let misses = crate::cache::thread_misses();
        assert_eq!(read_all(), data);
        let missed = crate::cache::thread_misses() - misses;
        assert_eq!(missed, 0, "{missed} lookups missed after the wake");
    }

    #[test]
    fn a_dormant_tenant_still_counts_among_the_largest_for_the_reserve() {
        use crate::space::{HostSpace, Reserve};
        use std::sync::atomic::AtomicU64;
        let store = Arc::new(TestStore::new());
        let st = nix::sys::statvfs::statvfs(store.root()).unwrap();
        let free = st.blocks_available() * st.fragment_size();
        // Free space between half the reserve and the reserve: the largest tenant grows no
        // more, the others still do.
        let space = HostSpace::new(store.root(), Reserve::Bytes(free / 3 * 4));
        let tenant = store.open_tenant();
        let (lock, again, on) = (tenant.lock(), store.clone(), space.clone());
        let reopen: Reopen =
            Box::new(move || Ok(again.open_woken(lock.clone())?.with_space(on.clone())));
        let volume = Volume::open(tenant).unwrap().with_space(space.clone());
        let served = ServedVolume::new(volume, Some(reopen));
        // Another tenant, larger for now: t may grow.
        let other = Arc::new(AtomicU64::new(1 << 30));
        space.hold(&other);
        served
            .woken(|v| {
                let f = v.mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)?;
                v.write(f.ino, 0, &[7; 64 << 10])
            })
            .unwrap()
            .unwrap();
        // Now t holds the most, and rests.
        other.store(4096, Ordering::Release);
        assert!(served.rest_if_idle(0, Duration::ZERO));
        assert!(
            space.admit(&other, 4096, 0).is_ok(),
            "the smaller tenant was refused: the dormant one no longer counted"
        );
        // Awake again, t is still the one refused.
        let grown = served
            .woken(|v| {
                let g = v.mknod(ROOT_INO, b"g", FileKind::File, 0o644, OWNER, 0)?;
                v.write(g.ino, 0, &[7; 4096])
            })
            .unwrap();
        assert!(grown.is_err(), "{grown:?}");
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
