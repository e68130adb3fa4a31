//! Extent files: bulk file data written once, beside the store's RocksDB, by the writer.
//!
//! Why: bulk data put into the memtable is copied there, copied again, checksummed and
//! encrypted by a flush thread into a blob file, and a writer faster than that one thread
//! stops at the memtable limit (the p99 of a streaming write was one flush). Here a bulk write
//! is encrypted by the writing thread and written by the file's own writer thread with
//! O_DIRECT (`extent_io`, `extent_files.cc`: the bytes of any store file, under the same key
//! hierarchy), and the store keeps only a [`ExtentSpan`] naming where the bytes are: a few
//! dozen bytes through the WAL, no flush to wait for. A span is handed out only once its bytes
//! are in the file, so a crash never leaves a reference to bytes that were not written; an
//! fsync syncs the open extent file before the WAL ([`ExtentFiles::sync`]), and a file is
//! synced when it is rolled, so no durable reference names bytes that are not durable.
//!
//! Files are `extents/<number>.ext` in the store's directory, appended up to [`ROLL_BYTES`];
//! an overwritten or deleted span leaves garbage in its file, and a file no reference names is
//! deleted by [`ExtentFiles::collect`], which the owner calls with the live bytes per file.
//! Reads go through the host cache (keys of the file's id and offset: `file_ids`, so forks
//! that share a file share its cached pieces), missed spans of one file that lie end to end
//! are read in one I/O. A span carries a checksum per 4 KiB piece
//! ([`SpanCheck::Pieces`]), so a read of part of it (a random 4 KiB read of a 64 KiB chunk)
//! reads, checks and caches only the pieces it covers: a fifth of the latency of reading the
//! whole chunk went to reading, decrypting and checksumming the 60 KiB nobody asked for.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

mod collection;

use super::extent_io::{AlignedBuf, Appender, EnvPtr, Reader, ALIGN};
use super::extent_span::{checksum, SpanCheck, MAX_PIECES, PIECE};
use super::extent_span::{ExtentSpan, SpanPart};
use super::file_ids::{self, CachedFile, FileId, FileIds};
use super::ring_read::RingRead;
use super::StoreError;
use crate::cache::RocksBlockCache;
use crate::crypto::Keyring;
use collection::list;

/// An extent file is closed and a new one started past this size.
const ROLL_BYTES: u64 = 256 << 20;
/// Unnamed files kept per store to be written again: overwriting a file's blocks costs the
/// file system nothing, where freeing a 256 MiB file and allocating another is journal work
/// and, on a file system mounted with `discard` (this host's), a TRIM that stalled streaming
/// writes for ~150 ms each time (measured: p99 8.5 ms against 1.5 ms without deletes). Four:
/// what a collection finds at its 1 GiB threshold, so that a streaming rewrite reuses every
/// file it frees.
const POOL_FILES: usize = 4;
/// The most one read I/O takes when it joins spans that lie end to end.
const MAX_READ: u64 = 4 << 20;
const SUFFIX: &str = "ext";

/// Numbers for `tenantfs stats` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtentFileStats {
    pub files: u64,
    pub bytes: u64,
}

/// The file being appended to.
struct Open {
    number: u64,
    appender: Appender,
    size: u64,
    /// Appended since the last sync.
    dirty: bool,
    /// Appended since the last wait: bytes may still be on their way to the file.
    unwritten: bool,
    /// When the last append came.
    appended_at: Instant,
}

