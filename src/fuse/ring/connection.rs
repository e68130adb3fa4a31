//! One mount on the host's rings: its ring entries (for each of the kernel's queues, a header
//! and a payload buffer the kernel writes requests into), its /dev/fuse device, and how it
//! ends.
//!
//! Why apart from the reactors: the reactors know threads and io_urings, a connection knows
//! FUSE. Every connection sits in one registry; a completion names its connection by slot
//! ([`Tag`]), so nothing in the kernel points at memory that could go away: a connection
//! leaves the registry only when none of its commands can complete any more.
//!
//! A data request its tenant's I/O limits hold waits on a timeout of the ring, not on a
//! thread: its entry keeps the request, pays what tokens are there
//! (`io_limits::LiveLimits::pay_ahead`), and is answered when the timeout ends with all of
//! them. A hundred throttled mounts hold no thread. A request held for its turn among busy
//! tenants (`fair_share`) waits the same way, looking again every `fair_share::RECHECK`.
//!
//! A cold read waits on the ring too: it is answered within `serving::deferring`, the store
//! hands its disk reads over, and the entry keeps them while the ring makes them (reads of
//! the extent files' descriptors into the reads' own buffers). When the last is done the
//! request is answered again, from the cache they filled, making any disk read it still
//! needs itself. Its thread never blocks and never gives up its lead.
//!
//! How it ends: unmounting aborts the FUSE connection; the kernel completes every registered
//! entry (ENOTCONN), commits of replies fail, and the device reads ENODEV. The first ENODEV
//! cancels the device's poll and starts the session's end on a thread of its own; the last
//! completion takes the connection out of the registry, and [`Connection::wait_gone`] returns.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types};

use super::reactor::{lock, Completion, Reactor, Reactors, Tag, Work};
use super::{abi, with_address, ENTRIES_PER_QUEUE, PAYLOAD_SIZE};
use crate::fuse::buffer::RequestBuffer;
use crate::fuse::ops::Operations;
use crate::fuse::{device, dispatch, wire};
use crate::io_limits::{self, Paid};
use crate::serving::{self, DiskRead};

/// How long an entry keeps registering again while the kernel finishes INIT.
const REGISTER_PATIENCE: Duration = Duration::from_secs(10);
/// The longest one wait of a request held by its limits (it pays again after it).
const HOLD_MAX: Duration = Duration::from_secs(1);

/// The request in an entry that its tenant's limits hold: which, what it has paid, since
/// when, and the ring timeout it waits on.
struct Held {
    unique: u64,
    paid: Paid,
    /// Held for its turn (counted busy by the fair queue: `FairShare::try_enter`).
    turn: bool,
    since: Option<Instant>,
    /// Read by the kernel when the timeout is submitted: boxed, it stays where it is.
    timeout: Box<types::Timespec>,
}

/// One ring entry: the buffers the kernel writes requests into. They never move or shrink
/// while registered (boxed or mapped, owned by the connection until it leaves the registry).
pub struct Entry {
    header: Box<[u8; abi::HEADER_SIZE]>,
    payload: RequestBuffer,
    /// `struct iovec[2]` (base, length; base, length) for REGISTER.
    iov: Box<[usize; 4]>,
    commit_id: u64,
    /// Whether the kernel has taken the entry (its REGISTER completed with a request): its
    /// commands from then on are COMMIT_AND_FETCH.
    taken: bool,
    /// Whether its last command ended for good (counted out of the connection's `live`).
    ended: bool,
    held: Held,
    /// The disk reads the ring makes for the entry's request, each with whether it is done,
    /// and how many are not done yet.
    reads: Vec<(Box<dyn DiskRead>, bool)>,
    reads_left: usize,
    /// Its reads are done: the request's next answer takes their bytes, and makes any
    /// other disk read it needs itself.
    read_again: bool,
    /// When the answer that handed the reads over began, when it ended, and how long the
    /// reads took from then (charged to the second answer's turn).
    first_answer: Option<Instant>,
    deferred_at: Option<Instant>,
    disk_wait: Duration,
}

