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
//!
//! A cold read need not wait at all: where the thread can carry out disk reads itself (the
//! ring's, with io_uring), it answers the request within [`deferring`], and the store hands
//! its disk reads over ([`defer`]) instead of making them, and fails the request with its
//! `Deferred` error. The thread submits them, goes on with other requests, and answers the
//! request again once they are done, [`with_reads`] (the store takes their bytes from
//! there, not from the cache, where a second lookup would count as a hit). Giving up the
//! lead costs a cold read two more thread switches; this costs none.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;

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

/// A disk read a request hands to the thread that answers it instead of waiting on it.
pub trait DiskRead: Send {
    /// The descriptor, the offset in it, and the buffer the read fills (`len` bytes at
    /// `buf`, valid and in place until [`Self::done`]).
    fn target(&mut self) -> (RawFd, u64, *mut u8, usize);
    /// The read ended: the count read, or why it failed. What it read is kept for the
    /// request's next answer ([`with_reads`]); a failed or short read is left for that
    /// answer to make again (and report).
    fn done(&mut self, result: std::io::Result<usize>);
    /// For the store that made it, to find its bytes in the next answer ([`made_reads`]).
    fn as_any(&self) -> &dyn Any;
}

/// The disk reads made for a request answered again, and when its first answer began.
type Made = Option<(Vec<Box<dyn DiskRead>>, std::time::Instant)>;

thread_local! {
    static DEFERRED: RefCell<Option<Vec<Box<dyn DiskRead>>>> = const { RefCell::new(None) };
    static MADE: RefCell<Made> = const { RefCell::new(None) };
}

/// Runs `f`, which answers again a request whose first answer began at `since` and whose
/// disk reads `reads` are done: their bytes are there for it ([`made_reads`]), and its time
/// counts from `since` ([`answering_since`]). Nothing is deferred within.
pub fn with_reads<R>(
    reads: Vec<Box<dyn DiskRead>>,
    since: std::time::Instant,
    f: impl FnOnce() -> R,
) -> R {
    /// Puts the outer reads back after `f` (dropping these), also when it panics.
    struct Restore(Made);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            drop(MADE.with(|m| m.replace(outer)));
        }
    }
    let _restore = Restore(MADE.with(|m| m.replace(Some((reads, since)))));
    f()
}

/// Calls `f` with the disk reads made for the request being answered again ([`with_reads`]):
/// none elsewhere.
pub fn made_reads<R>(f: impl FnOnce(&[Box<dyn DiskRead>]) -> R) -> R {
    MADE.with(|m| f(m.borrow().as_ref().map_or(&[], |(reads, _)| &reads[..])))
}

/// When the first answer of the request being answered again began ([`with_reads`]): its
/// time, what its tenant's turn is charged, and its latency count from then.
pub fn answering_since() -> Option<std::time::Instant> {
    MADE.with(|m| m.borrow().as_ref().map(|(_, since)| *since))
}

/// Runs `f`, which answers a request whose disk reads the calling thread will carry out
/// itself: with the reads `f` deferred ([`defer`]), in order. None deferred: `f` answered.
pub fn deferring<R>(f: impl FnOnce() -> R) -> (R, Vec<Box<dyn DiskRead>>) {
    type Reads = Option<Vec<Box<dyn DiskRead>>>;
    /// Puts the outer scope back, also when `f` panics.
    struct Restore(Option<Reads>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                DEFERRED.with(|d| *d.borrow_mut() = outer);
            }
        }
    }
    let mut restore = Restore(Some(DEFERRED.with(|d| d.replace(Some(Vec::new())))));
    let r = f();
    let outer = restore.0.take().unwrap_or_default();
    let reads = DEFERRED.with(|d| d.replace(outer));
    (r, reads.unwrap_or_default())
}

/// The most disk reads one request hands over.
pub const MAX_DEFERRED_READS: usize = 8;

/// Whether the calling thread's request may hand `reads` more disk reads over
/// ([`deferring`], at most [`MAX_DEFERRED_READS`] in all).
pub fn can_defer(reads: usize) -> bool {
    DEFERRED.with(|d| {
        d.borrow()
            .as_ref()
            .is_some_and(|v| v.len() + reads <= MAX_DEFERRED_READS)
    })
}

/// Whether the calling thread's request has handed disk reads over.
pub fn deferred_any() -> bool {
    DEFERRED.with(|d| d.borrow().as_ref().is_some_and(|v| !v.is_empty()))
}

/// Hands `read` over to the thread answering the request: only where [`can_defer`]. The
/// request then fails (the store's `Deferred` error), to be answered again once it is done.
pub fn defer(read: Box<dyn DiskRead>) {
    DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        Some(reads) => reads.push(read),
        None => debug_assert!(false, "a disk read deferred where nobody carries it out"),
    });
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

    struct Noted(u64);

    impl DiskRead for Noted {
        fn target(&mut self) -> (RawFd, u64, *mut u8, usize) {
            (-1, self.0, std::ptr::null_mut(), 0)
        }
        fn done(&mut self, _: std::io::Result<usize>) {}
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn made_reads_are_there_only_for_the_answer_they_were_made_for() {
        let offsets = || {
            made_reads(|r| {
                r.iter()
                    .map(|r| r.as_any().downcast_ref::<Noted>().unwrap().0)
                    .collect::<Vec<_>>()
            })
        };
        assert!(offsets().is_empty());
        let since = std::time::Instant::now();
        assert_eq!(answering_since(), None);
        let seen = with_reads(vec![Box::new(Noted(4)), Box::new(Noted(9))], since, || {
            assert_eq!(answering_since(), Some(since));
            let inner = with_reads(vec![Box::new(Noted(5))], since, offsets);
            assert_eq!(inner, [5]);
            offsets()
        });
        assert_eq!(
            seen,
            [4, 9],
            "the outer reads are back after an inner answer"
        );
        assert!(offsets().is_empty(), "dropped after the answer");
        assert_eq!(answering_since(), None);
        let _ = std::panic::catch_unwind(|| {
            with_reads(vec![Box::new(Noted(1))], since, || panic!("x"))
        });
        assert!(offsets().is_empty(), "dropped after a panic too");
    }

    #[test]
    fn reads_are_deferred_only_within_deferring_and_come_back_in_order() {
        assert!(!can_defer(1), "outside: reads are made, not deferred");
        let (r, mut reads) = deferring(|| {
            assert!(can_defer(MAX_DEFERRED_READS) && !deferred_any());
            defer(Box::new(Noted(1)));
            defer(Box::new(Noted(2)));
            assert!(deferred_any());
            assert!(
                !can_defer(MAX_DEFERRED_READS - 1),
                "at most {MAX_DEFERRED_READS}"
            );
            7
        });
        assert_eq!(r, 7);
        let offsets: Vec<u64> = reads.iter_mut().map(|r| r.target().1).collect();
        assert_eq!(offsets, [1, 2]);
        assert!(!can_defer(1), "the scope ended");
        let (_, none) = deferring(|| ());
        assert!(
            none.is_empty(),
            "nothing deferred: the request was answered"
        );
        // A panic inside ends the scope too.
        let _ = std::panic::catch_unwind(|| deferring(|| panic!("answer failed")));
        assert!(!can_defer(1));
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
