//! The host's FUSE rings: one io_uring for each CPU the daemon may run on, carrying the ring
//! entries of every mount, served by a crew of threads pinned to that CPU of which one leads.
//!
//! Why: a ring per mount and CPU, each with its thread, made 1,000 idle mounts 3,000 threads
//! and 6,000 descriptors. Here the threads are per CPU, whatever the number of mounts.
//!
//! How: the leader waits on the io_uring, takes each completion (a request in an entry, the
//! device being readable) and answers it itself, so a request that never waits costs no
//! thread switch, as with a thread per queue. A cold read does not wait either: the ring
//! makes its disk reads (see `connection`). A request that is about to wait (a block of its
//! store's metadata from the disk, an fsync, its tenant's turn; see [`crate::serving`]), and
//! a large write or copy, makes its thread give the lead to a waiting follower (a new one is started up to
//! [`MAX_CREW`]), so the other tenants' requests on this CPU go on. A request that waits without saying so is
//! caught by the [`watch`]: a leader that has been on one request for over [`STUCK`] and
//! sleeps loses the lead the same way (one that is only preempted keeps it: the CPU is busy
//! anyway). Followers never end (io_uring would cancel the commands they submitted).
//!
//! Only the leader waits on the completion queue; any thread may push to the submission
//! queue (under its lock), but only the crew's threads submit: io_uring ties each command to
//! the thread that submitted it, cancels it when that thread exits (a mount's entries would
//! end with ECANCELED), and delivers the request that completes it in that thread's context.
//! So another thread (the control thread attaching a mount) rings the reactor's bell (an
//! eventfd the ring polls) and the leader submits; crew threads never end; and a crew
//! thread blocked in an uninterruptible wait (a disk read in the kernel) delays the requests
//! of the entries it submitted until the wait ends. A thread that answered a request after
//! giving up the lead submits its reply itself.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::handoff;
use crate::fuse::buffer::RequestBuffer;
use crate::metrics::MountMetrics;
use crate::serving;

/// The most threads in one CPU's crew: the leader, and threads answering requests that wait.
pub const MAX_CREW: usize = 256;
/// A leader busy with one request this long loses the lead (the watch's check).
pub const STUCK: Duration = Duration::from_millis(2);
/// Submission queue size: commands pushed between two submissions.
const SQ_ENTRIES: u32 = 1024;
/// Completion queue size: every registered entry of every mount of the CPU may complete at
/// once (the kernel keeps overflowing completions, but at a cost).
const CQ_ENTRIES: u32 = 65_536;

thread_local! {
    /// Whether this thread is of a crew (and so may submit).
    static CREW: Cell<bool> = const { Cell::new(false) };
}

/// A mutex's guard, poisoned or not (the ring's state stays usable after a panic).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Microseconds since the process's first use of the rings, plus one (0: never).
fn now_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// The bit of a [`Tag::Resume`] and a [`Tag::Read`] (entry indexes stay below them).
const RESUME: u64 = 1 << 31;
/// Where a [`Tag::Read`]'s number (plus one) lies: entry indexes stay below it.
const READ_SHIFT: u32 = 27;
/// The most disk reads one entry's request hands to the ring at once.
pub const MAX_ENTRY_READS: usize = 15;
const _: () = assert!(serving::MAX_DEFERRED_READS <= MAX_ENTRY_READS);

/// What a completion is for: its `user_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Entry `index` of the connection in `slot` (a request in it, or the command's end).
    Entry { slot: u32, index: u32 },
    /// The wait of the request in entry `index` of the connection in `slot` is over (a
    /// request held by its tenant's limits waits on a timeout of the ring, not on a thread).
    Resume { slot: u32, index: u32 },
    /// Disk read `read` of the request in entry `index` of the connection in `slot` is done
    /// (a cold read's disk reads are made by the ring, `serving::deferring`).
    Read { slot: u32, index: u32, read: u8 },
    /// The connection's device is readable (its poll).
    Device { slot: u32 },
    /// Nothing: wakes the leader, or ends a cancel.
    Wake,
    /// The reactor's bell rang (commands pushed by a thread outside its crew).
    Bell,
}

impl Tag {
    pub fn encode(self) -> u64 {
        match self {
            Tag::Entry { slot, index } => {
                debug_assert!(
                    u64::from(index) << 2 < 1 << READ_SHIFT,
                    "entry index {index}"
                );
                u64::from(slot) << 32 | u64::from(index) << 2
            }
            Tag::Resume { slot, index } => u64::from(slot) << 32 | RESUME | u64::from(index) << 2,
            Tag::Read { slot, index, read } => {
                debug_assert!(usize::from(read) < MAX_ENTRY_READS, "read {read}");
                let read = (u64::from(read) + 1) << READ_SHIFT;
                u64::from(slot) << 32 | RESUME | read | u64::from(index) << 2
            }
            Tag::Device { slot } => u64::from(slot) << 32 | 1,
            Tag::Wake => 2,
            Tag::Bell => 3,
        }
    }

