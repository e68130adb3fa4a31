//! Blob garbage collection where the garbage warrants it.
//!
//! File data lives in blob files, written once at flush. An overwritten or deleted value
//! becomes garbage in its blob file, and a blob file that is all garbage is deleted by RocksDB
//! as soon as no SST refers to it: a file overwritten whole gives its space back with no
//! copying. Garbage in blob files that still hold live values (random overwrites, the chunks a
//! fold rewrote) stays until those values are moved out. RocksDB's own blob GC moves them
//! during every compaction that meets their keys, which a streaming overwrite does all the
//! time, copying values about to be overwritten (measured: 409-598 MiB/s for a second 1 GiB
//! pass against 808-885 without it, see `store::host`). So it is off, and a volume collects
//! itself: at most every [`CHECK_EVERY`], on a read, a write or a sync, it looks at its blob
//! files' garbage (which compaction counts, after the writes that made it), and when that is
//! at least [`MIN_GARBAGE`] and 45% of their bytes it compacts the extents family with blob GC
//! forced on a thread of its own (one at a time). Moving the live values then costs at most
//! 1.25 bytes written per byte of space it gives back. (One rewrite of a fraction f of a file
//! leaves f/(1+f) of the bytes garbage, 45% only past f = 0.82, and the blob files it empties
//! whole are deleted without any of this: deletes and repeated rewrites are what get there.)
//! Measured after 20 s of 4 KiB random writes over a 1 GiB file and their folds: 2.9 GB of
//! blob files, 1.6 GB of them garbage, collected in 5 s to 1.1 GB. A collection is a full
//! compaction of the file data's keys: reads meanwhile share the disk and the CPU with it.
//!
//! Extent files (format 4) are collected on the same thread (`extent_gc`): after each extent
//! file is closed, and every [`EXTENT_CHECK_EVERY`] when none is.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::extent_gc::{collect_extent_files, Occasion};
use super::locks::InodeLocks;
use crate::store::BlobSpace;
use crate::tenants::Tenant;

/// How often a busy volume looks at its garbage (two property reads).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(10);
/// Garbage below this is left alone, whatever its share.
pub(crate) const MIN_GARBAGE: u64 = 256 << 20;
/// Extent garbage is collected once it is this many times [`MIN_GARBAGE`] (1 GiB): each
/// collection flushes the memtables and frees whole files, which stalls a streaming writer for
/// a few milliseconds; measured on a 20 s overwrite of a 1 GiB file, collecting after every
/// closed file took the write p99 from 1.5 ms to 8.8 ms.
const EXTENT_GARBAGE_FACTOR: u64 = 4;
/// How often a busy volume with extent files walks their chunk values when no file was closed
/// (folds and random overwrites leave garbage without closing one), and how long the open file
/// must go without an append to be closed then. A walk reads the extents family's inline
/// values: about 20 ms per GiB of bulk data.
const EXTENT_CHECK_EVERY: Duration = Duration::from_secs(60);

/// One volume's collector.
pub(crate) struct BlobGc {
    /// The volume's inode locks (a chunk is moved under its file's).
    locks: Arc<InodeLocks>,
    /// Milliseconds after `start` before which no look is due.
    next_check_ms: AtomicU64,
    /// The same for a walk of the extent files' chunks when none was closed.
    next_extent_check_ms: AtomicU64,
    start: Instant,
    running: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
    /// Collections started so far.
    started: AtomicU64,
    worker: Mutex<Option<JoinHandle<()>>>,
    policy: Mutex<Policy>,
    /// Extent files closed as of the last extent collection started.
    extent_files_seen: Arc<AtomicU64>,
}

