//! Folding the blocks that writes put over a chunk back into it, in the background.
//!
//! A block write into a chunk stores the block alone (one WAL append, as any 4 KiB random
//! write) and leaves the chunk under it: reads merge, the block wins. A chunk with blocks over
//! it costs a read both (they are fetched and cached twice), so the blocks are merged into it
//! later: once its file has had no block write for [`FILE_QUIET`], or the chunk none for
//! [`CHUNK_QUIET`] (a file written slowly but without pause). One 64 KiB rewrite then serves
//! every write into the chunk since the last fold. Measured on 4 KiB random writes over a
//! freshly written 1 GiB file (`rw.sh` in
//! docs/decisions/0005-fold-block-writes-into-chunks.md): splitting at the first write into
//! a chunk ran at 20k IOPS (a 64 KiB read and 60 KiB of WAL in the writer's path), folding a
//! chunk after 2 s without writes to it at 26k (folds ran mid-job, under the file's lock),
//! and waiting for the file to go quiet at the speed of block writes alone. An earlier fold
//! split the chunk into block keys instead: the file then read at 205-217 MiB/s cold (4 KiB
//! values all over the blob files), against 861-867 MiB/s once merged.
//!
//! A fold is content-neutral (the same bytes before and after), so it races with nothing but
//! a change to the same chunk: it runs under the inode's lock and looks at the chunk and its
//! overlays again there (the pass's chunks and blocks were brought into the cache first, by
//! [`FETCHERS`] threads, so the lock is held for cached reads only). Content-neutral also
//! means it needs no WAL: a crash loses the merged chunk and the deletes together, and the
//! blocks, still in the WAL or on disk, read the same (`TenantDb::write_relayout`; the merged
//! bytes, already in an extent file, are then garbage there). What comes back must not hide
//! a later write, so a logged write over a chunk deletes its blocks whether it sees them or
//! not (`data.rs`, `durable_deletes`): once it had found none (the fold had taken them),
//! logged no delete, and a kill brought them back over it. The merged chunk goes into an
//! extent file and into the cache at once (`chunk.rs`), and the old chunk's bytes out of it:
//! the folds after random writes ran while the file was read again, and as inline values
//! (flushed into blob files, then moved by blob collection: a new cache key each time) they
//! were read from disk once more each, 50k misses in the 20 s buffered job of the fio suite
//! (22.4-25.3k IOPS over /dev/fuse, against 37.3-39.3k and 1-1.5k misses now; `buf3.sh` in
//! docs/decisions/0005-fold-block-writes-into-chunks.md). Chunks are folded in file order, so the merged chunks of a file land side
//! by side in the extent file, and read-ahead reads them in large reads. Holes never
//! overlay a chunk (an absent block key would show the chunk through), so writes that make
//! holes still split at once (`data.rs`), and so does a writer when the queue is full or
//! closed. Pending folds are dropped when the volume closes: the chunks stay readable
//! (merged) and a read that meets one queues it again.
//!
//! One thread per volume, started when the first fold is queued and gone when none is left:
//! an idle mount costs no thread.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::chunk::ChunkAt;
use super::codec::lookup_keys;
use super::locks::InodeLocks;
use crate::store::Family;
use crate::tenants::Tenant;

/// A file with no block write for this long has its chunks folded.
pub(crate) const FILE_QUIET: Duration = Duration::from_secs(2);
/// A chunk with no block write for this long is folded, however busy its file.
pub(crate) const CHUNK_QUIET: Duration = Duration::from_secs(30);
/// Chunks queued at most (64 Ki chunks: 4 GiB of file data, about 3 MiB of queue); past this
/// a writer splits the chunk itself.
const MAX_PENDING: usize = 1 << 16;
/// The fold thread sleeps at least this long (or the file quiet time, if shorter) between two
/// looks at the queue: each look walks every queued chunk, and chunks written one after
/// another fall due one after another, so a look per chunk is quadratic (an untar that queued
/// one chunk per file, each due 180 us after the last, spent 12% of the CPU walking).
const TICK: Duration = Duration::from_millis(100);
/// Chunks folded between two looks at the queue.
const PER_PASS: usize = 256;
/// Threads that bring a pass's chunks into the cache before it is folded (disk reads in
/// flight).
const FETCHERS: usize = 8;

