//! The disk work a store does in the background for its tenant: flushes and compactions
//! (blob collection is one), reported by the shim's listener as they write files and finish,
//! and extent collection and folds, reported by the volume. Each report goes, as it is done,
//! to the account of whoever serves the tenant: the mount or block device charges it to the
//! tenant's byte limit (`io_limits`) and counts it. With no account (a store opened for a
//! command), nothing is charged.
//!
//! RocksDB's flushes and compactions run on threads all stores share and are never held. The
//! volume's own background work (folds, extent and blob collection) runs on threads of the
//! tenant's own, so it waits ([`BackgroundWork::hold`]) while the tenant is in debt, up to
//! [`MAX_HOLD`] before each pass or collection starts: a tenant's folds then go at about the
//! pace its limit gives, and a tenant that stops writing does not leave work beyond its
//! limit behind it unpaid. A volume that closes meanwhile does not start the held work.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The most one piece of the volume's own background work waits for the tenant's debt (it
/// then runs anyway: collections give space back).
pub const MAX_HOLD: Duration = Duration::from_secs(10);

/// Whoever charges a tenant for its background work.
pub trait BackgroundAccount: Send + Sync {
    /// `bytes` moved to or from the disk by work that began at `started`.
    fn charge(&self, bytes: u64, started: Instant);
    /// How long the tenant's own background work should wait before its next piece, if at
    /// all (a wait of its limit's debt).
    fn due_in(&self) -> Option<Duration>;
}

/// An account shared by every store opened for one mount or device.
pub type BackgroundSink = Arc<dyn BackgroundAccount>;

/// Where one open store reports its background work.
#[derive(Default)]
pub struct BackgroundWork {
    sink: OnceLock<BackgroundSink>,
}

impl std::fmt::Debug for BackgroundWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundWork")
            .field("sink", &self.sink.get().is_some())
            .finish()
    }
}

impl BackgroundWork {
    /// From now on, reports go to `sink` (once per open store; later calls are ignored).
    pub fn set_sink(&self, sink: BackgroundSink) {
        let _ = self.sink.set(sink);
    }

    /// `bytes` moved to or from the disk by work that began at `started`.
    pub fn report(&self, bytes: u64, started: Instant) {
        if bytes > 0 {
            if let Some(sink) = self.sink.get() {
                sink.charge(bytes, started);
            }
        }
    }

    /// Waits while the tenant is in debt, [`MAX_HOLD`] at most, or until `stop` says so;
    /// whether the work is to go on (false: `stop` ended a wait, the work is not to start).
    pub fn hold(&self, stop: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        let Some(sink) = self.sink.get() else {
            return true;
        };
        while let Some(wait) = sink.due_in() {
            if stop() {
                return false;
            }
            let left = MAX_HOLD.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            // In short steps, so that a closing volume is not kept waiting.
            std::thread::sleep(wait.min(left).min(Duration::from_millis(100)));
        }
        true
    }
}

/// An account that counts what it is charged and never holds anything (tests).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct CountingAccount {
    pub(crate) bytes: std::sync::atomic::AtomicU64,
    /// Reports of work that began after they were made.
    pub(crate) from_the_future: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
impl BackgroundAccount for CountingAccount {
    fn charge(&self, bytes: u64, started: Instant) {
        use std::sync::atomic::Ordering::Relaxed;
        self.bytes.fetch_add(bytes, Relaxed);
        if started > Instant::now() {
            self.from_the_future.fetch_add(1, Relaxed);
        }
    }
    fn due_in(&self) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts charges; in debt for its first `debt_calls` questions, 30 ms each.
    #[derive(Default)]
    struct Counted {
        bytes: AtomicU64,
        debt_calls: AtomicU64,
    }

    impl BackgroundAccount for Counted {
        fn charge(&self, bytes: u64, _: Instant) {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        fn due_in(&self) -> Option<Duration> {
            let left = self.debt_calls.load(Ordering::Relaxed);
            (left > 0).then(|| {
                self.debt_calls.store(left - 1, Ordering::Relaxed);
                Duration::from_millis(30)
            })
        }
    }

    #[test]
    fn reports_reach_the_first_sink_only_once_set() {
        let work = BackgroundWork::default();
        work.report(10, Instant::now());
        assert!(work.hold(|| true), "no account: no hold");
        let (first, second) = (Arc::new(Counted::default()), Arc::new(Counted::default()));
        work.set_sink(first.clone());
        work.set_sink(second.clone());
        work.report(4096, Instant::now());
        work.report(0, Instant::now());
        assert_eq!(first.bytes.load(Ordering::Relaxed), 4096);
        assert_eq!(second.bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_hold_lasts_while_the_tenant_is_in_debt_or_until_stopped() {
        let work = BackgroundWork::default();
        let account = Arc::new(Counted::default());
        work.set_sink(account.clone());
        assert!(
            work.hold(|| true),
            "no debt: it goes on, whatever `stop` says"
        );
        account.debt_calls.store(3, Ordering::Relaxed);
        let start = Instant::now();
        assert!(work.hold(|| false));
        assert!(
            start.elapsed() >= Duration::from_millis(90),
            "{:?}",
            start.elapsed()
        );
        account.debt_calls.store(1000, Ordering::Relaxed);
        let start = Instant::now();
        assert!(
            !work.hold(|| true),
            "stopped while in debt: the work does not start"
        );
        assert!(
            start.elapsed() < Duration::from_millis(20),
            "{:?}",
            start.elapsed()
        );
    }
}