/// What answering an entry's request gives to submit.
enum Next {
    /// The command that hands its reply back, or the timeout its limits hold it on.
    One(squeue::Entry128),
    /// The disk reads the ring makes for it (answered again once they are done).
    Reads(Vec<squeue::Entry128>),
}

impl Entry {
    pub fn new() -> io::Result<Self> {
        let mut header = Box::new([0u8; abi::HEADER_SIZE]);
        // A mapping: untouched pages of the large buffer cost no memory.
        let mut payload = RequestBuffer::new(PAYLOAD_SIZE)?;
        let iov = Box::new([
            header.as_mut_ptr() as usize,
            header.len(),
            payload.as_mut_ptr() as usize,
            payload.len(),
        ]);
        Ok(Self {
            header,
            payload,
            iov,
            commit_id: 0,
            taken: false,
            ended: false,
            held: Held {
                unique: 0,
                paid: Paid::default(),
                turn: false,
                since: None,
                timeout: Box::new(types::Timespec::new()),
            },
            reads: Vec::new(),
            reads_left: 0,
            read_again: false,
            first_answer: None,
            deferred_at: None,
            disk_wait: Duration::ZERO,
        })
    }
}

#[cfg(test)]
impl Entry {
    /// The REGISTER iovec array and the header's address.
    pub fn iovec_and_header(&self) -> ([usize; 4], usize) {
        (*self.iov, self.header.as_ptr() as usize)
    }
}

/// A mount on the host's rings.
pub struct Connection {
    slot: u32,
    reactors: &'static Reactors,
    ops: Arc<Operations>,
    /// Shared with the mount's notifier: one descriptor for both.
    device: Arc<OwnedFd>,
    /// Entry `i` belongs to the kernel's queue `i / ENTRIES_PER_QUEUE`.
    entries: Vec<Mutex<Entry>>,
    /// Entries whose command may still complete, plus one for the device's poll.
    live: AtomicUsize,
    device_ended: AtomicBool,
    /// Held while the device's poll is armed again or cancelled, so that a cancel never
    /// misses a poll armed at the same time.
    poll_turn: Mutex<()>,
    on_end: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    gone: Mutex<bool>,
    gone_changed: Condvar,
    attached: Instant,
}

/// Every connection on the rings, by slot: the slots in use and free, and for each reactor a
/// copy of the table, which only its own CPU's threads read (no lock shared between CPUs on
/// the way of a request).
struct Registry {
    free: Mutex<(u32, Vec<u32>)>,
    tables: Vec<Mutex<Vec<Option<Arc<Connection>>>>>,
}

fn registry(reactors: &Reactors) -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        free: Mutex::new((0, Vec::new())),
        tables: reactors
            .list
            .iter()
            .map(|_| Mutex::new(Vec::new()))
            .collect(),
    })
}

impl Registry {
    fn take_slot(&self) -> u32 {
        let mut free = lock(&self.free);
        free.1.pop().unwrap_or_else(|| {
            free.0 += 1;
            free.0 - 1
        })
    }

    /// Puts `conn` (or None) in its slot of every reactor's table.
    fn set(&self, slot: u32, conn: Option<&Arc<Connection>>) {
        for t in &self.tables {
            let mut t = lock(t);
            if t.len() <= slot as usize {
                t.resize(slot as usize + 1, None);
            }
            t[slot as usize] = conn.cloned();
        }
    }

    fn find(&self, reactor: &Reactor, slot: u32) -> Option<Arc<Connection>> {
        lock(&self.tables[reactor.index()])
            .get(slot as usize)?
            .clone()
    }
}