/// Whether a look kept in `next_ms` is due at `now_ms`; if so, the caller takes it (the next
/// one is due `every` later) and no other caller does.
fn take_due(next_ms: &AtomicU64, now_ms: u64, every: Duration) -> bool {
    let due = next_ms.load(Ordering::Relaxed);
    now_ms >= due
        && next_ms
            .compare_exchange(
                due,
                now_ms + every.as_millis() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// When to look and what to collect.
#[derive(Clone, Copy)]
struct Policy {
    every: Duration,
    extent_every: Duration,
    min_garbage: u64,
}

/// Whether `space` holds enough garbage to collect: at least `min_garbage`, and 45% of the
/// blob files' bytes (the live values to move are then at most 1.25 times the garbage;
/// exactly half would miss a file half garbage by its header and footer).
fn warranted(space: BlobSpace, min_garbage: u64) -> bool {
    space.garbage >= min_garbage
        && space.garbage.saturating_mul(20) >= space.bytes.saturating_mul(9)
}

impl BlobGc {
    pub(crate) fn new(locks: Arc<InodeLocks>) -> Self {
        Self {
            locks,
            next_check_ms: AtomicU64::new(0),
            next_extent_check_ms: AtomicU64::new(EXTENT_CHECK_EVERY.as_millis() as u64),
            start: Instant::now(),
            running: Arc::new(AtomicBool::new(false)),
            closed: Arc::new(AtomicBool::new(false)),
            started: AtomicU64::new(0),
            worker: Mutex::new(None),
            policy: Mutex::new(Policy {
                every: CHECK_EVERY,
                extent_every: EXTENT_CHECK_EVERY,
                min_garbage: MIN_GARBAGE,
            }),
            extent_files_seen: Arc::default(),
        }
    }

    /// Looks at `tenant`'s garbage if a look is due, and starts a collection if it warrants
    /// one and none runs. Cheap when no look is due (a few atomic loads).
    pub(crate) fn poke(&self, tenant: &Arc<Tenant>) {
        let now_ms = self.start.elapsed().as_millis() as u64;
        let rolled = tenant.db().extent_files().rolled();
        let closed_one = rolled > self.extent_files_seen.load(Ordering::Relaxed);
        if self.running.load(Ordering::Acquire)
            || !(closed_one
                || now_ms >= self.next_extent_check_ms.load(Ordering::Relaxed)
                || now_ms >= self.next_check_ms.load(Ordering::Relaxed))
        {
            return;
        }
        let policy = *self.policy.lock().unwrap_or_else(|p| p.into_inner());
        if closed_one || take_due(&self.next_extent_check_ms, now_ms, policy.extent_every) {
            self.extent_files_seen.store(rolled, Ordering::Relaxed);
            self.next_extent_check_ms.store(
                now_ms + policy.extent_every.as_millis() as u64,
                Ordering::Relaxed,
            );
            // Streaming bulk writes close files: a collection stalls them a little (see
            // EXTENT_GARBAGE_FACTOR). A quiet volume collects what is there.
            let (min_garbage, occasion) = match closed_one {
                true => (EXTENT_GARBAGE_FACTOR * policy.min_garbage, Occasion::Rolled),
                false => (policy.min_garbage, Occasion::Quiet(policy.extent_every)),
            };
            let locks = Arc::clone(&self.locks);
            let seen = Arc::clone(&self.extent_files_seen);
            self.start_worker(tenant, "tenantfs-extent-gc", move |t| {
                let collected = collect_extent_files(t, &locks, min_garbage, occasion);
                // (A quiet collection closes the idle open file: no reason for another.)
                seen.store(t.db().extent_files().rolled(), Ordering::Relaxed);
                match collected {
                    Ok(done) if done.moved > 0 || done.taken.files > 0 => {
                        tracing::info!(tenant = %t.info().name, moved = done.moved,
                            files = done.taken.files, bytes = done.taken.bytes,
                            "collected extent files")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(tenant = %t.info().name, error = %e,
                        "extent file collection failed"),
                }
            });
            return;
        }
        if !take_due(&self.next_check_ms, now_ms, policy.every) {
            return;
        }
        let min_garbage = policy.min_garbage;
        let space = tenant.db().blob_space();
        if !warranted(space, min_garbage) {
            return;
        }
        self.start_worker(tenant, "tenantfs-blob-gc", move |t| {
            tracing::info!(tenant = %t.info().name, bytes = space.bytes,
                garbage = space.garbage, "collecting blob garbage");
            t.db().collect_blob_garbage();
            let after = t.db().blob_space();
            tracing::info!(tenant = %t.info().name, bytes = after.bytes,
                garbage = after.garbage, "blob garbage collected");
        });
    }

    /// Runs `job` on a thread of its own unless one runs (or the volume is closing).
    fn start_worker(
        &self,
        tenant: &Arc<Tenant>,
        name: &str,
        job: impl FnOnce(&Tenant) + Send + 'static,
    ) {
        let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::Acquire) || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(done) = worker.take() {
            let _ = done.join(); // it cleared `running`: finished
        }
        let (running, closed) = (Arc::clone(&self.running), Arc::clone(&self.closed));
        let t = Arc::clone(tenant);
        let spawned = crate::threads::spawn(name, move || {
            // A tenant in debt for its background work starts a collection once it has
            // paid (or after `store::background::MAX_HOLD`: collections give space back);
            // not at all if its volume closes meanwhile.
            if t.db().background().hold(|| closed.load(Ordering::Acquire)) {
                job(&t);
            }
            running.store(false, Ordering::Release);
        });
        match spawned {
            Ok(handle) => {
                self.started.fetch_add(1, Ordering::Relaxed);
                *worker = Some(handle);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start garbage collection");
                self.running.store(false, Ordering::Release);
            }
        }
    }

    /// Whether a collection runs.
    pub(crate) fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Starts no more collections and waits for one in progress (the volume is closing).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
    }

    /// Collections started so far.
    #[cfg(test)]
    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Sets how often to look and the least garbage to collect (tests: every call, any
    /// amount).
    #[cfg(test)]
    pub(crate) fn set_policy(&self, every: Duration, min_garbage: u64) {
        let mut policy = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        (policy.every, policy.min_garbage) = (every, min_garbage);
        self.next_check_ms.store(0, Ordering::Relaxed);
    }

    /// Sets how often to walk the extent files' chunks when none was closed (tests).
    #[cfg(test)]
    pub(crate) fn set_extent_every(&self, every: Duration) {
        self.policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extent_every = every;
        self.next_extent_check_ms.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FileKind, Owner, TestStore, ROOT_INO, UNLOGGED_WRITE_MIN};
    use super::*;

    #[test]
    fn garbage_warrants_collection_at_half_the_bytes_and_the_floor() {
        let s = |bytes, garbage| BlobSpace { bytes, garbage };
        assert!(!warranted(s(0, 0), 1));
        assert!(warranted(s(1000, 450), 100));
        assert!(!warranted(s(1000, 449), 100));
        assert!(!warranted(s(1000, 900), 901));
        assert!(warranted(s(1 << 40, 1 << 39), MIN_GARBAGE));
    }

    /// Two files written in turns share their blob files; one deleted leaves them half
    /// garbage. Once compaction has counted it, a write or sync starts a collection, which
    /// gives the space back and changes no byte of the other file. Below the threshold
    /// nothing starts.
    #[test]
    fn a_volume_collects_blob_garbage_once_it_warrants_it() {
        let store = TestStore::new();
        let vol = store.open();
        let owner = Owner { uid: 0, gid: 0 };
        let mk = |name: &[u8]| {
            vol.mknod(ROOT_INO, name, FileKind::File, 0o644, owner, 0)
                .unwrap()
                .ino
        };
        let (a, b) = (mk(b"a"), mk(b"b"));
        let len = 8 << 20;
        let model: Vec<u8> = (0..len).map(|i| (i % 251 + 1) as u8).collect();
        // Writes below the bulk size: their chunks are blob values (bulk ones go to extent
        // files, collected by `collect_extent_files`).
        let step = UNLOGGED_WRITE_MIN / 2;
        for at in (0..len).step_by(step) {
            vol.write(a, at as u64, &model[at..at + step]).unwrap();
            vol.write(b, at as u64, &vec![0x5a; step]).unwrap();
        }
        vol.tenant().db().flush().unwrap(); // into blob files before the delete
        vol.fsync().unwrap();
        vol.unlink(ROOT_INO, b"b").unwrap();
        vol.forget(b).unwrap(); // (the kernel's last reference: its data is deleted)
        vol.tenant().db().compact().unwrap(); // counts the garbage
        let before = vol.tenant().db().blob_space();
        assert!(
            before.garbage >= len as u64 && before.garbage * 20 >= before.bytes * 9,
            "{before:?}"
        );
        vol.blob_gc.set_policy(Duration::ZERO, before.garbage + 1);
        vol.fsync().unwrap();
        assert_eq!(vol.blob_gc.started(), 0, "started below its threshold");
        vol.blob_gc.set_policy(Duration::ZERO, 1 << 20);
        vol.fsync().unwrap();
        assert_eq!(vol.blob_gc.started(), 1, "not started above its threshold");
        vol.blob_gc.close(); // waits for it
        let after = vol.tenant().db().blob_space();
        assert!(
            after.garbage == 0 && after.bytes <= before.bytes - before.garbage,
            "{before:?} -> {after:?}"
        );
        assert!(vol.read(a, 0, len as u32).unwrap() == model);
    }
}