/// One store's extent files.
pub struct ExtentFiles {
    tenant: String,
    dir: PathBuf,
    env: EnvPtr,
    /// What the files' headers open under (None: a plaintext store).
    key: Option<Arc<Keyring>>,
    /// The ids of the files whose headers the store's Env wrote or opened, or a reader here
    /// did (None: a plaintext store, whose files have no header).
    ids: Option<Arc<FileIds>>,
    direct: bool,
    cache: RocksBlockCache,
    /// Of a plaintext store: unique among the stores of this process, the first part of its
    /// files' ids (the same store opened again in this process goes on with its own:
    /// [`Self::go_on_from`]).
    cache_id: AtomicU64,
    next_number: AtomicU64,
    open: Mutex<Option<Open>>,
    readers: Mutex<HashMap<u64, Arc<Reader>>>,
    /// Held shared by every read from the lookup of its spans to the end of its I/O, and
    /// exclusively to delete files: a file is never deleted under a read that may use it.
    deleting: RwLock<()>,
    /// Files closed since the store was opened (a collection is worth a look after each).
    rolled: AtomicU64,
    /// The number of the file last appended to (0: none): spans in it may not be written yet.
    open_number: AtomicU64,
    /// Held by [`Self::sync`].
    syncing: Mutex<()>,
    /// [`ROLL_BYTES`] (tests set less).
    roll_bytes: AtomicU64,
    /// Unnamed files kept to be written again instead of new ones (see [`POOL_FILES`]).
    pool: Mutex<Vec<u64>>,
    /// Held by a collection for its whole run, and by a checkpoint (`hold_collection`) from
    /// before RocksDB's part until its extent files are linked: no file it names goes.
    collecting: Mutex<()>,
    /// Files being closed in the background, and the first failure of one.
    retiring: Arc<(Mutex<Retiring>, std::sync::Condvar)>,
}

/// Files being closed in the background, and the first failure (file, message) among them.
type Retiring = (usize, Option<(u64, String)>);

/// Waits for `o`'s writes, syncs and closes it.
fn sync_and_close(mut o: Open) -> Result<(), (u64, String)> {
    let number = o.number;
    let synced = o.appender.sync();
    synced.and(o.appender.close()).map_err(|d| (number, d))
}

fn file_number(name: &str) -> Option<u64> {
    name.strip_suffix(SUFFIX)?.strip_suffix('.')?.parse().ok()
}

static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// See [`ExtentFiles::lineage`].
#[derive(Clone, Copy, Debug)]
pub struct ExtentLineage {
    cache_id: u64,
    next_number: u64,
}