/// Puts a mount on the rings: registers its entries on the reactor of each entry's queue
/// (none if `fall_back`: then the kernel is told to serve the mount over /dev/fuse) and
/// polls its device. `on_end` runs, on a thread of its own, once the device has ended.
pub fn attach(
    reactors: &'static Reactors,
    ops: Arc<Operations>,
    entries: Vec<Entry>,
    device: Arc<OwnedFd>,
    on_end: Box<dyn FnOnce() + Send>,
    fall_back: bool,
) -> Arc<Connection> {
    if let Err(e) = nix::fcntl::fcntl(
        device.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    ) {
        tracing::warn!(error = %e, "FUSE device not made non-blocking");
    }
    let registered = if fall_back { 0 } else { entries.len() };
    let conn = {
        let reg = registry(reactors);
        let slot = reg.take_slot();
        let conn = Arc::new(Connection {
            slot,
            reactors,
            ops,
            device,
            entries: entries.into_iter().map(Mutex::new).collect(),
            live: AtomicUsize::new(registered + 1),
            device_ended: AtomicBool::new(false),
            poll_turn: Mutex::new(()),
            on_end: Mutex::new(Some(on_end)),
            gone: Mutex::new(false),
            gone_changed: Condvar::new(),
            attached: Instant::now(),
        });
        reg.set(slot, Some(&conn));
        conn
    };
    if fall_back {
        super::fall_back(conn.device.as_raw_fd());
    } else {
        for i in 0..conn.entries.len() {
            let sqe = conn.command(i, abi::CMD_REGISTER);
            // SAFETY: the entry's buffers live as long as the connection, which stays in the
            // registry until this command has completed.
            unsafe { conn.reactor_of(i).push(&sqe) };
        }
    }
    conn.poll_device();
    for r in &reactors.list {
        r.submit();
    }
    conn
}

/// Answers completion `c` of a connection (an entry's or its device's), taken from
/// `reactor`'s ring.
pub fn handle(reactor: &'static Reactor, tag: Tag, c: Completion, work: &mut Work) {
    let find = |slot| registry(reactor.host()).find(reactor, slot);
    match tag {
        Tag::Entry { slot, index } => {
            if let Some(conn) = find(slot) {
                conn.entry_completed(reactor, index as usize, c.result, work);
            }
        }
        // Its timeout ended (or was cancelled): the held request pays again.
        Tag::Resume { slot, index } => {
            if let Some(conn) = find(slot) {
                conn.entry_completed(reactor, index as usize, 0, work);
            }
        }
        Tag::Read { slot, index, read } => {
            if let Some(conn) = find(slot) {
                conn.read_completed(reactor, index as usize, read, c.result, work);
            }
        }
        Tag::Device { slot } => {
            if let Some(conn) = find(slot) {
                conn.device_completed(c, work);
            }
        }
        Tag::Wake | Tag::Bell => {}
    }
}

