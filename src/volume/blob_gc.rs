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
//! Extent files (format 4, `store::extents`) are collected on the same thread: after each
//! extent file is closed, the next poke walks the chunk values that name extent files (inline
//! values only: no blob is read; 16k per GiB of file data), and deletes the closed files none
//! names once they hold 1 GiB ([`EXTENT_GARBAGE_FACTOR`]), after a flush has made the values
//! that replaced them durable (so that no value naming a deleted file comes back after a
//! crash). A file overwritten whole, the streaming case, goes without any copying. Files
//! still partly named keep their garbage: moving their live chunks is not built yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::codec::{decode_chunk, decode_extent_key, Chunk, ExtentKey};
use crate::store::{BlobSpace, ExtentFileStats, Family, StoreError};
use crate::tenants::Tenant;

/// How often a busy volume looks at its garbage (two property reads).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(10);
/// Garbage below this is left alone, whatever its share.
pub(crate) const MIN_GARBAGE: u64 = 256 << 20;
/// Unnamed extent files are deleted once they hold this many times [`MIN_GARBAGE`] (1 GiB):
/// each collection flushes the memtables and frees whole files, which stalls a streaming
/// writer for a few milliseconds; measured on a 20 s overwrite of a 1 GiB file, collecting
/// after every closed file took the write p99 from 1.5 ms to 8.8 ms.
const EXTENT_GARBAGE_FACTOR: u64 = 4;

/// One volume's collector.
pub(crate) struct BlobGc {
    /// Milliseconds after `start` before which no look is due.
    next_check_ms: AtomicU64,
    start: Instant,
    running: Arc<AtomicBool>,
    closed: AtomicBool,
    /// Collections started so far.
    started: AtomicU64,
    worker: Mutex<Option<JoinHandle<()>>>,
    policy: Mutex<(Duration, u64)>,
    /// Extent files closed as of the last extent collection started.
    extent_files_seen: AtomicU64,
}

impl Default for BlobGc {
    fn default() -> Self {
        Self {
            next_check_ms: AtomicU64::new(0),
            start: Instant::now(),
            running: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            started: AtomicU64::new(0),
            worker: Mutex::new(None),
            policy: Mutex::new((CHECK_EVERY, MIN_GARBAGE)),
            extent_files_seen: AtomicU64::new(0),
        }
    }
}

/// Whether `space` holds enough garbage to collect: at least `min_garbage`, and 45% of the
/// blob files' bytes (the live values to move are then at most 1.25 times the garbage;
/// exactly half would miss a file half garbage by its header and footer).
fn warranted(space: BlobSpace, min_garbage: u64) -> bool {
    space.garbage >= min_garbage
        && space.garbage.saturating_mul(20) >= space.bytes.saturating_mul(9)
}

impl BlobGc {
    /// Looks at `tenant`'s garbage if a look is due, and starts a collection if it warrants
    /// one and none runs. Cheap when no look is due (one atomic load).
    pub(crate) fn poke(&self, tenant: &Arc<Tenant>) {
        let rolled = tenant.db().extent_files().rolled();
        if rolled > self.extent_files_seen.load(Ordering::Relaxed)
            && !self.running.load(Ordering::Acquire)
        {
            self.extent_files_seen.store(rolled, Ordering::Relaxed);
            let min_garbage =
                EXTENT_GARBAGE_FACTOR * self.policy.lock().unwrap_or_else(|p| p.into_inner()).1;
            self.start_worker(
                tenant,
                "tenantfs-extent-gc",
                move |t| match collect_extent_files(t, min_garbage) {
                    Ok(gone) if gone.files > 0 => tracing::info!(tenant = %t.info().name,
                        files = gone.files, bytes = gone.bytes, "deleted unused extent files"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(tenant = %t.info().name, error = %e,
                        "extent file collection failed"),
                },
            );
            return;
        }
        let now_ms = self.start.elapsed().as_millis() as u64;
        let due = self.next_check_ms.load(Ordering::Relaxed);
        if now_ms < due || self.running.load(Ordering::Acquire) {
            return;
        }
        let (every, min_garbage) = *self.policy.lock().unwrap_or_else(|p| p.into_inner());
        let next = now_ms + every.as_millis() as u64;
        if self
            .next_check_ms
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another caller took this look
        }
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
        let running = Arc::clone(&self.running);
        let t = Arc::clone(tenant);
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                job(&t);
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
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = (every, min_garbage);
        self.next_check_ms.store(0, Ordering::Relaxed);
    }
}

