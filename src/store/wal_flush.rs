//! When a logged write's WAL record leaves RocksDB's in-process buffer for the WAL file.
//!
//! Stores are opened with `manual_wal_flush`: a write appends its record to the WAL writer's
//! buffer, and the buffer reaches the file (the kernel's page cache: a WAL is synced only by
//! `fsync`) when tenantfs writes it out. By default ([`WalFlush::immediate`]) that happens
//! before the write returns, as without the option: every acknowledged write survives a kill
//! of the daemon. Block devices need exactly that (ublk reissues the requests in flight after
//! a kill, not the ones answered), and so do the store's own records.
//!
//! A FUSE mount defers it ([`WalFlush::defer`]): a flusher thread writes the buffer out every
//! [`FLUSH_EVERY`]. Copying a small write's record into the page cache was half of a FUSE
//! WRITE's time in the daemon (issue 12: an untar's 36,694 WRITEs of up to 10 KiB), spent on
//! the thread that answers the request and so on the caller's CPU while the caller waits; the
//! flusher does it on another CPU, many records at a time. The price is a kill -9's window:
//! the acknowledged, unsynced writes of the last interval are lost with the process, as a
//! machine's crash loses what its page cache had not written (fsync writes the buffer and
//! syncs first: nothing synced is lost). The thread runs only while writes come: it ends
//! after [`IDLE_EXIT`] without one, and the next write starts another, so an idle mount
//! keeps no thread for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rocksdb::DB;

/// How long a deferred WAL record may wait in the buffer: the most a kill -9 loses.
pub const FLUSH_EVERY: Duration = Duration::from_micros(500);

/// A flusher that found nothing to write for this long ends.
const IDLE_EXIT: Duration = Duration::from_secs(1);

/// One store's WAL flushing: immediate, or deferred to a flusher thread.
pub(crate) struct WalFlush {
    shared: Arc<Shared>,
    deferred: AtomicBool,
}

struct Shared {
    /// A record was appended since the flusher last wrote the buffer out.
    dirty: AtomicBool,
    state: Mutex<State>,
    closing: Condvar,
}

#[derive(Default)]
struct State {
    /// The flusher thread, if one was started (it may have ended since: `running` says).
    thread: Option<JoinHandle<()>>,
    running: bool,
    closed: bool,
}

impl WalFlush {
    /// Every write's record is in the WAL file before the write returns.
    pub(crate) fn immediate() -> Self {
        Self {
            shared: Arc::new(Shared {
                dirty: AtomicBool::new(false),
                state: Mutex::new(State::default()),
                closing: Condvar::new(),
            }),
            deferred: AtomicBool::new(false),
        }
    }

    /// From now on a write's record reaches the WAL file within [`FLUSH_EVERY`].
    pub(crate) fn defer(&self) {
        self.deferred.store(true, Ordering::Release);
    }

    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred.load(Ordering::Acquire)
    }

    /// After a logged write to `db` returned: writes the buffer out now, or makes sure the
    /// flusher will. An error is the immediate flush's (the write's record is in the memtable:
    /// readable, and durable once the memtable is flushed).
    pub(crate) fn written(&self, db: &Arc<DB>, tenant: &str) -> Result<(), rocksdb::Error> {
        if !self.is_deferred() {
            return db.flush_wal(false);
        }
        // Only the write that makes the buffer dirty looks at the thread; the flusher clears
        // the mark before it writes, so a record appended after that write is marked again.
        if !self.shared.dirty.swap(true, Ordering::AcqRel) {
            self.start_flusher(db, tenant);
        }
        Ok(())
    }

    fn start_flusher(&self, db: &Arc<DB>, tenant: &str) {
        let mut state = self.shared.lock();
        if state.running || state.closed {
            return;
        }
        if let Some(ended) = state.thread.take() {
            let _ = ended.join();
        }
        let (shared, owned, name) = (self.shared.clone(), Arc::clone(db), tenant.to_owned());
        match std::thread::Builder::new()
            .name("wal-flusher".into())
            .spawn(move || flusher(&shared, &owned, &name))
        {
            Ok(thread) => {
                state.thread = Some(thread);
                state.running = true;
            }
            // The record stays buffered until the next write finds a thread, an fsync or the
            // close: write it out now rather than leave it there.
            Err(e) => {
                tracing::warn!(tenant, error = %e, "cannot start a WAL flusher; flushing inline");
                self.shared.dirty.store(false, Ordering::Release);
                if let Err(e) = db.flush_wal(false) {
                    tracing::warn!(tenant, error = %e, "WAL flush failed");
                }
            }
        }
    }

    /// Stops the flusher (before the store closes, which writes the buffer out itself).
    pub(crate) fn stop(&self) {
        let thread = {
            let mut state = self.shared.lock();
            state.closed = true;
            self.shared.closing.notify_all();
            state.thread.take()
        };
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The flusher thread: every [`FLUSH_EVERY`], writes the buffer out if a record came; ends
/// when the store closes or after [`IDLE_EXIT`] without a record.
fn flusher(shared: &Shared, db: &DB, tenant: &str) {
    let mut last = Instant::now();
    loop {
        {
            let state = shared.lock();
            let (state, _) = shared
                .closing
                .wait_timeout_while(state, FLUSH_EVERY, |s| !s.closed)
                .unwrap_or_else(|p| p.into_inner());
            if state.closed {
                return;
            }
        }
        if shared.dirty.swap(false, Ordering::AcqRel) {
            last = Instant::now();
            fail::fail_point!("wal-flush-begins");
            // A failed write of the WAL is RocksDB's background error: the store stops (a
            // full disk makes it read-only until there is room), the next write or fsync
            // reports it, and the records stay in the memtable, flushed when it resumes.
            if let Err(e) = db.flush_wal(false) {
                tracing::warn!(tenant, error = %e, "WAL flush failed");
            }
            fail::fail_point!("wal-flushed");
        } else if last.elapsed() >= IDLE_EXIT {
            let mut state = shared.lock();
            // Checked under the lock a writer takes to start a thread: a record marked after
            // this either is seen here or finds `running` false and starts the next flusher.
            if !shared.dirty.load(Ordering::Acquire) {
                state.running = false;
                return;
            }
        }
    }
}
