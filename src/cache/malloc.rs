//! Tuning glibc's malloc for a serving process.
//!
//! The caches own their memory (slabs), but request buffers (a FUSE read's reply, up to 1 MiB)
//! and the store's write path (a write batch of up to 1 MiB, memtable arena blocks of 1 MiB,
//! the encrypted file writer's buffers) come from malloc. With one arena per thread and a mmap
//! threshold that rises after each large free, glibc keeps those buffers in many arenas and
//! never gives them back: measured, a daemon serving 50 tenants grew to 2.6 GiB RSS for 0.6 GiB
//! of caches. Two arenas bring it to 0.63 GiB (tests/base_daemon_cache.rs).
//!
//! The mmap threshold is fixed at 4 MiB. At 128 KiB (the setting until data format 3) every
//! 1 MiB batch, arena block and cipher buffer was a fresh mapping, faulted in page by page and
//! unmapped on free: 1.3 million minor faults per GiB written, half the daemon's CPU on a
//! streaming write. At 4 MiB they are reused from the two arenas: 0.2-0.36 million faults,
//! 1.2-1.7 instead of 3.0-3.2 CPU seconds per GiB, 570-650 instead of 400 MiB/s
//! (docs/decisions/0004-64k-chunks-and-malloc-threshold.md).
//! What the arenas then hold free after a burst (about the size of the write buffers) goes
//! back to the kernel with [`give_back_free_heap`]: on release, unmount, a budget cut by the
//! memory governor, and every [`GIVE_BACK_EVERY`] from the governor's tick.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the governor's tick returns malloc's free pages (at most).
pub const GIVE_BACK_EVERY: Duration = Duration::from_secs(10);
/// Allocations from this size up are mmap'd and unmapped on free.
const MMAP_THRESHOLD: i32 = 4 << 20;

/// Applies the settings to this process; call before threads start. Returns whether glibc
/// took both.
pub fn tune_for_serving() -> bool {
    let mut ok = true;
    for (param, value) in [
        (libc::M_ARENA_MAX, 2),
        (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ] {
        // SAFETY: mallopt only changes allocator parameters; glibc accepts it at any time and
        // the values are within its documented ranges.
        ok &= unsafe { libc::mallopt(param, value) } == 1;
    }
    if !ok {
        tracing::warn!("glibc did not take the malloc settings; request buffers may stay resident");
    }
    ok
}

/// Returns malloc's free pages to the kernel (all arenas, also those inside the heap). A
/// closed tenant store frees a few hundred KiB of small allocations that glibc keeps for
/// reuse, so a daemon whose tenants come and go would otherwise hold its high-water mark
/// (measured: 445 KiB per unmounted tenant kept, 100 after trimming; examples/
/// bench_idle_mounts.rs). It walks every arena under its lock: for rare events (unmount,
/// an operator's release), not hot paths. Returns whether any memory was given back.
pub fn give_back_free_heap() -> bool {
    // SAFETY: malloc_trim only inspects glibc's own arenas under their locks and madvises
    // free pages; it has no preconditions on the caller.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// [`give_back_free_heap`] unless it ran less than [`GIVE_BACK_EVERY`] ago (any caller):
/// for periodic callers. Returns whether it ran.
pub fn give_back_free_heap_now_and_then() -> bool {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let last = LAST.load(Ordering::Relaxed);
    if now < last + GIVE_BACK_EVERY.as_secs()
        || LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return false;
    }
    give_back_free_heap();
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_settings() {
        assert!(super::tune_for_serving());
        // A large buffer is then mmap'd: allocating and freeing it leaves no arena growth that
        // the test could see cheaply, so this checks only that the call is accepted.
        drop(vec![1u8; 1 << 20]);
    }

    #[test]
    fn periodic_give_back_runs_once_per_period() {
        // Whichever call comes first in this process runs; the next one within the period
        // does not.
        super::give_back_free_heap_now_and_then();
        assert!(!super::give_back_free_heap_now_and_then());
    }
}
