//! Replies that leave their caller on its CPU.
//!
//! Why: a caller sleeps on its CPU while a queue thread, pinned to that CPU, answers it. When
//! the reply wakes the caller, the queue thread is still running there, so the scheduler
//! moves the caller to an idle CPU if there is one. On a guest that halts its idle vCPUs at
//! once (`guest_halt_poll_ns` 0, as on the benchmark machine) waking that CPU is a hypervisor
//! exit, and a caller that waits on every request (one fio job, a cached 4 KiB read each time)
//! bounces between the CPUs: 0.85 moves a request, p50 34 us where 15 us is possible
//! (docs/decisions/0009-fuse-over-io-uring-host-rings.md).
//!
//! How: the scheduler counts a CPU that runs only SCHED_IDLE threads as idle when it places a
//! woken thread. A queue thread whose callers have started to move submits its replies as
//! SCHED_IDLE and turns back to SCHED_OTHER right after, so the caller is woken on the CPU
//! it slept on and the queue thread is the one that yields. Two system calls a submission
//! (about 2.5 us here), so only while it pays: a queue starts handing off when a caller's
//! request arrives on it after the caller's last one went to another queue (the caller was
//! moved), for the next [`HANDOFF_REPLIES`] submissions. A thread that is SCHED_IDLE waits
//! behind every other thread of its CPU: if the switch back took longer than
//! [`STARVED_AFTER`] (the caller, or another thread, ran long first), the queue stops
//! handing off for [`COOLDOWN`] submissions, whatever its callers do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::metrics::MountMetrics;

/// Submissions a queue hands off after it sees a caller that was moved.
pub const HANDOFF_REPLIES: u32 = 64;
/// A hand-off whose switch back took longer than this ran behind other work.
pub const STARVED_AFTER: Duration = Duration::from_micros(200);
/// Submissions without hand-off after one that ran behind other work.
pub const COOLDOWN: u32 = 4096;
/// Callers remembered (by thread id; two that share a slot only forget each other).
const CALLER_SLOTS: usize = 256;

/// The queue each recent caller's last request went to, shared by a mount's queues.
pub struct Callers {
    slots: Box<[AtomicU64]>,
}

