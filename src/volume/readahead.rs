//! Read-ahead for files read sequentially.
//!
//! Mounts default to FOPEN_DIRECT_IO, so the kernel's own read-ahead never runs: every read
//! reaches the volume as it was issued (tar reads 10 KiB at a time, fio 1 MiB), and a cold
//! read waits for the disk once per request. A file read from its start, or from where the
//! last read of it ended, is a stream: its first read also looks up the blocks of the next
//! [`FIRST_WINDOW`] in the same multi-get (RocksDB merges adjacent blob reads into one I/O),
//! and its later reads keep a window ahead of the reader, growing to [`MAX_WINDOW`], fetched in
//! [`CHUNK`]-sized multi-gets on a small pool of host-wide threads. Fetched values land in the
//! shared cache (the blob cache), where the reader's own lookups find them; nothing is kept
//! here but positions.
//!
//! The pool threads start on first use and are shared by every volume of the process; a job
//! holds its volume's store only while it runs, and a volume being dropped waits for its
//! running jobs ([`Readahead::close`]) so the store is closed, and its lock released, when the
//! volume is gone.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::codec::{decode_attr, decode_chunk, ino_key, lookup_keys, Chunk, ExtentKey, LookupKey};
use super::FileKind;
use crate::store::{ExtentSpan, Family, StoreError};
use crate::tenants::Tenant;

/// What the first read of a stream adds to its own lookups.
pub(crate) const FIRST_WINDOW: u64 = 128 << 10;
/// The most a stream reads ahead of its reader.
pub(crate) const MAX_WINDOW: u64 = 8 << 20;
/// Bytes per background multi-get: several run at once, one per pool thread.
pub(crate) const CHUNK: u64 = 1 << 20;
/// Pool threads (each runs one multi-get at a time: the disk sees this many reads in flight).
const THREADS: usize = 4;
/// Jobs waiting for a thread; when full, read-ahead is skipped (the reader reads itself).
const QUEUE: usize = 64;
/// Files tracked per volume; past this the positions are forgotten and streams start again.
const MAX_STREAMS: usize = 4096;

/// One file's sequential position.
struct Stream {
    /// Where the next read starts if the reader goes on sequentially.
    next: u64,
    /// Bytes up to here were read or requested already.
    ahead: u64,
    /// How far ahead of the reader to keep `ahead`.
    window: u64,
}

/// What one read should look up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The read's own lookups extend to this byte (>= the read's end, <= the file's size).
    pub sync_end: u64,
    /// Byte range to fetch in the background.
    pub background: Option<(u64, u64)>,
    /// The read is not where the last one of the file ended: read no more than it asks.
    pub random: bool,
}

impl Plan {
    /// A random read's plan: no more than it asks, nothing in the background.
    pub(crate) fn random(end: u64) -> Self {
        Plan {
            sync_end: end,
            background: None,
            random: true,
        }
    }
}

/// Per-volume stream positions and background fetches.
#[derive(Default)]
pub(crate) struct Readahead {
    streams: Mutex<HashMap<u64, Stream>>,
    jobs: Arc<Jobs>,
    /// Extent spans (file, offset) the jobs read from the disk into the cache and no reader
    /// has passed yet: what a drop-behind may erase (it leaves what others had cached).
    fetched: Arc<Mutex<HashSet<(u64, u64)>>>,
}

/// The most spans [`Readahead::fetched`] remembers (past it, it starts again: a few chunks
/// then stay cached after a stream).
const MAX_FETCHED: usize = 8192;

