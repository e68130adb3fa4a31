//! Whether a tenant waited on the disk lately: a read that missed the cache, an fsync.
//!
//! Why: a bulk writer's large writes delay every small read and sync queued behind them on
//! the disk. Measured on this host's virtio disk (fio, host ext4, O_DIRECT), a QD1 4 KiB
//! reader kept 3.8-4.4k IOPS of its 12.2k beside 1 MiB writes and 9.0-9.5k beside 256 KiB
//! ones; but through the daemon, 256 KiB writes cost a streaming writer alone 19% of its
//! throughput (four syscalls and virtio notifications per MiB where one did). So the store
//! files' writer threads (`pipelined_writes.cc`) write in small pieces only while someone
//! waits on the disk: this says whether anyone did within the last [`WINDOW`].

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
}