/// The chunks of one volume waiting to be folded, and the thread that folds them.
pub(crate) struct Folds {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    tenant: Arc<Tenant>,
    locks: Arc<InodeLocks>,
    block_size: u64,
    chunk_blocks: u64,
}

struct State {
    /// (inode, first block of the chunk) -> when a block was last written into it.
    due: HashMap<(u64, u64), Instant>,
    /// inode -> when a block was last written into one of its chunks.
    files: HashMap<u64, Instant>,
    /// [`FILE_QUIET`] and [`CHUNK_QUIET`] (tests shorten them).
    quiet: (Duration, Duration),
    worker: Option<JoinHandle<()>>,
    running: bool,
    closed: bool,
    folded: u64,
}

impl Folds {
    pub(crate) fn new(
        tenant: Arc<Tenant>,
        locks: Arc<InodeLocks>,
        block_size: u64,
        chunk_blocks: u64,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    due: HashMap::new(),
                    files: HashMap::new(),
                    quiet: (FILE_QUIET, CHUNK_QUIET),
                    worker: None,
                    running: false,
                    closed: false,
                    folded: 0,
                }),
                wake: Condvar::new(),
                tenant,
                locks,
                block_size,
                chunk_blocks,
            }),
        }
    }

    /// Whether chunk `first` of `ino` waits to be folded (then it surely exists, and a block
    /// written into it needs no look at the store).
    pub(crate) fn is_queued(&self, ino: u64, first: u64) -> bool {
        self.shared.lock().due.contains_key(&(ino, first))
    }

    /// Queues chunk `first` of `ino` to be folded once writes leave it alone: a block was
    /// written into it just now (`written`), or a read found blocks over it. False when it
    /// cannot be queued (full, closed, no thread): the caller splits the chunk itself.
    pub(crate) fn note(&self, ino: u64, first: u64, written: bool) -> bool {
        let old = {
            let mut st = self.shared.lock();
            if st.closed || (st.due.len() >= MAX_PENDING && !st.due.contains_key(&(ino, first))) {
                return false;
            }
            let now = Instant::now();
            if written {
                st.due.insert((ino, first), now);
                st.files.insert(ino, now);
            } else {
                st.due.entry((ino, first)).or_insert(now);
                self.shared.wake.notify_one(); // may be due at once
            }
            if st.running {
                return true;
            }
            let shared = Arc::clone(&self.shared);
            let spawned = crate::threads::spawn("tenantfs-fold", move || shared.work());
            match spawned {
                Ok(handle) => {
                    st.running = true;
                    st.worker.replace(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the chunk fold thread");
                    st.due.remove(&(ino, first));
                    st.files.remove(&ino);
                    return false;
                }
            }
        };
        if let Some(old) = old {
            let _ = old.join(); // it ended when it found nothing left to fold
        }
        true
    }

    /// Folds every queued chunk now, however recently written.
    pub(crate) fn fold_now(&self) {
        let mut keys: Vec<(u64, u64)> = self.shared.lock().due.drain().map(|(k, _)| k).collect();
        keys.sort_unstable();
        self.shared.fold_pass(&keys);
    }

    /// Sets how long a file and a chunk must go unwritten before a fold (tests: zero folds as
    /// soon as a chunk is queued, racing the writes).
    #[cfg(test)]
    pub(crate) fn set_quiet(&self, file: Duration, chunk: Duration) {
        self.shared.lock().quiet = (file, chunk);
    }

    /// Chunks queued and chunks folded so far.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, u64) {
        let st = self.shared.lock();
        (st.due.len(), st.folded)
    }

    /// Whether chunks wait to be folded or a fold runs.
    pub(crate) fn has_work(&self) -> bool {
        let st = self.shared.lock();
        st.running || !st.due.is_empty()
    }

    /// Drops what is queued and waits for a fold in progress; nothing is queued afterwards.
    pub(crate) fn close(&self) {
        let worker = {
            let mut st = self.shared.lock();
            st.closed = true;
            if !st.due.is_empty() {
                tracing::debug!(
                    tenant = %self.shared.tenant.info().name,
                    chunks = st.due.len(),
                    "volume closed with chunks not yet folded (they stay readable)"
                );
            }
            st.due.clear();
            st.files.clear();
            st.worker.take()
        };
        self.shared.wake.notify_all();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fold thread: folds what is due, sleeps until the next is, ends when none is left.
    fn work(&self) {
        loop {
            // A tenant in debt for its background work folds at about the pace its limit
            // gives, held before it picks chunks (a write meanwhile keeps its chunk queued),
            // and not while the queue is half full (writers would then fold on their own).
            // Closed meanwhile: the loop below ends the thread.
            if self.lock().due.len() < MAX_PENDING / 2 {
                let _ = self.tenant.db().background().hold(|| self.lock().closed);
            }
            let ready: Vec<(u64, u64)> = {
                let mut st = self.lock();
                loop {
                    if st.closed || st.due.is_empty() {
                        st.running = false;
                        return;
                    }
                    let now = Instant::now();
                    let (file_quiet, chunk_quiet) = st.quiet;
                    let mut next = None::<Instant>;
                    let mut ready = Vec::new();
                    for (&(ino, first), &at) in &st.due {
                        // No file entry: no block written into it since its last fold.
                        let when = st
                            .files
                            .get(&ino)
                            .map_or(now, |&w| (w + file_quiet).min(at + chunk_quiet));
                        if when <= now {
                            ready.push((ino, first));
                        } else {
                            next = Some(next.map_or(when, |n| n.min(when)));
                        }
                    }
                    // In file order: the merged chunks of one pass land side by side in the
                    // extent file, and a later streaming read gets them in one disk read per
                    // read-ahead job.
                    ready.sort_unstable();
                    ready.truncate(PER_PASS);
                    if !ready.is_empty() {
                        for key in &ready {
                            st.due.remove(key);
                        }
                        let live: HashSet<u64> = st.due.keys().map(|&(ino, _)| ino).collect();
                        st.files.retain(|ino, _| live.contains(ino));
                        break ready;
                    }
                    // (At least every FILE_QUIET: a file written once since may be due first.)
                    let wait = next
                        .map_or(file_quiet, |n| (n - now).min(file_quiet))
                        .max(TICK.min(file_quiet));
                    st = self
                        .wake
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            self.fold_pass(&ready);
        }
    }

    /// Folds the chunks `keys` (in file order), counts them and reports their bytes as the
    /// tenant's background work.
    fn fold_pass(&self, keys: &[(u64, u64)]) {
        let started = Instant::now();
        self.prefetch(keys);
        let folded = keys
            .iter()
            .filter(|&&(ino, first)| self.fold(ino, first))
            .count() as u64;
        // Each chunk folded was read (with the blocks over it) and written whole.
        let chunk_bytes = self.chunk_blocks * self.block_size;
        self.tenant
            .db()
            .background()
            .report(2 * folded * chunk_bytes, started);
        self.lock().folded += folded;
    }

    /// Brings the chunks of a pass and the blocks over them into the cache, [`FETCHERS`]
    /// multi-gets at a time. After random writes a chunk has up to 16 blocks over it, each a
    /// small value somewhere in a blob file: read one after another they kept the disk at one
    /// read in flight, and folding a 1 GiB file took over 20 s.
    fn prefetch(&self, ready: &[(u64, u64)]) {
        let per = ready.len().div_ceil(FETCHERS).max(1);
        std::thread::scope(|s| {
            for part in ready.chunks(per) {
                s.spawn(move || {
                    let mut keys = Vec::new();
                    for &(ino, first) in part {
                        let last = first + self.chunk_blocks - 1;
                        keys.extend(lookup_keys(ino, first, last, self.chunk_blocks).0);
                    }
                    // A hint: the fold reads again under the lock and reports what fails.
                    let _ = self
                        .tenant
                        .db()
                        .multi_get(Family::Extents, &keys, |_, _| {});
                });
            }
        });
    }

    /// Folds chunk `first` of `ino` if it still exists; true if it did. Call
    /// [`Self::prefetch`] first: the inode's lock is held for cached reads only.
    fn fold(&self, ino: u64, first: u64) -> bool {
        let _g = self.locks.lock(ino);
        let db = self.tenant.db();
        let mut b = db.batch();
        let chunk = ChunkAt {
            tenant: &self.tenant,
            block_size: self.block_size,
            chunk_blocks: self.chunk_blocks,
            ino,
            first,
        };
        let result = chunk.merge(&mut b).and_then(|merged| {
            let Some(replaced) = merged else {
                return Ok(false);
            };
            db.write_relayout(b)?;
            if let Some(span) = replaced {
                db.extent_files().forget_cached(&span);
            }
            Ok(true)
        });
        match result {
            Ok(found) => found,
            Err(e) => {
                // The chunk stays as it is, readable; its next write queues it again.
                tracing::warn!(tenant = %self.tenant.info().name, ino, first, error = %e,
                    "cannot fold the blocks over a chunk into it");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::{chunk_key, decode_chunk, decode_extent_key, Chunk, ExtentKey};
    use super::super::{Fallocate, FileKind, Owner, TestStore, Volume, ROOT_INO};
    use super::*;
    use crate::store::Family;
    use proptest::prelude::Rng;
    use proptest::test_runner::{RngAlgorithm, TestRng};

    const CHUNK: usize = 64 << 10;
    const BS: usize = 4096;

    /// A file `name` in `vol` holding `len` bytes of noise, written whole (as chunks).
    fn noise_file(vol: &Volume, rng: &mut TestRng, name: &[u8], len: usize) -> (u64, Vec<u8>) {
        assert_eq!(vol.block_size() as usize, BS);
        let owner = Owner { uid: 0, gid: 0 };
        let ino = vol
            .mknod(ROOT_INO, name, FileKind::File, 0o644, owner, 0)
            .unwrap()
            .ino;
        let model = bytes(rng, len);
        vol.write(ino, 0, &model).unwrap();
        (ino, model)
    }

    /// `store`'s volume, its folds held back for an hour: they run when a test says so.
    fn open_with_folds_held(store: &TestStore) -> Volume {
        let vol = store.open();
        vol.folds
            .set_quiet(Duration::from_secs(3600), Duration::from_secs(3600));
        vol
    }

    /// (chunk keys, chunk keys with a block key over them, block keys) of the volume.
    fn overlaid_chunks(vol: &Volume) -> (usize, usize, usize) {
        let mut chunks = Vec::new();
        let mut blocks = std::collections::BTreeSet::new();
        vol.tenant()
            .db()
            .keys(Family::Extents, &[], &[0xff; 17], |k| {
                match decode_extent_key(k) {
                    Some(ExtentKey::Chunk(c)) => chunks.push(c),
                    Some(ExtentKey::Block(b)) => {
                        blocks.insert(b);
                    }
                    None => {}
                }
                true
            })
            .unwrap();
        let per = (CHUNK / BS) as u64;
        let overlaid = chunks
            .iter()
            .filter(|&&c| blocks.range(c..c + per).next().is_some())
            .count();
        (chunks.len(), overlaid, blocks.len())
    }

    fn below(rng: &mut TestRng, n: usize) -> usize {
        (rng.next_u64() % n as u64) as usize
    }

    /// Noise without a zero byte (a block of it is never a hole).
    fn bytes(rng: &mut TestRng, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        rng.fill_bytes(&mut v);
        v.iter_mut().for_each(|b| *b |= 1);
        v
    }

    /// Folds that run as soon as a chunk is written into, racing block writes, partial
    /// writes, whole-chunk rewrites and holes into the same file, change no byte it reads;
    /// once they have all run, no chunk has a block key over it.
    #[test]
    fn folds_racing_writes_change_no_byte_and_leave_no_chunk_overlaid() {
        let store = TestStore::new();
        let vol = store.open();
        vol.folds.set_quiet(Duration::ZERO, Duration::ZERO);
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let (ino, mut model) = noise_file(&vol, &mut rng, b"f", 32 * CHUNK);
        assert_eq!(overlaid_chunks(&vol), (32, 0, 0));
        let write = |vol: &Volume, model: &mut Vec<u8>, at: usize, data: &[u8]| {
            vol.write(ino, at as u64, data).unwrap();
            model[at..at + data.len()].copy_from_slice(data);
        };
        for step in 0..3000 {
            match below(&mut rng, 10) {
                0..=6 => {
                    let at = below(&mut rng, model.len() / BS) * BS;
                    let data = bytes(&mut rng, BS);
                    write(&vol, &mut model, at, &data);
                }
                7 => {
                    let at = below(&mut rng, model.len() - 10_000);
                    let len = 1 + below(&mut rng, 10_000);
                    let data = bytes(&mut rng, len);
                    write(&vol, &mut model, at, &data);
                }
                8 => {
                    let at = below(&mut rng, model.len() / CHUNK) * CHUNK;
                    let data = bytes(&mut rng, CHUNK);
                    write(&vol, &mut model, at, &data);
                }
                _ => {
                    let at = below(&mut rng, model.len() - 20_000);
                    let len = 1 + below(&mut rng, 20_000);
                    vol.fallocate(ino, at as u64, len as u64, Fallocate::PunchHole)
                        .unwrap();
                    model[at..at + len].fill(0);
                }
            }
            if step % 250 == 0 {
                let got = vol.read(ino, 0, model.len() as u32).unwrap();
                assert!(got == model, "step {step}: contents differ from the model");
            }
        }
        vol.folds.fold_now();
        vol.folds.close(); // waits for a fold in progress
        let got = vol.read(ino, 0, model.len() as u32).unwrap();
        assert!(
            got == model,
            "after the folds: contents differ from the model"
        );
        let (chunks, overlaid, _) = overlaid_chunks(&vol);
        assert_eq!(overlaid, 0, "{overlaid} of {chunks} chunks still overlaid");
        assert!(vol.folds.counts().1 > 0, "nothing was folded");
    }

    /// The store's flushes and compactions and the volume's folds report what they moved as
    /// background work: a flush at least the bytes it wrote out, a compaction what it read and
    /// wrote, a fold each chunk it merged, read and written.
    #[test]
    fn background_work_is_reported_as_it_is_done() {
        use std::sync::atomic::Ordering;
        let store = TestStore::new();
        let vol = open_with_folds_held(&store);
        let account = Arc::new(crate::store::CountingAccount::default());
        let db = vol.tenant().db();
        db.background().set_sink(account.clone());
        let took = || account.bytes.swap(0, Ordering::Relaxed);
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let (ino, _) = noise_file(&vol, &mut rng, b"g", 2 * CHUNK);
        took();
        // Eight blocks of noise over the two chunks: values in the memtable until a flush.
        for i in 0..8 {
            vol.write(ino, (i * CHUNK / 4) as u64, &bytes(&mut rng, BS))
                .unwrap();
        }
        db.flush().unwrap();
        let flushed = took();
        assert!(flushed >= 8 * BS as u64, "a flush reported {flushed} bytes");
        // A compaction with blob collection reads the blocks' blob file and writes a new one.
        db.collect_blob_garbage();
        let compacted = took();
        assert!(
            compacted >= 2 * 8 * BS as u64,
            "a compaction of the flushed blocks reported {compacted} bytes"
        );
        vol.folds.fold_now();
        assert_eq!(vol.folds.counts(), (0, 2));
        let folded = took();
        assert!(
            folded >= 2 * 2 * CHUNK as u64,
            "two chunks folded reported {folded} bytes"
        );
        assert_eq!(
            account.from_the_future.load(Ordering::Relaxed),
            0,
            "work began after it was reported"
        );
    }

    /// A block write leaves the chunk under it (one key written, nothing read back), and the
    /// fold, when it comes, merges the blocks into their chunk: one value per chunk again.
    #[test]
    fn a_block_write_goes_over_its_chunk_until_the_fold() {
        let store = TestStore::new();
        let vol = open_with_folds_held(&store);
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let (ino, mut model) = noise_file(&vol, &mut rng, b"g", 2 * CHUNK);
        for at in [BS, 5 * BS, CHUNK + 2 * BS] {
            let data = bytes(&mut rng, BS);
            vol.write(ino, at as u64, &data).unwrap();
            model[at..at + BS].copy_from_slice(&data);
        }
        assert_eq!(overlaid_chunks(&vol), (2, 2, 3));
        assert_eq!(
            vol.folds.counts(),
            (2, 0),
            "both chunks queued, none folded yet"
        );
        assert!(vol.read(ino, 0, model.len() as u32).unwrap() == model);
        vol.folds.fold_now();
        assert_eq!(
            overlaid_chunks(&vol),
            (2, 0, 0),
            "each chunk one value again"
        );
        assert_eq!(vol.folds.counts(), (0, 2));
        assert!(vol.read(ino, 0, model.len() as u32).unwrap() == model);
    }

    /// The stored chunk of `first` in `ino`: where its bytes are in an extent file.
    fn stored_span(vol: &Volume, ino: u64, first: u64) -> crate::store::ExtentSpan {
        let value = vol
            .tenant()
            .db()
            .get(Family::Extents, &chunk_key(ino, first))
            .unwrap()
            .expect("a chunk value");
        match decode_chunk(&value) {
            Some(Chunk::Stored(span)) => span,
            other => panic!("chunk {first} is not in an extent file: {other:?}"),
        }
    }

    /// A fold writes the merged chunk into an extent file, as a bulk write goes, and keeps
    /// it in the cache, where the old chunk's bytes no longer are: the file's readers, who
    /// just read the chunk and the blocks over it, read the merged chunk from RAM.
    #[test]
    fn a_fold_writes_its_chunk_to_an_extent_file_and_caches_it_in_place_of_the_old() {
        // Shards of 1 MiB: in the default test cache's (512 KiB), the chunk was taken and
        // dropped at once in full parallel runs (a shard over its capacity with nothing it
        // may evict, its other entries held by the store's work meanwhile).
        let store = TestStore::with_cache(64 << 20);
        let vol = open_with_folds_held(&store);
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        // Written whole and large enough to be bulk data: its chunks are in an extent file.
        let (ino, mut model) = noise_file(&vol, &mut rng, b"e", 8 * CHUNK);
        let per = (CHUNK / BS) as u64;
        let old = stored_span(&vol, ino, per);
        assert!(vol.read(ino, 0, model.len() as u32).unwrap() == model);
        // Read-ahead started by the read, run late on its low-priority thread, would put the
        // old chunk back in the small test cache (or push the new one out) after the fold.
        vol.readahead.wait_idle();
        let files = vol.tenant().db().extent_files();
        assert!(files.is_cached(&old), "a read caches the chunk");
        let data = bytes(&mut rng, BS);
        vol.write(ino, (CHUNK + 3 * BS) as u64, &data).unwrap();
        model[CHUNK + 3 * BS..CHUNK + 4 * BS].copy_from_slice(&data);
        vol.folds.fold_now();
        assert_eq!(overlaid_chunks(&vol), (8, 0, 0));
        let new = stored_span(&vol, ino, per);
        assert_ne!((new.file, new.offset), (old.file, old.offset));
        assert_eq!(new.len as usize, CHUNK);
        assert!(
            files.is_cached(&new),
            "the merged chunk is cached as it is written"
        );
        assert!(
            !files.is_cached(&old),
            "the old chunk's bytes left the cache"
        );
        assert!(vol.read(ino, 0, model.len() as u32).unwrap() == model);
        drop(vol);
        let vol = store.open();
        assert!(
            vol.read(ino, 0, model.len() as u32).unwrap() == model,
            "the merged chunk reads the same from disk after a reopen"
        );
    }

    /// Only a chunk that exists is queued: a file written in pieces smaller than a chunk (as
    /// tar writes, 10 KiB at a time) has none, so patching the block one piece ended in, or
    /// rewriting whole blocks below its end, queues nothing; a partial write into a file
    /// written whole does queue its chunk.
    #[test]
    fn only_a_chunk_that_exists_is_queued() {
        let store = TestStore::new();
        let vol = open_with_folds_held(&store);
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let owner = Owner { uid: 0, gid: 0 };
        let ino = vol
            .mknod(ROOT_INO, b"pieces", FileKind::File, 0o644, owner, 0)
            .unwrap()
            .ino;
        let mut model = Vec::new();
        for _ in 0..20 {
            let piece = bytes(&mut rng, 10_240);
            vol.write(ino, model.len() as u64, &piece).unwrap();
            model.extend_from_slice(&piece);
        }
        for at in [0, 7 * BS, CHUNK + 3 * BS] {
            let data = bytes(&mut rng, BS);
            vol.write(ino, at as u64, &data).unwrap();
            model[at..at + BS].copy_from_slice(&data);
        }
        assert_eq!(overlaid_chunks(&vol).0, 0, "no chunk was written");
        assert_eq!(
            vol.folds.counts(),
            (0, 0),
            "nothing to fold, nothing queued"
        );
        assert!(vol.read(ino, 0, model.len() as u32).unwrap() == model);

        let (whole, mut model) = noise_file(&vol, &mut rng, b"whole", 2 * CHUNK);
        let data = bytes(&mut rng, 100);
        vol.write(whole, (CHUNK + BS + 7) as u64, &data).unwrap();
        model[CHUNK + BS + 7..CHUNK + BS + 107].copy_from_slice(&data);
        assert_eq!(
            vol.folds.counts(),
            (1, 0),
            "the chunk under the patched block"
        );
        vol.folds.fold_now();
        assert_eq!(vol.folds.counts(), (0, 1));
        assert!(vol.read(whole, 0, model.len() as u32).unwrap() == model);
    }

    /// A chunk left overlaid when its volume closed (the fold queue is dropped) is queued
    /// again by the first read that meets it, and folded without waiting: its file has had
    /// no write since.
    #[test]
    fn a_read_queues_a_chunk_left_overlaid_at_close() {
        let store = TestStore::new();
        let vol = store.open();
        let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let (ino, mut model) = noise_file(&vol, &mut rng, b"h", CHUNK);
        let data = bytes(&mut rng, BS);
        vol.write(ino, 3 * BS as u64, &data).unwrap();
        model[3 * BS..4 * BS].copy_from_slice(&data);
        drop(vol);
        let vol = store.open();
        assert_eq!(
            overlaid_chunks(&vol),
            (1, 1, 1),
            "the fold was dropped at close"
        );
        assert_eq!(vol.folds.counts(), (0, 0));
        assert!(vol.read(ino, 0, CHUNK as u32).unwrap() == model);
        let deadline = Instant::now() + Duration::from_secs(20);
        while overlaid_chunks(&vol) != (1, 0, 0) {
            assert!(Instant::now() < deadline, "the chunk was not folded");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(vol.read(ino, 0, CHUNK as u32).unwrap() == model);
    }
}