impl Readahead {
    /// Plans a read of `[offset, end)` of inode `ino`, a file of `size` bytes.
    pub fn plan(&self, ino: u64, offset: u64, end: u64, size: u64) -> Plan {
        let mut streams = self.streams.lock().expect("readahead lock");
        if streams.len() >= MAX_STREAMS && !streams.contains_key(&ino) {
            streams.clear();
        }
        let s = streams.entry(ino).or_insert(Stream {
            next: 0,
            ahead: 0,
            window: FIRST_WINDOW,
        });
        let sequential = offset == s.next || offset == 0;
        s.next = end;
        if !sequential {
            // Random access: no read-ahead until the reader runs sequentially again.
            s.ahead = end;
            s.window = FIRST_WINDOW;
            return Plan::random(end);
        }
        if offset == 0 {
            s.window = FIRST_WINDOW;
            s.ahead = 0;
        }
        let mut sync_end = end;
        if s.ahead <= offset {
            // Nothing fetched ahead of this read: fetch the first window with it.
            sync_end = (end + FIRST_WINDOW).min(size).max(end);
            s.ahead = sync_end;
        }
        s.window = (s.window * 2).max(2 * (end - offset)).min(MAX_WINDOW);
        let mut background = None;
        if s.ahead < size && s.ahead.saturating_sub(end) < s.window / 2 {
            let from = s.ahead.max(end);
            let to = (end + s.window).min(size);
            if from < to {
                background = Some((from, to));
                s.ahead = to;
            }
        }
        Plan {
            sync_end,
            background,
            random: false,
        }
    }

    /// Fetches bytes `[from, to)` of `ino` (blocks of `block_size`, chunk values of
    /// `chunk_blocks`) from `tenant`'s store into the cache in the background, in [`CHUNK`]s the
    /// pool reads at once.
    pub fn fetch(
        &self,
        tenant: &Arc<Tenant>,
        ino: u64,
        from: u64,
        to: u64,
        block_size: u64,
        chunk_blocks: u64,
    ) {
        let per_job = (CHUNK / block_size).max(1);
        let mut block = from / block_size;
        let end_block = to.div_ceil(block_size);
        while block < end_block {
            let upto = (block + per_job).min(end_block);
            let (keys, names) = lookup_keys(ino, block, upto - 1, chunk_blocks);
            let fetched = Arc::clone(&self.fetched);
            let queued = self.queue(tenant, move |t| {
                warm(t, &keys, &names, chunk_blocks, &fetched)
            });
            if !queued {
                return;
            }
            block = upto;
        }
    }

    /// Fetches whole small files, `(ino, size)`, into the cache in one background job: one
    /// multi-get of all their keys, so files stored side by side come in with merged reads.
    pub fn fetch_files(
        &self,
        tenant: &Arc<Tenant>,
        files: Vec<(u64, u64)>,
        block_size: u64,
        chunk_blocks: u64,
    ) {
        self.queue(tenant, move |t| {
            warm_files(t, &files, block_size, chunk_blocks)
        });
    }

    /// Fetches the small files among the inode numbers `inos` into the cache in one background
    /// job: their inode records in one multi-get, then, as [`Self::fetch_files`], the bytes of
    /// the regular files of at most `small` bytes, `max_bytes` of them at most (`limits`).
    /// False when the pool's queue is full and nothing was queued.
    pub fn fetch_inodes(
        &self,
        tenant: &Arc<Tenant>,
        inos: Range<u64>,
        limits: (u64, u64),
        block_size: u64,
        chunk_blocks: u64,
    ) -> bool {
        self.queue(tenant, move |t| {
            small_files(t, inos, limits)
                .and_then(|files| warm_files(t, &files, block_size, chunk_blocks))
        })
    }

    /// Queues `job` on the pool as one of this volume's jobs, run on `tenant`'s store if it is
    /// still open. Its failure is dropped: a fetch is a hint, and the reader sees and reports
    /// a failure itself. False when the pool's queue is full and nothing was queued.
    fn queue(
        &self,
        tenant: &Arc<Tenant>,
        job: impl FnOnce(&Tenant) -> Result<(), StoreError> + Send + 'static,
    ) -> bool {
        let jobs = Arc::clone(&self.jobs);
        let tenant = Arc::downgrade(tenant);
        self.jobs.queued();
        let queued = submit(Box::new(move || {
            jobs.run(|| {
                if let Some(t) = tenant.upgrade() {
                    let _ = job(&t);
                }
            });
        }));
        if !queued {
            self.jobs.dropped();
        }
        queued
    }

    /// Waits until no fetch of this volume is queued or running (a test's cache is then
    /// changed by nothing but the test).
    #[cfg(test)]
    pub(crate) fn wait_idle(&self) {
        self.jobs.wait_idle();
    }