impl Default for Callers {
    fn default() -> Self {
        Self {
            slots: (0..CALLER_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Callers {
    /// Records that thread `tid` sent a request to queue `qid`; true if its previous
    /// request went to another queue.
    pub fn moved(&self, tid: u32, qid: u16) -> bool {
        if tid == 0 {
            // Requests the kernel sends on its own (no caller).
            return false;
        }
        let now = (u64::from(tid) << 16) | u64::from(qid);
        let before = self.slots[tid as usize % CALLER_SLOTS].swap(now, Ordering::Relaxed);
        before >> 16 == u64::from(tid) && before != now
    }
}

/// One queue's hand-off state.
pub struct Handoff {
    callers: Arc<Callers>,
    qid: u16,
    /// Whether this thread may come back from SCHED_IDLE (checked once: it must never stay).
    usable: bool,
    budget: u32,
    cooldown: u32,
    /// [`STARVED_AFTER`]; longer in a test that counts hand-offs on a busy machine.
    starved_after: Duration,
}

impl Handoff {
    pub fn new(callers: Arc<Callers>, qid: u16) -> Self {
        Self {
            callers,
            qid,
            usable: may_leave_idle_policy(),
            budget: 0,
            cooldown: 0,
            starved_after: STARVED_AFTER,
        }
    }

    /// Notes a request from thread `tid` on this queue.
    pub fn saw(&mut self, tid: u32) {
        if self.callers.moved(tid, self.qid) && self.usable && self.cooldown == 0 {
            self.budget = HANDOFF_REPLIES;
        }
    }

    /// Whether the queue's next submission of replies is to be handed off; called once a
    /// submission.
    pub fn next(&mut self) -> bool {
        self.cooldown = self.cooldown.saturating_sub(1);
        self.budget > 0
    }

    /// Runs `submit` (which hands replies to the kernel and so wakes their callers) as
    /// SCHED_IDLE, then switches back to SCHED_OTHER; counted in `metrics`.
    pub fn hand_off<T>(&mut self, metrics: &MountMetrics, submit: impl FnOnce() -> T) -> T {
        self.budget = self.budget.saturating_sub(1);
        let start = Instant::now();
        if set_policy(libc::SCHED_IDLE).is_err() {
            self.stop_for_good();
            return submit();
        }
        let out = submit();
        if let Err(e) = set_policy(libc::SCHED_OTHER) {
            // Checked at start, so not expected; the thread would now wait behind every other.
            tracing::error!(qid = self.qid, error = %e, "FUSE ring queue stuck at SCHED_IDLE");
            self.stop_for_good();
        }
        let stalled = start.elapsed() > self.starved_after;
        if stalled {
            self.budget = 0;
            self.cooldown = COOLDOWN;
        }
        metrics.record_handoff(stalled);
        out
    }

    fn stop_for_good(&mut self) {
        self.usable = false;
        self.budget = 0;
    }

    #[cfg(test)]
    fn handing_off(&self) -> bool {
        self.budget > 0
    }
}

/// Whether a thread of this process may switch from SCHED_IDLE back to SCHED_OTHER (Linux
/// wants CAP_SYS_NICE in the initial user namespace, or an RLIMIT_NICE that allows the
/// thread's nice value). Tried once, on a thread of its own that ends either way: a queue
/// thread must never be left at SCHED_IDLE.
fn may_leave_idle_policy() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        std::thread::spawn(|| {
            set_policy(libc::SCHED_IDLE).is_ok() && set_policy(libc::SCHED_OTHER).is_ok()
        })
        .join()
        .unwrap_or(false)
    })
}

fn set_policy(policy: libc::c_int) -> Result<(), nix::Error> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with pid 0 changes the calling thread only; `param` is a
    // valid sched_param that outlives the call.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    nix::errno::Errno::result(r).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_is_moved_when_its_request_arrives_on_another_queue() {
        let callers = Callers::default();
        assert!(!callers.moved(100, 0), "first request: nothing known");
        assert!(!callers.moved(100, 0), "same queue again");
        assert!(callers.moved(100, 1));
        assert!(!callers.moved(100, 1));
        // Another thread in the same slot only makes the slot forget.
        assert!(!callers.moved(100 + CALLER_SLOTS as u32, 0));
        assert!(!callers.moved(100, 0));
        assert!(
            !callers.moved(0, 0) && !callers.moved(0, 1),
            "the kernel's own requests"
        );
    }

    const AS_ROOT: &str = "a thread may leave SCHED_IDLE only with CAP_SYS_NICE or RLIMIT_NICE \
                           >= 20: run the tests as root (make test)";

    /// A submission as the queue thread makes it.
    fn submit<T>(h: &mut Handoff, m: &MountMetrics, f: impl FnOnce() -> T) -> T {
        if h.next() {
            h.hand_off(m, f)
        } else {
            f()
        }
    }

    fn policy() -> libc::c_int {
        // SAFETY: reads the calling thread's policy; no pointers.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_hand_off_submits_as_sched_idle_and_comes_back() {
        assert!(may_leave_idle_policy(), "{AS_ROOT}");
        let other = nix::unistd::gettid();
        std::thread::spawn(move || {
            let callers = Arc::new(Callers::default());
            let mut h = Handoff::new(callers.clone(), 1);
            // Other tests keep the CPUs busy: a hand-off may wait behind them at SCHED_IDLE,
            // which is not what this test counts.
            h.starved_after = Duration::from_secs(3600);
            let m = MountMetrics::new();
            // Not handing off: the submission runs at the thread's own policy.
            h.saw(7);
            assert_eq!(submit(&mut h, &m, policy), libc::SCHED_OTHER);
            // Thread 7's next request arrives on queue 0, then on this one: it was moved.
            callers.moved(7, 0);
            h.saw(7);
            assert!(h.handing_off());
            let (mine, theirs) = submit(&mut h, &m, || {
                // SAFETY: reads another thread's policy (alive: it waits in join); no pointers.
                (policy(), unsafe {
                    libc::sched_getscheduler(other.as_raw())
                })
            });
            assert_eq!(mine, libc::SCHED_IDLE);
            assert_eq!(theirs, libc::SCHED_OTHER, "only the calling thread changes");
            assert_eq!(policy(), libc::SCHED_OTHER, "back after the submission");
            for _ in 1..HANDOFF_REPLIES {
                submit(&mut h, &m, || ());
            }
            assert!(
                !h.handing_off(),
                "a budget of {HANDOFF_REPLIES} submissions"
            );
            assert_eq!(submit(&mut h, &m, policy), libc::SCHED_OTHER);
            let counted = m.summary();
            assert_eq!(counted.ring_handoffs, u64::from(HANDOFF_REPLIES));
            assert_eq!(counted.ring_handoff_stalls, 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_hand_off_that_ran_behind_other_work_stops_handing_off() {
        assert!(may_leave_idle_policy(), "{AS_ROOT}");
        std::thread::spawn(|| {
            let callers = Arc::new(Callers::default());
            let mut h = Handoff::new(callers.clone(), 0);
            let m = MountMetrics::new();
            callers.moved(9, 1);
            h.saw(9);
            assert!(h.handing_off());
            submit(&mut h, &m, || std::thread::sleep(STARVED_AFTER * 2));
            assert!(!h.handing_off());
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert_eq!(m.summary().ring_handoff_stalls, 1);
            // Moved callers are ignored while cooling down, and count again after it.
            callers.moved(9, 1);
            h.saw(9);
            assert!(!h.handing_off());
            for _ in 0..COOLDOWN {
                submit(&mut h, &m, || ());
            }
            callers.moved(9, 1);
            h.saw(9);
            assert!(h.handing_off());
            assert_eq!(m.summary().ring_handoffs, 1, "none while cooling down");
        })
        .join()
        .unwrap();
    }
}
