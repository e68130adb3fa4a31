//! Whether a tenant store takes writes, as RocksDB reports it.
//!
//! RocksDB stops a store's writes on a background error of hard severity: a WAL append, flush
//! or MANIFEST write that failed. A full disk is the common one, and it is temporary: reads go
//! on, writes fail with ENOSPC, and the store takes writes again once it is resumed. RocksDB's
//! own recovery for it waits until the disk has a whole memtable budget free (64 MiB per
//! store), so tenantfs turns that off (in the shim's listener) and resumes the store itself
//! once there is room ([`super::TenantDb::try_resume`]). Every change of state is logged once,
//! and `tenantfs stats` shows the state of each mounted tenant.
//!
//! The listener that reports these holds the store's health, so the health also carries what
//! the listener's other reports go to: the flush barrier and the background work's account.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// At most one resume attempt per store in this time.
const RESUME_INTERVAL: Duration = Duration::from_secs(1);

/// A store's write state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum StoreState {
    Writable,
    /// Its filesystem filled up: reads go on, writes fail with ENOSPC until space is freed.
    /// The store is resumed by itself once its filesystem has `needs_free_bytes` free (what
    /// its unflushed writes take plus a margin); `free_bytes` is what it had when last checked.
    NoSpace {
        since_unix: u64,
        detail: String,
        free_bytes: u64,
        needs_free_bytes: u64,
    },
    /// RocksDB stopped it for another error: reads go on; remount the tenant to recover.
    Failed {
        since_unix: u64,
        detail: String,
    },
}

impl StoreState {
    /// One word for tables.
    pub fn label(&self) -> &'static str {
        match self {
            StoreState::Writable => "rw",
            StoreState::NoSpace { .. } => "full",
            StoreState::Failed { .. } => "failed",
        }
    }
}

/// The shared state of one store, updated from RocksDB's threads.
#[derive(Debug)]
pub struct StoreHealth {
    tenant: String,
    /// Fast check for the write path: the store stopped for lack of space.
    no_space: AtomicBool,
    inner: Mutex<Inner>,
    /// What must be durable before any memtable is flushed (the extent files that the
    /// memtables' values name), run by the listener as each flush begins.
    flush_barrier: std::sync::OnceLock<FlushBarrier>,
    /// Where the store's flushes and compactions are reported as background work.
    background: super::background::BackgroundWork,
}

/// See [`StoreHealth::set_flush_barrier`].
struct FlushBarrier(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for FlushBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlushBarrier")
    }
}

#[derive(Debug)]
struct Inner {
    state: StoreState,
    last_attempt: Option<Instant>,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl StoreHealth {
    pub(crate) fn new(tenant: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            no_space: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                state: StoreState::Writable,
                last_attempt: None,
            }),
            flush_barrier: std::sync::OnceLock::new(),
            background: Default::default(),
        }
    }

    /// Where the store's background work is reported.
    pub(crate) fn background(&self) -> &super::background::BackgroundWork {
        &self.background
    }

    /// Sets what runs before each memtable flush (once; later calls are ignored).
    pub(crate) fn set_flush_barrier(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.flush_barrier.set(FlushBarrier(Box::new(f)));
    }

    /// A memtable flush is about to write: runs the flush barrier.
    pub(crate) fn flush_begins(&self) {
        if let Some(FlushBarrier(f)) = self.flush_barrier.get() {
            f();
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> StoreState {
        self.inner().state.clone()
    }

    /// The store stopped taking writes (`no_space`: because its filesystem is full).
    pub(crate) fn stopped(&self, no_space: bool, detail: &str) {
        let mut inner = self.inner();
        match (&inner.state, no_space) {
            (StoreState::NoSpace { .. }, true) | (StoreState::Failed { .. }, _) => return,
            _ => {}
        }
        let since_unix = now_unix();
        let detail = detail.to_owned();
        if no_space {
            tracing::warn!(
                tenant = %self.tenant,
                %detail,
                "tenant is read-only: its filesystem is full. Reads go on; writes fail with \
                 ENOSPC and resume by themselves once space is freed (delete other tenants or \
                 files on that filesystem)"
            );
            inner.state = StoreState::NoSpace {
                since_unix,
                detail,
                free_bytes: 0,
                needs_free_bytes: 0,
            };
            self.no_space.store(true, Ordering::Release);
        } else {
            tracing::error!(
                tenant = %self.tenant,
                %detail,
                "tenant stopped taking writes; reads go on; remount it to recover"
            );
            inner.state = StoreState::Failed { since_unix, detail };
            self.no_space.store(false, Ordering::Release);
        }
    }

    /// The store takes writes again.
    pub(crate) fn resumed(&self) {
        let mut inner = self.inner();
        if inner.state != StoreState::Writable {
            tracing::info!(tenant = %self.tenant, "tenant takes writes again");
            inner.state = StoreState::Writable;
            self.no_space.store(false, Ordering::Release);
        }
    }

    /// Records what a stopped store has free and needs free to be resumed; says so in the log
    /// the first time it is known.
    pub(crate) fn space(&self, free: u64, needs: u64) {
        let mut inner = self.inner();
        if let StoreState::NoSpace {
            free_bytes,
            needs_free_bytes,
            ..
        } = &mut inner.state
        {
            if *needs_free_bytes == 0 {
                tracing::warn!(
                    tenant = %self.tenant,
                    free_mib = free >> 20,
                    needs_free_mib = needs.div_ceil(1 << 20),
                    "tenant takes writes again once its filesystem has this much free"
                );
            }
            *free_bytes = free;
            *needs_free_bytes = needs;
        }
    }

    /// Whether the store stopped for lack of space (one atomic load: for the write path).
    pub(crate) fn is_no_space(&self) -> bool {
        self.no_space.load(Ordering::Acquire)
    }

    /// Whether a resume attempt may run now (at most one per [`RESUME_INTERVAL`]); if so,
    /// counts this one.
    pub(crate) fn resume_due(&self) -> bool {
        let mut inner = self.inner();
        let now = Instant::now();
        if inner
            .last_attempt
            .is_some_and(|t| now.duration_since(t) < RESUME_INTERVAL)
        {
            return false;
        }
        inner.last_attempt = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_change_once_and_come_back() {
        let h = StoreHealth::new("t");
        assert_eq!(h.state(), StoreState::Writable);
        h.stopped(true, "IO error: No space left on device");
        assert!(h.is_no_space());
        let StoreState::NoSpace { since_unix, .. } = h.state() else {
            panic!("{:?}", h.state())
        };
        h.stopped(true, "again");
        h.space(10 << 20, 50 << 20);
        assert_eq!(
            h.state(),
            StoreState::NoSpace {
                since_unix,
                detail: "IO error: No space left on device".into(),
                free_bytes: 10 << 20,
                needs_free_bytes: 50 << 20,
            },
            "a repeated report keeps the first one"
        );
        h.resumed();
        assert_eq!(h.state(), StoreState::Writable);
        assert!(!h.is_no_space());
        // Any other error sticks: only a remount clears it.
        h.stopped(false, "Corruption: bad block");
        h.stopped(true, "IO error: No space left on device");
        assert_eq!(h.state().label(), "failed");
        assert!(!h.is_no_space());
    }

    #[test]
    fn resume_attempts_are_rate_limited() {
        let h = StoreHealth::new("t");
        assert!(h.resume_due());
        assert!(!h.resume_due());
    }
}