    pub fn decode(user_data: u64) -> Self {
        let slot = (user_data >> 32) as u32;
        let index = ((user_data & ((1 << READ_SHIFT) - 1)) as u32) >> 2;
        let read = ((user_data >> READ_SHIFT) & 0xf) as u8;
        match user_data & 3 {
            0 if user_data & RESUME != 0 && read > 0 => Tag::Read {
                slot,
                index,
                read: read - 1,
            },
            0 if user_data & RESUME != 0 => Tag::Resume { slot, index },
            0 => Tag::Entry { slot, index },
            1 => Tag::Device { slot },
            2 => Tag::Wake,
            _ => Tag::Bell,
        }
    }
}

/// A crew thread's own buffers, and the metrics of the mount it answered last (for
/// hand-offs).
#[derive(Default)]
pub struct Work {
    pub scratch: Vec<u8>,
    pub device_buffer: Option<RequestBuffer>,
    pub metrics: Option<Arc<MountMetrics>>,
}

/// A completion taken from the ring.
#[derive(Clone, Copy)]
pub struct Completion {
    pub user_data: u64,
    pub result: i32,
    pub flags: u32,
}

/// Who leads a CPU's crew.
struct Crew {
    leader: bool,
    /// Counts every change of lead: a thread leads while the term it took is current.
    term: u64,
    /// Threads waiting to lead.
    waiting: usize,
    threads: usize,
}

/// One CPU's ring and crew.
pub struct Reactor {
    cpu: usize,
    /// Its place in the host's list.
    index: usize,
    host: OnceLock<&'static Reactors>,
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    sq: Mutex<()>,
    cq: Mutex<()>,
    /// Completions taken from the ring and not yet answered.
    ready: Mutex<VecDeque<Completion>>,
    crew: Mutex<Crew>,
    turn: Condvar,
    /// The current term (read without the crew's lock).
    term: AtomicU64,
    /// When the leader started the request it answers ([`now_us`]; 0 while it answers none).
    busy_since: AtomicU64,
    /// The leading thread's id (for the watch).
    leader_tid: AtomicI32,
    handoff: Mutex<handoff::Handoff>,
    /// Rung by threads outside the crew that pushed commands: the leader then submits them.
    bell: OwnedFd,
    bell_polled: AtomicBool,
}

/// What answers a completion for a mount (an entry's, its device's).
pub type Handler = fn(&'static Reactor, Tag, Completion, &mut Work);

/// Every CPU's reactor, and which serves each of the kernel's queues.
pub struct Reactors {
    pub list: Vec<Reactor>,
    /// For each kernel queue (possible CPU, in order): the index of its reactor.
    pub for_queue: Vec<usize>,
    handler: Handler,
}

/// The host's reactors, started on the first call (with `handler` for the mounts'
/// completions).
pub fn host(handler: Handler) -> io::Result<&'static Reactors> {
    static HOST: OnceLock<&'static Reactors> = OnceLock::new();
    static STARTING: Mutex<()> = Mutex::new(());
    if let Some(r) = HOST.get() {
        return Ok(r);
    }
    let _one = lock(&STARTING);
    if let Some(r) = HOST.get() {
        return Ok(r);
    }
    let reactors: &'static Reactors = Box::leak(Box::new(Reactors::new(handler)?));
    for r in &reactors.list {
        let _ = r.host.set(reactors);
        r.spawn()?;
    }
    if std::env::var_os("NOWATCH").is_none() {
        watch::start(reactors);
    }
    let _ = HOST.set(reactors);
    Ok(reactors)
}

impl Reactors {
    fn new(handler: Handler) -> io::Result<Self> {
        let allowed = super::allowed_cpus();
        let callers = Arc::new(handoff::Callers::default());
        let mut list: Vec<Reactor> = Vec::new();
        let mut for_queue = Vec::new();
        for cpu in super::possible_cpus()? {
            let serving = super::serving_cpu(cpu, &allowed);
            let index = match list.iter().position(|r| r.cpu == serving) {
                Some(i) => i,
                None => {
                    let index = list.len();
                    list.push(Reactor::new(serving, index, callers.clone())?);
                    index
                }
            };
            for_queue.push(index);
        }
        Ok(Self {
            list,
            for_queue,
            handler,
        })
    }
}

