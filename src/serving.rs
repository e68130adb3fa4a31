//! The thread that answers a request, and what it owes the other tenants before it waits.
//!
//! Why: the FUSE ring's threads are shared by every mount of the host (one leading thread per
//! CPU takes the requests of all of them, `fuse::ring`). A request that waits (on the disk, an
//! fsync, its tenant's I/O limit or its turn in the fair queue) would hold every other
//! tenant's requests on that CPU behind it. So the places that wait say so first
//! ([`will_wait`]), as does a write or copy large enough to keep the CPU for long
//! (`fuse::dispatch::LONG_REQUEST_BYTES`), and the thread gives its lead to another before it
//! blocks: the other tenants' requests go on while this one waits, and a request that never
//! waits (a cached read, a lookup) costs no thread switch at all.
//!
//! How: a thread that leads sets a [`Lead`] for the request it answers ([`leading`]); the
//! first [`will_wait`] of the request hands the lead on, once. A thread that leads nothing
//! (a /dev/fuse worker, a block device queue, a test) makes [`will_wait`] a no-op.

use std::cell::Cell;

/// Something that gives up a lead when its thread is about to wait.
pub trait Lead: Sync {
    /// The thread that took the lead as `term` is about to wait: let another lead.
    fn give_up(&'static self, term: u64);
}

thread_local! {
    static LEADING: Cell<Option<(&'static dyn Lead, u64)>> = const { Cell::new(None) };
}

/// The calling thread answers a request while holding `lead` (taken as `term`) until the
/// guard is dropped.
pub fn leading(lead: &'static dyn Lead, term: u64) -> Leading {
    LEADING.with(|l| l.set(Some((lead, term))));
    Leading(())
}

/// Clears the calling thread's lead when dropped.
pub struct Leading(());

impl Drop for Leading {
    fn drop(&mut self) {
        LEADING.with(|l| l.set(None));
    }
}

/// The calling thread is about to wait (a disk read, an fsync, a limit): if it leads, it
/// gives the lead to another thread first.
pub fn will_wait() {
    if let Some((lead, term)) = LEADING.with(|l| l.take()) {
        lead.give_up(term);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Counted(AtomicU64);

    impl Lead for Counted {
        fn give_up(&'static self, term: u64) {
            self.0.fetch_add(term, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_lead_is_given_up_once_and_only_by_its_thread() {
        static LEAD: Counted = Counted(AtomicU64::new(0));
        will_wait();
        assert_eq!(
            LEAD.0.load(Ordering::Relaxed),
            0,
            "no lead: nothing to give"
        );
        {
            let _l = leading(&LEAD, 5);
            std::thread::spawn(will_wait).join().unwrap();
            assert_eq!(
                LEAD.0.load(Ordering::Relaxed),
                0,
                "another thread leads nothing"
            );
            will_wait();
            will_wait();
            assert_eq!(LEAD.0.load(Ordering::Relaxed), 5, "given up once");
        }
        let _l = leading(&LEAD, 7);
        drop(_l);
        will_wait();
        assert_eq!(
            LEAD.0.load(Ordering::Relaxed),
            5,
            "the guard ended the lead"
        );
    }
}