impl ExtentFiles {
    pub(crate) fn open(
        tenant: &str,
        dir: PathBuf,
        env: EnvPtr,
        key: Option<(Arc<Keyring>, Arc<FileIds>)>,
        direct: bool,
        cache: RocksBlockCache,
    ) -> Result<Self, StoreError> {
        let (key, ids) = key.unzip();
        // (The directory is made by the first append: a store that never takes a bulk write,
        // or opens on a full disk, spends no block on it.)
        let files = list(tenant, &dir)?;
        let next = files.iter().map(|f| f.number + 1).max().unwrap_or(1);
        Ok(Self {
            tenant: tenant.to_owned(),
            dir,
            env,
            key,
            ids,
            direct,
            cache,
            cache_id: AtomicU64::new(NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed)),
            next_number: AtomicU64::new(next),
            open: Mutex::new(None),
            readers: Mutex::new(HashMap::new()),
            deleting: RwLock::new(()),
            rolled: AtomicU64::new(0),
            open_number: AtomicU64::new(0),
            retiring: Arc::default(),
            pool: Mutex::new(Vec::new()),
            collecting: Mutex::new(()),
            roll_bytes: AtomicU64::new(ROLL_BYTES),
            syncing: Mutex::new(()),
        })
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(self.name_of(number))
    }

    /// Extent file `number`'s name in its directory.
    fn name_of(&self, number: u64) -> String {
        format!("{number:08}.{SUFFIX}")
    }

    /// Extent file `number` does not hold what a reference says.
    fn corrupt(&self, number: u64, detail: String) -> StoreError {
        StoreError::Corrupt {
            tenant: self.tenant.clone(),
            op: "read",
            detail: format!("extent file {}: {detail}", self.path(number).display()),
        }
    }

    fn error(&self, op: &'static str, number: u64, detail: String) -> StoreError {
        let detail = format!("extent file {}: {detail}", self.path(number).display());
        StoreError::from_detail(&self.tenant, op, detail)
    }

    /// Hands `data` (a multiple of 4 KiB) to the open extent file's writer and returns where
    /// each `span_len` bytes of it will be (a span each, the last one maybe shorter): its
    /// disk space is reserved, its bytes are written in the background (a read of the span
    /// waits for them, a sync or a memtable flush makes them durable first).
    /// After a failure the file is closed (what it held before stays readable) and the next
    /// append starts a new one: a failed append returns no span.
    pub(crate) fn append(
        &self,
        data: &[u8],
        span_len: usize,
    ) -> Result<Vec<ExtentSpan>, StoreError> {
        assert!(
            data.len().is_multiple_of(ALIGN) && !data.is_empty() && data.len() <= u32::MAX as usize
        );
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let roll = self.roll_bytes.load(Ordering::Relaxed);
        if open
            .as_ref()
            .is_some_and(|o| o.size + data.len() as u64 > roll)
        {
            self.retire_open(&mut open);
        }
        if open.is_none() {
            let number = self.next_number.fetch_add(1, Ordering::Relaxed);
            std::fs::create_dir_all(&self.dir)
                .map_err(|e| StoreError::io(&self.tenant, &self.dir, e))?;
            let reuse = self.reusable();
            let appender =
                Appender::create(self.env, &self.path(number), reuse.as_deref(), self.direct)
                    .map_err(|d| self.error("write", number, d))?;
            *open = Some(Open {
                number,
                appender,
                size: 0,
                dirty: false,
                unwritten: false,
                appended_at: Instant::now(),
            });
        }
        let o = open.as_mut().expect("opened above");
        let number = o.number;
        if let Err(detail) = o.appender.append(data) {
            tracing::warn!(tenant = %self.tenant, file = number, %detail, "extent write failed");
            *open = None; // the appender's drop closes the file
            self.rolled.fetch_add(1, Ordering::Relaxed);
            return Err(self.error("write", number, detail));
        }
        // Crash tests stop a process here: bytes handed to the file, no span returned yet.
        fail::fail_point!("extent-appended");
        let start = o.size;
        let spans = data
            .chunks(span_len.max(1))
            .enumerate()
            .map(|(nth, bytes)| ExtentSpan {
                file: number,
                offset: start + (nth * span_len) as u64,
                len: bytes.len() as u32,
                check: match bytes.len() <= MAX_PIECES * PIECE as usize {
                    true => SpanCheck::pieces(bytes),
                    false => SpanCheck::Whole(checksum(bytes)),
                },
            })
            .collect();
        o.size += data.len() as u64;
        o.dirty = true;
        o.unwritten = true;
        o.appended_at = Instant::now();
        self.open_number.store(number, Ordering::Release);
        Ok(spans)
    }

    /// Syncs and closes the open file (if any).
    fn close_open(&self, open: &mut Option<Open>) -> Result<(), StoreError> {
        if let Some(o) = open.take() {
            self.rolled.fetch_add(1, Ordering::Relaxed);
            sync_and_close(o).map_err(|(n, d)| self.error("sync", n, d))?;
        }
        self.wait_retired()
    }

    /// Closes the open file on a thread of its own (its queued writes, its sync: several
    /// milliseconds the writer that filled it need not wait for). [`Self::sync`] waits for it.
    fn retire_open(&self, open: &mut Option<Open>) {
        let Some(o) = open.take() else { return };
        self.rolled.fetch_add(1, Ordering::Relaxed);
        let retiring = Arc::clone(&self.retiring);
        retiring.0.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
        let done = move |result: Result<(), (u64, String)>| {
            let mut st = retiring.0.lock().unwrap_or_else(|p| p.into_inner());
            st.0 -= 1;
            if let Err(e) = result {
                st.1.get_or_insert(e);
            }
            retiring.1.notify_all();
        };
        let spawned =
            crate::threads::spawn("tenantfs-extent-close", move || done(sync_and_close(o)));
        if let Err(e) = spawned {
            // The closure (and the file) came back inside the error only as a panic payload:
            // nothing to do but record it; the file's drop closed it.
            tracing::warn!(tenant = %self.tenant, error = %e, "cannot start an extent file close");
        }
    }

    /// Waits for the files being closed in the background; the first failure among them
    /// (reported once, here).
    fn wait_retired(&self) -> Result<(), StoreError> {
        match self.retired_wait().1.take() {
            Some((n, d)) => Err(self.error("sync", n, d)),
            None => Ok(()),
        }
    }

    fn retired_wait(&self) -> std::sync::MutexGuard<'_, Retiring> {
        let (lock, cv) = &*self.retiring;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        while st.0 > 0 {
            st = cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st
    }

    /// Makes every span handed out durable (the open file's; closed files were synced when
    /// they were closed).
    pub(crate) fn sync(&self) -> Result<(), StoreError> {
        // One sync at a time: a second caller returns only once what it asks for is durable.
        let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        self.wait_retired()?;
        let number = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let Some(o) = open.as_mut().filter(|o| o.dirty) else {
                return Ok(());
            };
            let number = o.number;
            if let Err(d) = o.appender.wait() {
                *open = None;
                return Err(self.error("sync", number, d));
            }
            o.dirty = false;
            o.unwritten = false;
            number
        };
        // The bytes are in the file; the fdatasync needs no hold on the appender, so the
        // writer goes on meanwhile (a memtable flush syncs here, and held the writer for
        // several milliseconds per flush).
        let path = self.path(number);
        match std::fs::File::open(&path).and_then(|f| f.sync_data()) {
            Ok(()) => Ok(()),
            // Rolled over and taken by a collection since the drain: no value names it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io(&self.tenant, &path, e)),
        }
    }

    /// Waits until every span of file `number` handed out is in the file.
    fn wait_written(&self, number: u64) -> Result<(), StoreError> {
        if self.open_number.load(Ordering::Acquire) != number {
            // A file rolled over: written whole once its close is done.
            drop(self.retired_wait());
            return Ok(());
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        match open.as_mut() {
            Some(o) if o.number == number => {
                if o.unwritten {
                    if let Err(d) = o.appender.wait() {
                        *open = None;
                        return Err(self.error("write", number, d));
                    }
                    o.unwritten = false;
                }
            }
            // It rolled over since `open_number` was read: written whole once its close is.
            _ => {
                drop(open);
                drop(self.retired_wait());
            }
        }
        Ok(())
    }

    /// Closes the open file if nothing was appended to it for `idle`, so that a collection
    /// (which leaves the open file alone) can take its garbage. True if it did.
    pub(crate) fn close_if_idle(&self, idle: Duration) -> Result<bool, StoreError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.as_ref().is_none_or(|o| o.appended_at.elapsed() < idle) {
            return Ok(false);
        }
        self.close_open(&mut open)?;
        Ok(true)
    }

    /// Syncs and closes the open file and deletes the pooled ones: at the store's close.
    pub(crate) fn close(&self) -> Result<(), StoreError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for number in std::mem::take(&mut *self.pool()) {
            let _ = std::fs::remove_file(self.path(number));
        }
        self.close_open(&mut open)
    }

    /// What the same store, opened again later in this process, goes on from so that the
    /// pieces a plaintext store cached are its own: its files' ids' first part, and the next
    /// file number (a number is never given twice: a file deleted and its number given again
    /// would find the old file's pieces under its keys).
    pub fn lineage(&self) -> ExtentLineage {
        ExtentLineage {
            cache_id: self.cache_id.load(Ordering::Relaxed),
            next_number: self.next_number.load(Ordering::Relaxed),
        }
    }

    /// Goes on from `lineage`, an earlier instance's of the same store in this process,
    /// closed since and written by nobody meanwhile (its tenant's lock was held): call before
    /// the first read or append.
    pub fn go_on_from(&self, lineage: ExtentLineage) {
        self.cache_id.store(lineage.cache_id, Ordering::Relaxed);
        self.next_number
            .fetch_max(lineage.next_number, Ordering::Relaxed);
    }

    /// File `number`'s id if it is known without a disk read: the store's Env wrote or
    /// opened its header, or a reader here did (a plaintext store's: its own).
    fn known_id(&self, number: u64) -> Option<FileId> {
        let Some(ids) = &self.ids else {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&self.cache_id.load(Ordering::Relaxed).to_be_bytes());
            id[8..].copy_from_slice(&number.to_be_bytes());
            return Some(id);
        };
        ids.get(CachedFile::Extent, number)
    }

    /// File `number`'s id: opens its reader (a read of its header) if it is not known yet.
    fn file_id(&self, number: u64) -> Result<FileId, StoreError> {
        if let Some(id) = self.known_id(number) {
            return Ok(id);
        }
        self.reader(number)?;
        self.known_id(number)
            .ok_or_else(|| self.corrupt(number, "its header names no file id".into()))
    }

    fn cache_key(id: &FileId, offset: u64) -> [u8; 28] {
        file_ids::cache_key(CachedFile::Extent, id, offset)
    }

    /// Calls `f(at, bytes)` with the bytes of `part` from a disk read the ring made for the
    /// request answered again (`serving::with_reads`), if one holds them, checked; whether
    /// one did.
    fn take_made_read(&self, part: &SpanPart, f: impl FnOnce(u32, &[u8])) -> bool {
        let s = part.span;
        let Some(id) = self.known_id(s.file) else {
            return false; // nothing read yet from that file by this store
        };
        let (lo, hi) = s.cover(part.lo, part.hi);
        let key = |at: u32| Self::cache_key(&id, s.offset + u64::from(at));
        RingRead::made_bytes(&s, lo, hi, key, f).is_some()
    }

    /// Whether every byte appended to file `number` is in it now (a read need not wait).
    /// Never waits: a lock held by another (an append, a sync) counts as not written.
    fn written_now(&self, number: u64) -> bool {
        let Ok(open) = self.open.try_lock() else {
            return false;
        };
        if let Some(o) = open.as_ref().filter(|o| o.number == number) {
            return !o.unwritten;
        }
        drop(open);
        // Not the open file: written whole unless a close is still writing it.
        self.retiring.0.try_lock().is_ok_and(|r| r.0 == 0)
    }

    /// The disk read of `missed` (parts, cover start and end) of `parts`, `start..end` of
    /// file `number`, for the ring to make ([`RingRead`]).
    fn ring_read(
        &self,
        parts: &[SpanPart],
        missed: &[(usize, u32, u32)],
        number: u64,
        start: u64,
        end: u64,
    ) -> Result<RingRead, StoreError> {
        let reader = self
            .open_reader(number)
            .ok_or_else(|| self.error("read", number, "not open".into()))?;
        let id = self.file_id(number)?;
        let len = (end - start) as usize;
        let buf = AlignedBuf::new(len);
        let at = reader
            .check(start, &buf, len)
            .map_err(|d| self.error("read", number, d))?;
        let pieces = missed
            .iter()
            .map(|&(i, lo, hi)| {
                let s = parts[i].span;
                let from = (s.offset + u64::from(lo) - start) as usize;
                let key = Self::cache_key(&id, s.offset + u64::from(lo));
                (key, s, lo, from..from + (hi - lo) as usize)
            })
            .collect();
        let cache = self.cache.clone();
        Ok(RingRead::new(reader, (start, at, len), buf, cache, pieces))
    }

    /// File `number`'s reader if it is open already, without waiting for the lock of the
    /// readers (opening one reads its header from the disk).
    fn open_reader(&self, number: u64) -> Option<Arc<Reader>> {
        self.readers.try_lock().ok()?.get(&number).cloned()
    }

    fn reader(&self, number: u64) -> Result<Arc<Reader>, StoreError> {
        let readers = || self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = readers().get(&number) {
            return Ok(Arc::clone(r));
        }
        // Opened outside the lock (it reads the header from the disk): a ring request
        // looking for an open reader (`open_reader`) never waits behind it, nor behind a
        // read-ahead thread, which runs below requests. Two opened at once: the first kept.
        let r = Reader::open(self.key.as_deref(), &self.path(number), self.direct)
            .map_err(|d| self.error("read", number, d))?;
        if let (Some(ids), Some(id)) = (&self.ids, r.file_id()) {
            ids.note(CachedFile::Extent, number, id);
        }
        Ok(Arc::clone(readers().entry(number).or_insert(Arc::new(r))))
    }

    /// A guard to hold from before the lookup of spans until they are read: no file is
    /// deleted meanwhile.
    pub(crate) fn read_guard(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.deleting.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `f(i, bytes)` with the bytes of each of `spans`, from the cache or from disk (and
    /// then cached); spans of one file that lie end to end are read in one I/O. The caller
    /// holds [`Self::read_guard`] since it looked the spans up.
    pub(crate) fn read(
        &self,
        spans: &[ExtentSpan],
        mut f: impl FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        let parts: Vec<SpanPart> = spans.iter().copied().map(SpanPart::whole).collect();
        self.fetch(&parts, true, false, |i, _, bytes| f(i, bytes))
            .map(drop)
    }

    /// Calls `f(i, at, bytes)` with bytes of each of `parts` from the cache or from disk (and
    /// then cached): `bytes` are the span's from offset `at` and hold at least the part asked
    /// for (whole pieces, or the whole span: what the cache held or what a read had to take
    /// to check them). A part of a span with piece checksums costs a read of its pieces only.
    /// The caller holds [`Self::read_guard`] since it looked the spans up. Returns which
    /// parts came from the disk (by index, ascending).
    ///
    /// With `defer`, where the thread may hand its disk reads over (`serving::can_defer`),
    /// a read that misses hands them over instead and fails with [`StoreError::Deferred`]:
    /// once they are done, the same read finds its bytes in the cache.
    pub(crate) fn read_parts(
        &self,
        parts: &[SpanPart],
        defer: bool,
        f: impl FnMut(usize, u32, &[u8]),
    ) -> Result<Vec<usize>, StoreError> {
        self.fetch(parts, true, defer, f)
    }

    /// [`Self::read_parts`], caching what the disk gives only if `keep`.
    fn fetch(
        &self,
        parts: &[SpanPart],
        keep: bool,
        defer: bool,
        mut f: impl FnMut(usize, u32, &[u8]),
    ) -> Result<Vec<usize>, StoreError> {
        // Parts not in the cache: (part, cover start, cover end).
        let mut missed: Vec<(usize, u32, u32)> = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let s = p.span;
            if p.lo >= p.hi {
                continue; // nothing asked
            }
            if defer && self.take_made_read(p, |at, bytes| f(i, at, bytes)) {
                continue;
            }
            let id = self.file_id(s.file)?;
            let whole = Self::cache_key(&id, s.offset);
            let hit = self.cache.with_raw(&whole, |bytes| {
                (bytes.len() == s.len as usize).then(|| f(i, 0, bytes))
            });
            if hit.flatten().is_some() {
                continue;
            }
            let (mut lo, mut hi) = s.cover(p.lo, p.hi);
            if (lo, hi) != (0, s.len) {
                // Pieces cached by an earlier read of this part.
                let key = Self::cache_key(&id, s.offset + u64::from(lo));
                let hit = self.cache.with_raw(&key, |bytes| {
                    (bytes.len() >= (hi - lo) as usize).then(|| f(i, lo, bytes))
                });
                if hit.flatten().is_some() {
                    continue;
                }
                // Another part of it missed lately: its pieces are wanted, read it whole.
                if keep && self.cache.part_missed_again(&whole) {
                    (lo, hi) = (0, s.len);
                }
            }
            missed.push((i, lo, hi));
        }
        let start_of = |&(i, lo, _): &(usize, u32, u32)| {
            let s = parts[i].span;
            (s.file, s.offset + u64::from(lo))
        };
        missed.sort_by_key(start_of);
        // Disk reads: missed parts `at..upto`, of one file, end to end, `start..end`.
        let mut runs: Vec<(usize, usize, u64, u64, u64)> = Vec::new();
        let mut at = 0;
        while at < missed.len() {
            let (file, start) = start_of(&missed[at]);
            let mut end = start + u64::from(missed[at].2 - missed[at].1);
            let mut upto = at + 1;
            while upto < missed.len() {
                let (f2, s2) = start_of(&missed[upto]);
                if f2 != file || s2 != end || end - start >= MAX_READ {
                    break;
                }
                end += u64::from(missed[upto].2 - missed[upto].1);
                upto += 1;
            }
            runs.push((at, upto, file, start, end));
            at = upto;
        }
        if keep
            && defer
            && !runs.is_empty()
            && crate::serving::can_defer(runs.len())
            && runs
                .iter()
                .all(|r| self.written_now(r.2) && self.open_reader(r.2).is_some())
        {
            let reads = runs
                .iter()
                .map(|&(at, upto, file, start, end)| {
                    self.ring_read(parts, &missed[at..upto], file, start, end)
                })
                .collect::<Result<Vec<_>, _>>()?;
            for read in reads {
                crate::serving::defer(Box::new(read));
            }
            super::foreground::note();
            return Err(StoreError::Deferred {
                tenant: self.tenant.clone(),
            });
        }
        for &(at, upto, file, start, end) in &runs {
            crate::serving::will_wait();
            self.wait_written(file)?;
            if keep {
                super::foreground::note();
            }
            let reader = self.reader(file)?;
            let len = (end - start) as usize;
            let mut buf = read_buffer(len);
            let n = reader
                .read(start, &mut buf, len)
                .map_err(|d| self.error("read", file, d))?;
            if n < len {
                return Err(self.corrupt(
                    file,
                    format!(
                        "it ends at {} bytes, a reference names {} bytes from {}",
                        start + n as u64,
                        len,
                        start
                    ),
                ));
            }
            for &(i, lo, hi) in &missed[at..upto] {
                let s = parts[i].span;
                let from = (s.offset + u64::from(lo) - start) as usize;
                let bytes = &buf[from..from + (hi - lo) as usize];
                if !s.verify(lo, bytes) {
                    // Read whole for its other parts' sake: the pieces asked for may be whole.
                    let (plo, phi) = s.cover(parts[i].lo, parts[i].hi);
                    let asked = &bytes[(plo - lo) as usize..(phi - lo) as usize];
                    if (plo, phi) != (lo, hi) && s.verify(plo, asked) {
                        tracing::warn!(
                            tenant = %self.tenant,
                            file = %self.path(s.file).display(),
                            offset = s.offset,
                            len = s.len,
                            "a piece of this extent span does not match its checksum; \
                             the pieces asked for do and were served"
                        );
                        f(i, plo, asked);
                        continue;
                    }
                    let detail = format!(
                        "the {} bytes at {} do not match their checksum",
                        phi - plo,
                        s.offset + u64::from(plo)
                    );
                    return Err(self.corrupt(s.file, detail));
                }
                if keep {
                    let id = self.file_id(s.file)?;
                    self.cache
                        .insert_raw(&Self::cache_key(&id, s.offset + u64::from(lo)), bytes);
                }
                f(i, lo, bytes);
            }
            keep_read_buffer(buf);
        }
        let mut from_disk: Vec<usize> = missed.iter().map(|&(i, _, _)| i).collect();
        from_disk.sort_unstable();
        Ok(from_disk)
    }

    /// Caches `bytes` as the bytes of `span`: what a read of the span does, and what a writer
    /// does for bytes it just handed to [`Self::append`] that were read a moment ago and will
    /// be again (a fold's merged chunk), so that rewriting them costs their readers no disk
    /// read.
    pub(crate) fn keep_cached(&self, span: &ExtentSpan, bytes: &[u8]) {
        // (The file was just written through the store's Env: its id is known.)
        if let Some(id) = self
            .known_id(span.file)
            .filter(|_| bytes.len() == span.len as usize)
        {
            self.cache
                .insert_raw(&Self::cache_key(&id, span.offset), bytes);
        }
    }

    /// The host cache's capacity in bytes.
    pub(crate) fn cache_capacity(&self) -> u64 {
        self.cache.capacity() as u64
    }

    /// Drops the cached bytes of `span`, which no value names any more (a fold replaced it):
    /// they would otherwise stay until evicted, and push out bytes still read.
    pub(crate) fn forget_cached(&self, span: &ExtentSpan) {
        if let Some(id) = self.known_id(span.file) {
            self.cache.erase_raw(&Self::cache_key(&id, span.offset));
        }
    }

    /// Whether the bytes of `span` are in the cache (whole).
    pub(crate) fn is_cached(&self, span: &ExtentSpan) -> bool {
        self.cached_len(span.file, span.offset).is_some()
    }

    /// How many bytes from `offset` of file `file` the cache holds under that offset.
    pub(crate) fn cached_len(&self, file: u64, offset: u64) -> Option<usize> {
        let key = Self::cache_key(&self.known_id(file)?, offset);
        self.cache.with_raw(&key, |bytes| bytes.len())
    }

    /// [`Self::read`] for bytes about to be moved to another file: what the disk gives is not
    /// cached (its spans are garbage once moved, and would push out what is read again).
    pub(crate) fn read_to_move(
        &self,
        spans: &[ExtentSpan],
        mut f: impl FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        let parts: Vec<SpanPart> = spans.iter().copied().map(SpanPart::whole).collect();
        self.fetch(&parts, false, false, |i, _, bytes| f(i, bytes))
            .map(drop)
    }

    /// Rolls files over past `bytes` instead of [`ROLL_BYTES`] (tests).
    #[cfg(test)]
    pub(crate) fn set_roll_bytes(&self, bytes: u64) {
        self.roll_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Files closed since open: a collection can free nothing before the first.
    pub(crate) fn rolled(&self) -> u64 {
        self.rolled.load(Ordering::Relaxed)
    }

    pub(crate) fn stats(&self) -> ExtentFileStats {
        let files = list(&self.tenant, &self.dir).unwrap_or_default();
        ExtentFileStats {
            files: files.len() as u64,
            bytes: files.iter().map(|f| f.bytes).sum(),
        }
    }
}

thread_local! {
    /// Each reading thread's buffer for extent reads, kept from one read to the next (a
    /// fresh one is faulted in and zeroed: 256 page faults per MiB read).
    static READ_BUFFER: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// A buffer of at least `len` bytes: the thread's kept one if it is large enough.
fn read_buffer(len: usize) -> AlignedBuf {
    match READ_BUFFER.take() {
        Some(b) if b.len() >= len => b,
        _ => AlignedBuf::new(len.max(MAX_READ as usize)),
    }
}

fn keep_read_buffer(buf: AlignedBuf) {
    READ_BUFFER.set(Some(buf));
}
