//! Whether a tenant waited on the disk lately: a read that missed the cache, an fsync.
//!
//! Why: a bulk writer's large writes delay every small read and sync queued behind them on
//! the disk. Measured on this host's virtio disk (fio, host ext4, O_DIRECT), a QD1 4 KiB
//! reader kept 3.8-4.4k IOPS of its 12.2k beside 1 MiB writes and 9.0-9.5k beside 256 KiB
//! ones; but through the daemon, 256 KiB writes cost a streaming writer alone 19% of its
//! throughput (four syscalls and virtio notifications per MiB where one did). So the store
//! files' writer threads (`pipelined_writes.cc`) write in small pieces only while someone
//! waits on the disk: this says whether anyone did within the last [`WINDOW`]. And while a
//! WAL sync runs, they hold their next write briefly ([`hold_for_syncs`]): on ext4 the sync of
//! a growing WAL is a journal commit, which bulk writes beside it slow down.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a wait on the disk counts as "lately": many reads of a QD1 reader, and short
/// enough that a writer alone is back to its large writes at once.
const WINDOW: Duration = Duration::from_millis(20);

static START: OnceLock<Instant> = OnceLock::new();
/// Microseconds from [`START`] to the last wait noted, plus one (0: none yet).
static LAST: AtomicU64 = AtomicU64::new(0);

fn now_us() -> u64 {
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// Notes that a tenant is waiting on the disk now.
pub(crate) fn note() {
    LAST.store(now_us(), Ordering::Relaxed);
}

/// Whether a tenant waited on the disk within the last [`WINDOW`].
pub(crate) fn recent() -> bool {
    let last = LAST.load(Ordering::Relaxed);
    last != 0 && now_us().saturating_sub(last) <= WINDOW.as_micros() as u64
}

/// WAL syncs running now: while one runs, the store files' writer threads hold their next
/// write (for [`MAX_HOLD`] at most), since an fsync of a growing file is a journal commit,
/// which O_DIRECT writes into preallocated space beside it slow down.
static SYNCS: AtomicU64 = AtomicU64::new(0);
/// The longest a writer thread holds a write for syncs. bench_neighbours, a QD1 tenant's
/// fsync'd 4 KiB writes beside a tenant writing 1 MiB flat out: without holds 45% of its IOPS
/// lost, p99 4.6x; holds of 2 ms: 14%, 0.9x, the writer 1,200 -> 284 MiB/s; 500 us: 22%,
/// 1.6x, the writer 466 MiB/s; 250 us: 14-31%, the writer 525-546 MiB/s. A writer alone
/// holds nothing.
const MAX_HOLD: Duration = Duration::from_micros(500);

/// A WAL sync running; the writers hold their writes until it is dropped.
pub(crate) struct Syncing(());

/// Marks a WAL sync as running until the guard is dropped.
pub(crate) fn syncing() -> Syncing {
    SYNCS.fetch_add(1, Ordering::AcqRel);
    Syncing(())
}

impl Drop for Syncing {
    fn drop(&mut self) {
        SYNCS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits while a WAL sync runs, [`MAX_HOLD`] at most (a store file's writer thread, before a
/// write).
pub(crate) fn hold_for_syncs() {
    if SYNCS.load(Ordering::Acquire) == 0 {
        return;
    }
    let start = Instant::now();
    while SYNCS.load(Ordering::Acquire) > 0 && start.elapsed() < MAX_HOLD {
        std::thread::sleep(Duration::from_micros(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_counts_for_the_window_only() {
        note();
        assert!(recent());
        std::thread::sleep(WINDOW + Duration::from_millis(30));
        // (Another test of this process may note a wait meanwhile: only the fresh note is
        // asserted on when none came.)
        if now_us() - LAST.load(Ordering::Relaxed) > WINDOW.as_micros() as u64 {
            assert!(!recent());
        }
        note();
        assert!(recent());
    }

    #[test]
    fn a_write_is_held_while_a_sync_runs_and_no_longer_than_the_bound() {
        // No sync: no hold (nothing to wait for, whatever the clock says).
        hold_for_syncs();
        let sync = syncing();
        assert!(SYNCS.load(Ordering::Acquire) >= 1);
        // A sync that never ends holds a write for the bound, not for good.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            hold_for_syncs();
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a write held for good by a sync");
        drop(sync);
    }
}