    /// Whether a job of this volume read `span` from the disk and no reader has passed it
    /// since (it is forgotten either way).
    pub fn take_fetched(&self, span: &ExtentSpan) -> bool {
        let mut f = self.fetched.lock().unwrap_or_else(|p| p.into_inner());
        f.remove(&(span.file, span.offset))
    }

    /// Refuses new background fetches and waits for the running ones.
    pub fn close(&self) {
        self.jobs.close();
    }
}

/// Brings the values of `keys` (named by `names`, as [`lookup_keys`] gives them) into the
/// cache. Chunk keys go first in a multi-get of their own: RocksDB looks keys up in batches of
/// 32 and merges adjacent blob reads only within a batch, so with the blocks' keys between
/// them (17 keys per 64 KiB chunk) a disk read would carry two chunks; alone, a job's chunks
/// come in one read. Blocks are then looked up only where no chunk holds them; the blocks a
/// reader finds over a chunk it looks up itself.
fn warm(
    tenant: &Tenant,
    keys: &[LookupKey],
    names: &[ExtentKey],
    chunk_blocks: u64,
    fetched: &Mutex<HashSet<(u64, u64)>>,
) -> Result<(), StoreError> {
    let db = tenant.db();
    if chunk_blocks <= 1 {
        return db.multi_get(Family::Extents, keys, |_, _| {});
    }
    let (chunk_keys, chunks): (Vec<LookupKey>, Vec<u64>) = keys
        .iter()
        .zip(names)
        .filter_map(|(k, n)| match n {
            ExtentKey::Chunk(c) => Some((*k, *c)),
            ExtentKey::Block(_) => None,
        })
        .unzip();
    let mut found = BTreeSet::new();
    let mut stored = Vec::new();
    let _no_delete = db.extent_files().read_guard();
    db.multi_get(Family::Extents, &chunk_keys, |i, v| {
        found.insert(chunks[i]);
        if let Some(Chunk::Stored(span)) = decode_chunk(v) {
            stored.push(span);
        }
    })?;
    if !stored.is_empty() {
        // Chunks in extent files: their bytes come in (one read per run end to end). Those
        // not cached now are noted first: a reader may pass them the moment they are in.
        let files = db.extent_files();
        {
            let mut f = fetched.lock().unwrap_or_else(|p| p.into_inner());
            if f.len() + stored.len() > MAX_FETCHED {
                f.clear();
            }
            let missing = stored.iter().filter(|s| !files.is_cached(s));
            f.extend(missing.map(|s| (s.file, s.offset)));
        }
        files.read(&stored, |_, _| {})?;
    }
    let rest = blocks_outside(keys, names, chunk_blocks, &found);
    if rest.is_empty() {
        return Ok(());
    }
    db.multi_get(Family::Extents, &rest, |_, _| {})
}

/// Brings whole files into the cache: every key that could hold their bytes in one
/// multi-get (a key that is not there costs a filter probe), then the extent-file bytes of
/// their stored chunks.
fn warm_files(
    tenant: &Tenant,
    files: &[(u64, u64)],
    block_size: u64,
    chunk_blocks: u64,
) -> Result<(), StoreError> {
    let (mut keys, mut names) = (Vec::new(), Vec::new());
    for &(ino, size) in files.iter().filter(|(_, size)| *size > 0) {
        let (k, n) = lookup_keys(ino, 0, (size - 1) / block_size, chunk_blocks);
        keys.extend(k);
        names.extend(n);
    }
    let db = tenant.db();
    let _no_delete = db.extent_files().read_guard();
    let mut stored = Vec::new();
    db.multi_get(Family::Extents, &keys, |i, v| {
        if let (ExtentKey::Chunk(_), Some(Chunk::Stored(span))) = (names[i], decode_chunk(v)) {
            stored.push(span);
        }
    })?;
    if !stored.is_empty() {
        db.extent_files().read(&stored, |_, _| {})?;
    }
    Ok(())
}