/// Deletes the extent files of `tenant` that no chunk value names (see the module's doc).
pub(crate) fn collect_extent_files(
    tenant: &Tenant,
    min_garbage: u64,
) -> Result<ExtentFileStats, StoreError> {
    let db = tenant.db();
    let files = db.extent_files();
    let horizon = files.horizon();
    let mut live: HashMap<u64, u64> = HashMap::new();
    db.inline_values(Family::Extents, &[], &[0xff; 17], |k, v| {
        if let (Some(ExtentKey::Chunk(_)), Some(Chunk::Stored(span))) =
            (decode_extent_key(k), v.and_then(decode_chunk))
        {
            *live.entry(span.file).or_default() += u64::from(span.len);
        }
        true
    })?;
    if files.unnamed_before(horizon, &live)? < min_garbage {
        return Ok(ExtentFileStats::default());
    }
    // What made them unnamed (overwrites, deletes, folds) may still be in a memtable only.
    db.flush()?;
    files.collect(horizon, &live)
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

    /// A file rewritten whole in bulk writes leaves its old extent files unnamed: a collection
    /// pools four of them (to be written again) and deletes the rest, changes no byte, and the
    /// next files reuse the pooled ones. A file still named is left alone.
    #[test]
    fn unnamed_extent_files_are_pooled_or_deleted_and_named_ones_kept() {
        let store = TestStore::new();
        let vol = store.open();
        let files = vol.tenant().db().extent_files();
        files.set_roll_bytes(2 << 20);
        let owner = Owner { uid: 0, gid: 0 };
        let ino = vol
            .mknod(ROOT_INO, b"f", FileKind::File, 0o644, owner, 0)
            .unwrap()
            .ino;
        let len = 8usize << 20;
        let mut model = Vec::new();
        for round in 0..3u8 {
            model = (0..len).map(|i| (i % 251) as u8 ^ round | 1).collect();
            for at in (0..len).step_by(1 << 20) {
                vol.write(ino, at as u64, &model[at..at + (1 << 20)])
                    .unwrap();
            }
        }
        vol.fsync().unwrap();
        let before = vol.tenant().db().extent_file_stats();
        assert!(before.files >= 12, "{before:?}");
        let gone = collect_extent_files(vol.tenant(), 0).unwrap();
        let after = vol.tenant().db().extent_file_stats();
        // Round 3's 8 MiB is in 4-5 files (the last one open); rounds 1 and 2's are unnamed.
        assert!(gone.files >= 7, "{gone:?}");
        assert_eq!(
            after.files,
            before.files - (gone.files - 4),
            "four pooled: {after:?}"
        );
        assert!(vol.read(ino, 0, len as u32).unwrap() == model);
        // Nothing more to take; the pooled files come back as the next ones written.
        assert_eq!(collect_extent_files(vol.tenant(), 0).unwrap().files, 0);
        for at in (0..4usize << 20).step_by(1 << 20) {
            vol.write(ino, at as u64, &model[at..at + (1 << 20)])
                .unwrap();
        }
        vol.fsync().unwrap();
        assert!(vol.read(ino, 0, len as u32).unwrap() == model);
        assert_eq!(
            vol.tenant().db().extent_file_stats().files,
            after.files,
            "pooled files reused"
        );
    }
}