impl Connection {
    fn reactor_of(&self, entry: usize) -> &'static Reactor {
        let r = self.reactors.for_queue[entry / ENTRIES_PER_QUEUE];
        &self.reactors.list[r]
    }

    /// The reactor that polls the device.
    fn device_reactor(&self) -> &'static Reactor {
        &self.reactors.list[self.slot as usize % self.reactors.list.len()]
    }

    /// The ring command for entry `i`: REGISTER names its buffers, COMMIT_AND_FETCH hands
    /// back its reply (by the request's commit id) and asks for the next request.
    fn command(&self, i: usize, cmd: u32) -> squeue::Entry128 {
        self.command_for(i, &lock(&self.entries[i]), cmd)
    }

    /// [`Self::command`] for entry `i`, `e`, already locked.
    fn command_for(&self, i: usize, e: &Entry, cmd: u32) -> squeue::Entry128 {
        let mut req = [0u8; 80];
        // struct fuse_uring_cmd_req: flags (u64), commit_id (u64), qid (u16).
        if cmd == abi::CMD_COMMIT_AND_FETCH {
            req[8..16].copy_from_slice(&e.commit_id.to_le_bytes());
        }
        let qid = (i / ENTRIES_PER_QUEUE) as u16;
        req[16..18].copy_from_slice(&qid.to_le_bytes());
        let tag = Tag::Entry {
            slot: self.slot,
            index: i as u32,
        };
        let sqe = opcode::UringCmd80::new(types::Fd(self.device.as_raw_fd()), cmd)
            .cmd(req)
            .build()
            .user_data(tag.encode());
        if cmd == abi::CMD_REGISTER {
            with_address(sqe, e.iov.as_ptr() as u64, 2)
        } else {
            sqe
        }
    }

    fn entry_completed(&self, reactor: &Reactor, i: usize, result: i32, work: &mut Work) {
        if result == 0 {
            match self.answer(reactor, i, work) {
                // SAFETY: as at REGISTER: the buffers outlive the command; a held request's
                // timeout lives in its entry.
                Next::One(sqe) => unsafe { reactor.push(&sqe) },
                Next::Reads(reads) => {
                    for sqe in &reads {
                        // SAFETY: each read's buffer is its own, boxed in the entry until its
                        // completion is taken (`read_completed`); its descriptor stays open
                        // while the read holds its file.
                        unsafe { reactor.push(sqe) };
                    }
                }
            }
            return;
        }
        let taken = lock(&self.entries[i]).taken;
        match -result {
            // REGISTER before the kernel processed the INIT reply: register again. (Only a
            // REGISTER: the same buffers registered twice would take two requests at once.)
            libc::EAGAIN | libc::EINTR if !taken && self.attached.elapsed() < REGISTER_PATIENCE => {
                std::thread::sleep(Duration::from_micros(200));
                let sqe = self.command(i, abi::CMD_REGISTER);
                // SAFETY: as at REGISTER.
                unsafe { reactor.push(&sqe) };
            }
            // A commit refused before it was carried out: send it again.
            libc::EAGAIN | libc::EINTR if taken => {
                tracing::warn!(entry = i, errno = -result, "FUSE ring commit sent again");
                let sqe = self.command(i, abi::CMD_COMMIT_AND_FETCH);
                // SAFETY: as at REGISTER.
                unsafe { reactor.push(&sqe) };
            }
            // Unmounted or aborted: the entry is over.
            libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => {
                self.end_entry(i, result);
            }
            errno => {
                tracing::error!(
                    entry = i,
                    error = %io::Error::from_raw_os_error(errno),
                    "FUSE ring entry failed; requests of its CPU may wait for the other entry \
                     of its queue, or until unmount"
                );
                self.end_entry(i, result);
            }
        }
    }

    /// Answers the request in entry `i`, writes the reply into it, and gives the command that
    /// hands the entry back (under the one lock of the entry); or, for a request its
    /// tenant's limits hold, the timeout it waits on; or the disk reads it waits on.
    fn answer(&self, reactor: &Reactor, i: usize, work: &mut Work) -> Next {
        let mut guard = lock(&self.entries[i]);
        let e = &mut *guard;
        e.taken = true;
        let f = wire::Fields(&e.header[..]);
        e.commit_id = f.u64(abi::ENT_COMMIT_ID).unwrap_or(0);
        let in_len = f.u32(abi::ENT_PAYLOAD_SZ).unwrap_or(0) as usize;
        let Some(h) = wire::InHeader::parse(&e.header[..]) else {
            return Next::One(self.command_for(i, e, abi::CMD_COMMIT_AND_FETCH));
        };
        let limited = dispatch::limited_bytes(&h, &e.header[abi::OP_IN..abi::OP_IN + 128]);
        let answered = match limited {
            // The mount is gone: its limited requests fail at once, paying and waiting for
            // nothing (the commit fails too, and the entry ends with it).
            Some(_) if self.device_ended.load(Ordering::Acquire) => {
                if std::mem::take(&mut e.held.turn) {
                    self.ops.let_go_turn();
                }
                Ok((-libc::ENOTCONN, 0))
            }
            Some(bytes) => {
                // Paid already when it looks again for its turn, or is answered again (paying
                // again would take nothing, but count the time as the tenant's use).
                if !(e.held.turn || e.read_again) {
                    if let Some(timeout) = self.pay(i, e, &h, bytes) {
                        return Next::One(timeout);
                    }
                }
                let Some(turn) = self.take_turn(e) else {
                    let recheck = crate::fair_share::RECHECK;
                    return Next::One(self.resume_after(i, e, recheck));
                };
                if dispatch::is_long(&h, bytes) {
                    crate::serving::will_wait();
                }
                let answered =
                    io_limits::with_admitted_ahead(|| self.dispatch(reactor, e, &h, in_len, work));
                // A second answer's turn is charged the disk wait since the first, too.
                drop(turn.also_charged(e.disk_wait));
                answered
            }
            None => self.dispatch(reactor, e, &h, in_len, work),
        };
        let (error, len) = match answered {
            Ok(answer) => answer,
            Err(reads) => return Next::Reads(self.make_reads(i, e, reads)),
        };
        e.read_again = false;
        (e.first_answer, e.deferred_at, e.disk_wait) = (None, None, Duration::ZERO);
        e.reads.clear();
        wire::put_out_header(&mut e.header[..], h.unique, error, len);
        e.header[abi::ENT_PAYLOAD_SZ..abi::ENT_PAYLOAD_SZ + 4]
            .copy_from_slice(&(len as u32).to_le_bytes());
        Next::One(self.command_for(i, e, abi::CMD_COMMIT_AND_FETCH))
    }

    /// Keeps `reads`, which the request in entry `i`, `e`, handed over, in the entry: the
    /// ring's commands that make them.
    fn make_reads(
        &self,
        i: usize,
        e: &mut Entry,
        reads: Vec<Box<dyn DiskRead>>,
    ) -> Vec<squeue::Entry128> {
        self.ops.metrics.add_ring_disk_reads(reads.len() as u64);
        debug_assert!(
            e.reads.is_empty(),
            "reads in flight would lose their buffers"
        );
        e.deferred_at = Some(Instant::now());
        e.reads_left = reads.len();
        e.reads = reads.into_iter().map(|r| (r, false)).collect();
        e.reads
            .iter_mut()
            .enumerate()
            .map(|(k, (read, _))| {
                let (fd, offset, buf, len) = read.target();
                let tag = Tag::Read {
                    slot: self.slot,
                    index: i as u32,
                    read: k as u8,
                };
                opcode::Read::new(types::Fd(fd), buf, len as u32)
                    .offset(offset)
                    .build()
                    .user_data(tag.encode())
                    .into()
            })
            .collect()
    }

    /// Disk read `k` of entry `i`'s request ended with `result`: once its last is done, the
    /// request is answered again.
    fn read_completed(&self, reactor: &Reactor, i: usize, k: u8, result: i32, work: &mut Work) {
        {
            let mut guard = lock(&self.entries[i]);
            let e = &mut *guard;
            match e.reads.get_mut(usize::from(k)) {
                Some((read, done @ false)) => {
                    *done = true;
                    read.done(match result {
                        n if n >= 0 => Ok(n as usize),
                        errno => Err(io::Error::from_raw_os_error(-errno)),
                    });
                }
                _ => {
                    tracing::error!(entry = i, read = k, "FUSE ring: an unknown disk read ended");
                    return;
                }
            }
            e.reads_left -= 1;
            if e.reads_left > 0 {
                return;
            }
            e.read_again = true;
            e.disk_wait = e.deferred_at.map_or(Duration::ZERO, |t| t.elapsed());
        }
        // Answered again, the reads' bytes at hand (`dispatch`).
        self.entry_completed(reactor, i, 0, work);
    }

    /// Pays what is there of data request `h`'s tokens (`bytes`), held in entry `i`, `e`:
    /// `None` once paid, else the timeout it waits on for the next ones.
    fn pay(
        &self,
        i: usize,
        e: &mut Entry,
        h: &wire::InHeader,
        bytes: u64,
    ) -> Option<squeue::Entry128> {
        let held = &mut e.held;
        if held.unique != h.unique {
            (held.unique, held.paid, held.since) = (h.unique, Paid::default(), None);
            debug_assert!(!held.turn, "a request held for its turn was never answered");
        }
        let Some(wait) = self.ops.pay_ahead(bytes, &mut held.paid) else {
            if let Some(since) = held.since.take() {
                self.ops.metrics.record_held(since.elapsed());
            }
            return None;
        };
        held.since.get_or_insert_with(Instant::now);
        Some(self.resume_after(i, e, wait.min(HOLD_MAX)))
    }

    /// The turn of the request in entry `e` among the busy tenants' requests; `None` while it
    /// is held for it (it looks again after `fair_share::RECHECK`).
    fn take_turn(&self, e: &mut Entry) -> Option<crate::fair_share::Turn<'_>> {
        let turn = self.ops.try_turn(&mut e.held.turn);
        match turn {
            Some(_) => {
                if let Some(since) = e.held.since.take() {
                    if e.read_again {
                        // Within the time counted from the first answer already.
                        self.ops.metrics.record_throttled(since.elapsed());
                    } else {
                        self.ops.metrics.record_held(since.elapsed());
                    }
                }
            }
            None => {
                e.held.since.get_or_insert_with(Instant::now);
            }
        }
        turn
    }

    /// The timeout on which the request in entry `i`, `e`, waits `wait` to be answered.
    fn resume_after(&self, i: usize, e: &mut Entry, wait: Duration) -> squeue::Entry128 {
        *e.held.timeout = types::Timespec::new()
            .sec(wait.as_secs())
            .nsec(wait.subsec_nanos());
        let tag = Tag::Resume {
            slot: self.slot,
            index: i as u32,
        };
        opcode::Timeout::new(&*e.held.timeout)
            .build()
            .user_data(tag.encode())
            .into()
    }

    /// Answers request `h` of entry `e` (its reply into the entry's payload): the
    /// out-header's error and the reply's length; or, for a read that missed the cache, the
    /// disk reads it handed over (the first time it is answered).
    fn dispatch(
        &self,
        reactor: &Reactor,
        e: &mut Entry,
        h: &wire::InHeader,
        in_len: usize,
        work: &mut Work,
    ) -> Result<(i32, usize), Vec<Box<dyn DiskRead>>> {
        let metrics = &self.ops.metrics;
        if !e.read_again {
            metrics.add_ring_request();
        }
        if !work
            .metrics
            .as_ref()
            .is_some_and(|m| Arc::ptr_eq(m, metrics))
        {
            work.metrics = Some(metrics.clone());
        }
        reactor.saw_caller(h.pid);
        let made_here = h.opcode != wire::opcode::READ || e.read_again;
        // A read answered again has the bytes of the disk reads the ring made for it at hand.
        let made = e.read_again.then(|| {
            let reads: Vec<_> = std::mem::take(&mut e.reads)
                .into_iter()
                .map(|(read, _)| read)
                .collect();
            (reads, e.first_answer.unwrap_or_else(Instant::now))
        });
        let mut answer = || {
            dispatch::answer_or_eio(
                &self.ops,
                h,
                &e.header[abi::OP_IN..abi::OP_IN + 128],
                &mut e.payload,
                in_len,
                &mut work.scratch,
            )
        };
        if let Some((reads, since)) = made {
            return Ok(serving::with_reads(reads, since, answer));
        }
        if made_here {
            return Ok(answer());
        }
        let started = Instant::now();
        match serving::deferring(answer) {
            (answered, reads) if reads.is_empty() => Ok(answered),
            (_, reads) => {
                e.first_answer = Some(started);
                Err(reads)
            }
        }
    }

    fn poll_device(&self) {
        let poll = opcode::PollAdd::new(types::Fd(self.device.as_raw_fd()), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(Tag::Device { slot: self.slot }.encode());
        // SAFETY: a poll names no buffer; the device stays open while the connection is in
        // the registry, which it leaves only after the poll's last completion.
        unsafe { self.device_reactor().push(&poll.into()) };
    }

    fn device_completed(&self, c: Completion, work: &mut Work) {
        if c.result >= 0 {
            if !self.device_ended.load(Ordering::Acquire) {
                self.read_device(work);
            }
        } else if c.result != -libc::ECANCELED {
            tracing::error!(
                error = %io::Error::from_raw_os_error(-c.result),
                "cannot poll the FUSE device"
            );
            self.end_device();
        }
        if !cqueue::more(c.flags) {
            let turn = lock(&self.poll_turn);
            if self.device_ended.load(Ordering::Acquire) {
                drop(turn);
                self.end_one();
            } else {
                self.poll_device();
                drop(turn);
                self.device_reactor().submit();
            }
        }
    }

    /// Answers every request waiting on the device (FORGET and INTERRUPT; all requests once
    /// the ring is off), until it is empty or ended.
    fn read_device(&self, work: &mut Work) {
        loop {
            let buf = match &mut work.device_buffer {
                Some(b) => b,
                None => match RequestBuffer::new(device::BUFFER_SIZE) {
                    Ok(b) => work.device_buffer.insert(b),
                    Err(e) => {
                        tracing::error!(error = %e, "no buffer to read the FUSE device");
                        return;
                    }
                },
            };
            match nix::unistd::read(self.device.as_raw_fd(), buf) {
                Ok(n) => device::answer(&self.device, &self.ops, buf, n, &mut work.scratch),
                Err(nix::errno::Errno::EAGAIN) => return,
                // The request was interrupted before it was read, or a signal.
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::ENODEV) => {
                    self.end_device();
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the FUSE device");
                    self.end_device();
                    return;
                }
            }
        }
    }

    /// The device has ended (the mount is gone): stops its poll and starts the session's end.
    fn end_device(&self) {
        let turn = lock(&self.poll_turn);
        if self.device_ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let target = Tag::Device { slot: self.slot }.encode();
        let cancel = opcode::AsyncCancel::new(target)
            .build()
            .user_data(Tag::Wake.encode());
        let r = self.device_reactor();
        // SAFETY: a cancel names no buffer.
        unsafe { r.push(&cancel.into()) };
        drop(turn);
        r.submit();
        let Some(end) = lock(&self.on_end).take() else {
            return;
        };
        let started = crate::threads::spawn("fuse-end", end);
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start a thread to end a FUSE session");
        }
    }

    /// Entry `i`'s command ended for good (with `result`); counted once, whatever the kernel
    /// sends after.
    fn end_entry(&self, i: usize, result: i32) {
        let first = {
            let mut e = lock(&self.entries[i]);
            !std::mem::replace(&mut e.ended, true)
        };
        if first {
            self.end_one();
        } else {
            tracing::error!(
                entry = i,
                result,
                "FUSE ring: a completion for an entry that had ended; ignored"
            );
        }
    }

    /// One of the connection's commands will not complete again.
    fn end_one(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let reg = registry(self.reactors);
        reg.set(self.slot, None);
        lock(&reg.free).1.push(self.slot);
        *lock(&self.gone) = true;
        self.gone_changed.notify_all();
    }

    /// Waits up to `timeout` until nothing of the kernel refers to the connection any more;
    /// whether that happened.
    pub fn wait_gone(&self, timeout: Duration) -> bool {
        let gone = lock(&self.gone);
        let (gone, _) = self
            .gone_changed
            .wait_timeout_while(gone, timeout, |g| !*g)
            .unwrap_or_else(|p| p.into_inner());
        *gone
    }
}