/// The regular files among the inode numbers `inos` of at most `small` bytes, `(ino, size)`,
/// in inode order until they would pass `max_bytes` (`limits`).
fn small_files(
    tenant: &Tenant,
    inos: Range<u64>,
    (small, max_bytes): (u64, u64),
) -> Result<Vec<(u64, u64)>, StoreError> {
    let keys: Vec<[u8; 8]> = inos.clone().map(ino_key).collect();
    let (mut files, mut bytes) = (Vec::new(), 0);
    tenant.db().multi_get(Family::Inodes, &keys, |i, v| {
        let ino = inos.start + i as u64;
        if let Some((a, _)) = decode_attr(ino, v) {
            if a.kind == FileKind::File
                && a.size > 0
                && a.size <= small
                && bytes + a.size <= max_bytes
            {
                bytes += a.size;
                files.push((ino, a.size));
            }
        }
    })?;
    Ok(files)
}

/// The block keys among `keys` (named by `names`) whose chunk is not in `chunks`.
fn blocks_outside(
    keys: &[LookupKey],
    names: &[ExtentKey],
    chunk_blocks: u64,
    chunks: &BTreeSet<u64>,
) -> Vec<LookupKey> {
    keys.iter()
        .zip(names)
        .filter(|(_, n)| match n {
            ExtentKey::Block(b) => !chunks.contains(&(b - b % chunk_blocks)),
            ExtentKey::Chunk(_) => false,
        })
        .map(|(k, _)| *k)
        .collect()
}

/// The running background jobs of one volume.
#[derive(Default)]
struct Jobs {
    state: Mutex<JobsState>,
    idle: Condvar,
}

#[derive(Default)]
struct JobsState {
    running: usize,
    /// Queued or running.
    pending: usize,
    closed: bool,
}

impl Jobs {
    /// Refuses new jobs and waits for the running ones to finish.
    fn close(&self) {
        let mut st = self.state.lock().expect("readahead jobs lock");
        st.closed = true;
        while st.running > 0 {
            st = self.idle.wait(st).expect("readahead jobs lock");
        }
    }

    /// Counts a job about to be queued (see [`Self::run`], [`Self::dropped`]).
    fn queued(&self) {
        self.state.lock().expect("readahead jobs lock").pending += 1;
    }

    /// A job counted by [`Self::queued`] that was not queued after all.
    fn dropped(&self) {
        let mut st = self.state.lock().expect("readahead jobs lock");
        st.pending -= 1;
        self.idle.notify_all();
    }

    /// Runs `f` (a job counted by [`Self::queued`]) unless the volume closed; `close` waits
    /// for it meanwhile.
    fn run(&self, f: impl FnOnce()) {
        {
            let mut st = self.state.lock().expect("readahead jobs lock");
            if st.closed {
                st.pending -= 1;
                self.idle.notify_all();
                return;
            }
            st.running += 1;
        }
        f();
        let mut st = self.state.lock().expect("readahead jobs lock");
        st.running -= 1;
        st.pending -= 1;
        self.idle.notify_all();
    }