impl Reactor {
    fn new(cpu: usize, index: usize, callers: Arc<handoff::Callers>) -> io::Result<Self> {
        let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)?;
        let bell = nix::sys::eventfd::EventFd::from_flags(
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC | nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
        )
        .map_err(io::Error::from)?;
        Ok(Self {
            cpu,
            index,
            host: OnceLock::new(),
            uring,
            sq: Mutex::new(()),
            cq: Mutex::new(()),
            ready: Mutex::new(VecDeque::new()),
            crew: Mutex::new(Crew {
                leader: false,
                term: 0,
                waiting: 0,
                threads: 1,
            }),
            turn: Condvar::new(),
            term: AtomicU64::new(0),
            busy_since: AtomicU64::new(0),
            leader_tid: AtomicI32::new(0),
            handoff: Mutex::new(handoff::Handoff::new(callers, cpu as u16)),
            bell: bell.into(),
            bell_polled: AtomicBool::new(false),
        })
    }

    /// Starts one more thread of the crew (counted in `threads` by the caller).
    fn spawn(&'static self) -> io::Result<()> {
        std::thread::Builder::new()
            .name(format!("fuse-ring-{}", self.cpu))
            .spawn(move || self.run())
            .map(drop)
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// The host's reactors, this one among them.
    pub fn host(&self) -> &'static Reactors {
        self.host
            .get()
            .expect("set before the reactor's threads start")
    }

    /// Pushes `sqe` for the next submission. The queue is submitted to make room when full.
    ///
    /// # Safety
    /// Every buffer `sqe` names must stay valid until its completion is taken.
    // SAFETY: unsafe for its callers' sake only: the kernel reads and writes the buffers the
    // entry names until it completes, which the caller guarantees; the push itself holds the
    // sq lock (see the block below).
    pub unsafe fn push(&self, sqe: &squeue::Entry128) {
        loop {
            {
                let _one = lock(&self.sq);
                // SAFETY: the sq lock is held, so no other SubmissionQueue of this ring exists.
                let pushed = unsafe { self.uring.submission_shared().push(sqe) };
                if pushed.is_ok() {
                    return;
                }
            }
            self.submit();
            if !CREW.get() {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Hands everything pushed so far to the kernel: at once on a crew thread, else through
    /// the leader (see the module's doc).
    pub fn submit(&self) {
        if !CREW.get() {
            if let Err(e) = nix::unistd::write(&self.bell, &1u64.to_ne_bytes()) {
                tracing::error!(cpu = self.cpu, error = %e, "FUSE ring: cannot ring the bell");
            }
            return;
        }
        if let Err(e) = self.uring.submit() {
            if e.raw_os_error() != Some(libc::EINTR) {
                tracing::error!(cpu = self.cpu, error = %e, "FUSE ring: cannot submit");
            }
        }
    }

    /// Polls the bell (again, when its multishot poll ended).
    fn poll_bell(&self) {
        let poll = opcode::PollAdd::new(types::Fd(self.bell.as_raw_fd()), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(Tag::Bell.encode());
        // SAFETY: a poll names no buffer; the bell lives as long as the (leaked) reactor.
        unsafe { self.push(&poll.into()) };
    }

    /// The bell rang: clears it (what was pushed goes with the leader's next submission).
    fn bell_rang(&self, flags: u32) {
        let mut count = [0u8; 8];
        let _ = nix::unistd::read(self.bell.as_raw_fd(), &mut count);
        if !cqueue::more(flags) {
            self.poll_bell();
        }
    }

    /// Whether commands wait to be submitted.
    fn unsubmitted(&self) -> bool {
        let _one = lock(&self.sq);
        // SAFETY: the sq lock is held, so no other SubmissionQueue of this ring exists. A
        // statement of its own: the queue writes its tail back when dropped, which has to
        // happen under the lock (a tail expression's temporary would be dropped after the
        // guard, and an older tail written over a push made meanwhile sends the kernel round
        // the ring again through stale commands).
        let empty = unsafe { self.uring.submission_shared() }.is_empty();
        !empty
    }

    /// Notes a request from thread `tid` (moves of callers between CPUs, [`handoff`]).
    pub fn saw_caller(&self, tid: u32) {
        lock(&self.handoff).saw(tid);
    }

    /// Wakes the leader out of its wait on the ring (it then finds the ready completions).
    fn wake_leader(&self) {
        let nop = opcode::Nop::new().build().user_data(Tag::Wake.encode());
        // SAFETY: a no-op names no buffer.
        unsafe { self.push(&nop.into()) };
        self.submit();
    }

    /// A crew thread: follows until it may lead, leads until it gives the lead up.
    fn run(&'static self) {
        CREW.set(true);
        super::pin_to_cpu(self.cpu);
        let mut work = Work::default();
        loop {
            let term = self.follow();
            self.lead(term, &mut work);
        }
    }

    /// Waits for the lead; its term.
    fn follow(&self) -> u64 {
        let mut crew = lock(&self.crew);
        crew.waiting += 1;
        while crew.leader {
            crew = self.turn.wait(crew).unwrap_or_else(|p| p.into_inner());
        }
        crew.waiting -= 1;
        crew.leader = true;
        crew.term += 1;
        self.term.store(crew.term, Ordering::SeqCst);
        self.leader_tid
            .store(nix::unistd::gettid().as_raw(), Ordering::SeqCst);
        crew.term
    }

    /// Answers completions while this thread holds the lead of `term`.
    fn lead(&'static self, term: u64, work: &mut Work) {
        if !self.bell_polled.swap(true, Ordering::AcqRel) {
            self.poll_bell();
        }
        loop {
            let next = lock(&self.ready).pop_front();
            let Some(c) = next else {
                self.wait_for_completions(work);
                if self.term.load(Ordering::SeqCst) != term {
                    // The lead went on while this thread waited: the new leader may be
                    // waiting on the ring too, and has to see what this one took from it.
                    if !lock(&self.ready).is_empty() {
                        self.wake_leader();
                    }
                    return;
                }
                continue;
            };
            self.busy_since.store(now_us(), Ordering::SeqCst);
            watch::busy();
            match Tag::decode(c.user_data) {
                Tag::Wake => {}
                Tag::Bell => self.bell_rang(c.flags),
                tag => {
                    let _leading = serving::leading(self, term);
                    (self.host().handler)(self, tag, c, work);
                }
            }
            if self.term.load(Ordering::SeqCst) != term {
                // Gave up the lead while answering: nobody else submits this reply.
                self.submit();
                return;
            }
            self.busy_since.store(0, Ordering::SeqCst);
        }
    }

    /// Submits what is pushed (replies as SCHED_IDLE while callers are being moved off their
    /// CPU, [`handoff`]) and waits for at least one completion; takes all there are.
    fn wait_for_completions(&self, work: &Work) {
        if self.unsubmitted() {
            let mut h = lock(&self.handoff);
            if h.next() {
                let metrics = work.metrics.clone().unwrap_or_default();
                let _ = h.hand_off(&metrics, || self.uring.submit());
            }
        }
        match self.uring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => {
                tracing::error!(cpu = self.cpu, error = %e, "FUSE ring: cannot wait");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let _one = lock(&self.cq);
        // SAFETY: the cq lock is held, so no other CompletionQueue of this ring exists.
        let cq = unsafe { self.uring.completion_shared() };
        let mut ready = lock(&self.ready);
        ready.extend(cq.map(|c| Completion {
            user_data: c.user_data(),
            result: c.result(),
            flags: c.flags(),
        }));
    }

    /// Gives the lead of `term` to another thread: a waiting follower, or a new one. With
    /// `since` (the watch's), only if the leader is still on the request it started then.
    fn release(&'static self, term: u64, since: Option<u64>) {
        let mut crew = lock(&self.crew);
        if !crew.leader || crew.term != term {
            return;
        }
        if since.is_some_and(|s| self.busy_since.load(Ordering::SeqCst) != s) {
            return;
        }
        crew.leader = false;
        crew.term += 1;
        self.term.store(crew.term, Ordering::SeqCst);
        self.busy_since.store(0, Ordering::SeqCst);
        if crew.waiting > 0 {
            self.turn.notify_one();
        } else if crew.threads < MAX_CREW {
            crew.threads += 1;
            if let Err(e) = self.spawn() {
                crew.threads -= 1;
                tracing::warn!(cpu = self.cpu, error = %e, "FUSE ring: cannot start a thread");
            }
        }
    }
}

impl serving::Lead for Reactor {
    fn give_up(&'static self, term: u64) {
        // Not submitting here: commands this thread submits are delivered in its context,
        // which is about to block. The next leader submits what it pushed.
        self.release(term, None);
    }
}

/// The watch: takes the lead from a leader stuck in one request (a wait nobody announced).
mod watch {
    use super::*;

    /// How often the watch looks while requests are being answered.
    const TICK: Duration = Duration::from_millis(2);
    /// Ticks without a busy leader before the watch sleeps until the next request.
    const IDLE_TICKS: u32 = 100;

    static PARKED: AtomicBool = AtomicBool::new(false);
    static BELL: Mutex<()> = Mutex::new(());
    static RUNG: Condvar = Condvar::new();

    pub fn start(reactors: &'static Reactors) {
        let started = std::thread::Builder::new()
            .name("fuse-watch".into())
            .spawn(move || run(reactors));
        if let Err(e) = started {
            tracing::warn!(error = %e, "FUSE ring watch not started: waits nobody announced \
                                        hold their CPU's requests");
        }
    }

    /// A leader started a request: wakes the watch if it sleeps.
    pub fn busy() {
        if PARKED.load(Ordering::SeqCst) {
            let _bell = lock(&BELL);
            PARKED.store(false, Ordering::SeqCst);
            RUNG.notify_one();
        }
    }

    /// Whether thread `tid` of this process sleeps (waits), rather than runs or waits for
    /// its CPU: a leader that was only preempted (the CPU is busy) keeps its lead, since
    /// another thread of the same CPU would not run sooner.
    fn sleeps(tid: i32) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
            return false;
        };
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        matches!(state, Some("S" | "D"))
    }

    fn run(reactors: &'static Reactors) {
        let mut idle = 0;
        loop {
            std::thread::sleep(TICK);
            let now = now_us();
            let mut any = false;
            for r in &reactors.list {
                let since = r.busy_since.load(Ordering::SeqCst);
                if since == 0 {
                    continue;
                }
                any = true;
                let term = r.term.load(Ordering::SeqCst);
                let tid = r.leader_tid.load(Ordering::SeqCst);
                if now.saturating_sub(since) > STUCK.as_micros() as u64 && sleeps(tid) {
                    r.release(term, Some(since));
                }
            }
            idle = if any { 0 } else { idle + 1 };
            if idle < IDLE_TICKS {
                continue;
            }
            let mut bell = lock(&BELL);
            PARKED.store(true, Ordering::SeqCst);
            let busy = |r: &Reactor| r.busy_since.load(Ordering::SeqCst) != 0;
            while PARKED.load(Ordering::SeqCst) && !reactors.list.iter().any(busy) {
                bell = RUNG.wait(bell).unwrap_or_else(|p| p.into_inner());
            }
            PARKED.store(false, Ordering::SeqCst);
            idle = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The submission queue is shared by threads under its lock: while one thread looks at it
    /// and another pushes, every command pushed is submitted once, none twice, none lost.
    #[test]
    fn commands_pushed_beside_a_look_at_the_queue_are_each_submitted_once() {
        let r: &'static Reactor = Box::leak(Box::new(
            Reactor::new(0, 0, Arc::new(handoff::Callers::default())).unwrap(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let looker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    r.unsubmitted();
                }
            })
        };
        CREW.set(true);
        const N: usize = 200_000;
        let mut done = 0;
        let reap = |want: usize| {
            r.uring.submit_and_wait(want).unwrap();
            let _one = lock(&r.cq);
            // SAFETY: the cq lock is held.
            let cq = unsafe { r.uring.completion_shared() };
            // `count` takes the queue: it writes its head back before the guard goes.
            cq.count()
        };
        for i in 0..N {
            let nop = opcode::Nop::new().build().user_data(i as u64);
            // SAFETY: a no-op names no buffer.
            unsafe { r.push(&nop.into()) };
            if i % 256 == 255 {
                done += reap(0);
            }
        }
        stop.store(true, Ordering::Relaxed);
        looker.join().unwrap();
        while done < N {
            done += reap(1);
        }
        assert_eq!(done, N, "completions for {N} pushes");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(reap(0), 0, "nothing submitted twice");
    }

    #[test]
    fn tags_survive_their_encoding() {
        for tag in [
            Tag::Entry { slot: 0, index: 0 },
            Tag::Entry {
                slot: u32::MAX,
                index: (1 << 25) - 1,
            },
            Tag::Resume { slot: 0, index: 0 },
            Tag::Resume {
                slot: u32::MAX,
                index: (1 << 25) - 1,
            },
            Tag::Read {
                slot: 3,
                index: 0,
                read: 0,
            },
            Tag::Read {
                slot: u32::MAX,
                index: (1 << 25) - 1,
                read: MAX_ENTRY_READS as u8 - 1,
            },
            Tag::Device { slot: 7 },
            Tag::Device { slot: u32::MAX },
            Tag::Wake,
            Tag::Bell,
        ] {
            assert_eq!(Tag::decode(tag.encode()), tag);
        }
    }
}