    /// Waits until no job of the volume is queued or running.
    #[cfg(test)]
    fn wait_idle(&self) {
        let mut st = self.state.lock().expect("readahead jobs lock");
        while st.pending > 0 {
            st = self.idle.wait(st).expect("readahead jobs lock");
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Pool {
    queue: SyncSender<Job>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (queue, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..THREADS {
            let rx = Arc::clone(&rx);
            // No request waits on read-ahead yet: the pool runs below the threads that
            // answer requests, so a stream's read-ahead does not take the CPU from another
            // tenant's requests (`threads`).
            let name = format!("tenantfs-readahead-{i}");
            let spawned = crate::threads::spawn_below_requests(name, move || worker(&rx));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a read-ahead thread");
            }
        }
        Pool { queue }
    })
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().expect("readahead queue lock").recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// Queues `job` on the pool; false when the queue is full (the job is dropped: read-ahead is
/// a hint).
fn submit(job: Job) -> bool {
    match pool().queue.try_send(job) {
        Ok(()) => true,
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1 << 10;

    #[test]
    fn a_small_file_read_from_its_start_is_fetched_whole_by_the_first_read() {
        let r = Readahead::default();
        let p = r.plan(7, 0, 10 * K, 97 * K);
        assert_eq!(p.sync_end, 97 * K);
        assert_eq!(p.background, None);
        // The following reads find everything fetched: nothing more to do.
        let p = r.plan(7, 10 * K, 20 * K, 97 * K);
        assert_eq!((p.sync_end, p.background), (20 * K, None));
    }

    #[test]
    fn a_stream_keeps_a_growing_window_ahead_of_its_reader() {
        let r = Readahead::default();
        let size = 1 << 30;
        let m = 1 << 20;
        let p = r.plan(1, 0, m, size);
        assert_eq!(p.sync_end, m + FIRST_WINDOW);
        let mut ahead = p.background.map_or(p.sync_end, |b| b.1);
        let mut last_window = 0;
        for i in 1..40u64 {
            let (off, end) = (i * m, (i + 1) * m);
            let p = r.plan(1, off, end, size);
            assert_eq!(p.sync_end, end, "read {i} fetched its own range only");
            if let Some((from, to)) = p.background {
                assert_eq!(
                    from,
                    ahead.max(end),
                    "read {i}: background starts where the last stopped"
                );
                assert!(to - end <= MAX_WINDOW);
                last_window = to - end;
                ahead = to;
            }
            assert!(ahead >= end, "read {i}: the window fell behind the reader");
        }
        assert_eq!(last_window, MAX_WINDOW, "the window grew to its limit");
    }

    #[test]
    fn random_reads_fetch_nothing_extra_and_reset_the_window() {
        let r = Readahead::default();
        let size = 1 << 30;
        r.plan(3, 0, 4 * K, size);
        for off in [900 * K, 20 * K, 500 * K] {
            let p = r.plan(3, off, off + 4 * K, size);
            assert_eq!(
                p,
                Plan {
                    sync_end: off + 4 * K,
                    background: None,
                    random: true,
                }
            );
        }
    }

    #[test]
    fn the_end_of_the_file_bounds_every_fetch() {
        let r = Readahead::default();
        let size = 3 * (1 << 20) + 5;
        let mut off = 0;
        while off < size {
            let end = (off + (1 << 20)).min(size);
            let p = r.plan(9, off, end, size);
            assert!(p.sync_end <= size);
            if let Some((from, to)) = p.background {
                assert!(from < to && to <= size);
            }
            off = end;
        }
    }

    #[test]
    fn read_ahead_looks_up_blocks_only_where_no_chunk_holds_them() {
        // Blocks 8..40 with 16-block chunks: chunks 0, 16 and 32; chunk 16 is absent.
        let (keys, names) = lookup_keys(7, 8, 39, 16);
        let found = BTreeSet::from([0, 32]);
        let rest = blocks_outside(&keys, &names, 16, &found);
        let (want, _) = lookup_keys(7, 16, 31, 1);
        let bytes = |ks: &[LookupKey]| ks.iter().map(|k| k.as_ref().to_vec()).collect::<Vec<_>>();
        assert_eq!(bytes(&rest), bytes(&want));
    }

    #[test]
    fn a_closed_volume_runs_no_more_jobs() {
        let jobs = Jobs::default();
        let mut ran = 0;
        jobs.run(|| ran += 1);
        assert_eq!(ran, 1);
        jobs.close();
        jobs.run(|| ran += 1);
        assert_eq!(ran, 1, "a job ran after close");
    }

    #[test]
    fn close_waits_for_a_running_job() {
        let jobs = Arc::new(Jobs::default());
        let (started_tx, started) = std::sync::mpsc::channel();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker = {
            let (jobs, done) = (Arc::clone(&jobs), Arc::clone(&done));
            std::thread::spawn(move || {
                jobs.run(|| {
                    started_tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    done.store(true, std::sync::atomic::Ordering::SeqCst);
                })
            })
        };
        started.recv().unwrap();
        jobs.close();
        assert!(
            done.load(std::sync::atomic::Ordering::SeqCst),
            "close returned while a job was running"
        );
        worker.join().unwrap();
    }
}
