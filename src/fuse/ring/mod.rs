//! FUSE over io_uring: one queue per possible CPU, each served by a thread pinned to that CPU,
//! or, for a CPU the daemon may not run on (taskset, `CPUAffinity=`, a cpuset), to the nearest
//! CPU it may: the daemon stays on the CPUs it was given, next to none of the tenants' own.
//!
//! Why: over /dev/fuse a request wakes whichever worker thread sleeps in `read`, usually on
//! the other CPU, and that cross-CPU wake-up is most of a request's cost on this kind of host
//! (BENCHMARKS.md, "What a FUSE request costs": 22 us a request, 11 us when both sides share
//! a CPU, ~1 us of it ours). Over the ring the kernel puts a request on the queue of the CPU
//! its caller runs on, and that queue's thread answers it there.
//!
//! How (Linux >= 6.14, `enable_uring` on): after INIT, each queue thread registers ring
//! entries (`FUSE_IO_URING_CMD_REGISTER`: a 288-byte header and a payload buffer as large as
//! the biggest request) on its own io_uring. A completion means a request is in the entry;
//! the thread answers it through [`crate::fuse::ops::Operations`] and hands the entry back
//! with the reply (`COMMIT_AND_FETCH`), submitted as SCHED_IDLE while its callers are being
//! moved off their CPU by the wake-ups ([`handoff`]). The /dev/fuse workers
//! ([`crate::fuse::device`]) keep FORGET and INTERRUPT, which never go over the ring. The
//! queues exit when the kernel ends their entries at unmount (ENOTCONN) or when
//! [`Ring::stop`] wakes them.

mod abi;
mod handoff;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::fuse::buffer::RequestBuffer;
use crate::fuse::dispatch;
use crate::fuse::ops::{Operations, MAX_WRITE};
use crate::fuse::wire;

/// The module parameter root sets to let mounts use FUSE over io_uring.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";
/// Ring entries per queue: one being answered, one the kernel can fill meanwhile.
const ENTRIES_PER_QUEUE: usize = 2;
/// The payload buffer: the largest request or reply (max_write; the kernel sizes reads the
/// same through max_pages).
const PAYLOAD_SIZE: usize = MAX_WRITE as usize;
/// user_data of the stop eventfd's poll.
const STOP: u64 = u64::MAX;
/// How long a queue keeps retrying registration while the kernel finishes INIT.
const REGISTER_PATIENCE: Duration = Duration::from_secs(10);

/// How a mount's requests reach the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel has it enabled, /dev/fuse otherwise.
    #[default]
    Auto,
    /// io_uring; mounting fails if the kernel does not have it enabled.
    Uring,
    /// /dev/fuse only.
    Device,
}

impl Transport {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "uring" => Some(Self::Uring),
            "dev" => Some(Self::Device),
            _ => None,
        }
    }
}

/// Whether the kernel lets FUSE servers use io_uring (CONFIG_FUSE_IO_URING and the
/// `enable_uring` parameter on).
pub fn kernel_enabled() -> bool {
    std::fs::read_to_string(ENABLE_PARAMETER).is_ok_and(|v| v.trim() == "Y")
}

/// The CPUs the kernel may run a caller on (`/sys/devices/system/cpu/possible`, e.g. "0-3"):
/// the kernel makes one queue per possible CPU, in this order.
fn possible_cpus() -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {text:?}"));
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        cpus.extend(a..=b);
    }
    if cpus.is_empty() {
        return Err(bad());
    }
    Ok(cpus)
}

/// The io_uring side of one mount.
pub struct Ring {
    transport: Transport,
    device: Arc<DeviceSlot>,
    queues: Mutex<Vec<QueueHandle>>,
}

/// The session's /dev/fuse descriptor. fuser answers INIT inside `Session::new`, before the
/// mount can hand the descriptor over, so the queues are made at INIT and wait here for it.
#[derive(Default)]
struct DeviceSlot {
    fd: Mutex<DeviceState>,
    changed: Condvar,
}

#[derive(Default)]
enum DeviceState {
    #[default]
    Waiting,
    Set(OwnedFd),
    /// The ring stopped before a device came.
    Closed,
}

impl DeviceSlot {
    /// A duplicate of the device once it is set; None if the ring stopped first. No
    /// timeout: once io_uring is negotiated the kernel holds every request until all queues
    /// register, so a queue gives up only when the ring is stopped (the mount failed or ended).
    fn wait(&self) -> Option<io::Result<OwnedFd>> {
        let guard = self.fd.lock().unwrap_or_else(|p| p.into_inner());
        let guard = self
            .changed
            .wait_while(guard, |s| matches!(s, DeviceState::Waiting))
            .unwrap_or_else(|p| p.into_inner());
        match &*guard {
            DeviceState::Set(fd) => Some(fd.try_clone()),
            _ => None,
        }
    }

    fn set(&self, state: DeviceState) {
        *self.fd.lock().unwrap_or_else(|p| p.into_inner()) = state;
        self.changed.notify_all();
    }
}

struct QueueHandle {
    stop: OwnedFd,
    thread: JoinHandle<()>,
}

impl Ring {
    pub fn new(transport: Transport) -> Self {
        Self {
            transport,
            device: Arc::default(),
            queues: Mutex::new(Vec::new()),
        }
    }

    /// Gives the ring the mounted session's device (the queues register with it).
    pub fn set_device(&self, fd: OwnedFd) {
        self.device.set(DeviceState::Set(fd));
    }

    /// Whether to offer io_uring at INIT.
    pub fn wanted(&self) -> bool {
        self.transport != Transport::Device && kernel_enabled()
    }

    /// Sets up every queue and starts its thread; returns the number of queues. Nothing is
    /// left running on error. The queues register once the device is set.
    pub fn start(&self, ops: Arc<Operations>) -> io::Result<usize> {
        let mut prepared = Vec::new();
        let callers = Arc::new(handoff::Callers::default());
        let allowed = allowed_cpus();
        for (qid, cpu) in possible_cpus()?.into_iter().enumerate() {
            let serving = serving_cpu(cpu, &allowed);
            prepared.push(Queue::new(qid as u16, serving, callers.clone())?);
        }
        let n = prepared.len();
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for q in prepared {
            let stop = q.stop.try_clone()?;
            let ops = ops.clone();
            let device = self.device.clone();
            let thread = std::thread::Builder::new()
                .name(format!("fuse-ring-{}", q.qid))
                .spawn(move || q.serve(&device, &ops));
            match thread {
                Ok(thread) => queues.push(QueueHandle { stop, thread }),
                Err(e) => {
                    drop(queues);
                    self.stop();
                    return Err(e);
                }
            }
        }
        Ok(n)
    }

    /// Wakes every queue thread and waits for it to end.
    pub fn stop(&self) {
        {
            let mut fd = self.device.fd.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*fd, DeviceState::Waiting) {
                *fd = DeviceState::Closed;
            }
        }
        self.device.changed.notify_all();
        let queues = std::mem::take(&mut *self.queues.lock().unwrap_or_else(|p| p.into_inner()));
        for q in &queues {
            // An eventfd write of 1 makes the queue's poll complete.
            let one = 1u64.to_ne_bytes();
            let _ = nix::unistd::write(&q.stop, &one);
        }
        for q in queues {
            if q.thread.join().is_err() {
                tracing::error!("a FUSE ring queue thread panicked");
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One registered ring entry: the buffers the kernel writes requests into. They never move
/// or shrink while registered (boxed, owned by the queue until its io_uring is gone).
struct Entry {
    header: Box<[u8; abi::HEADER_SIZE]>,
    payload: RequestBuffer,
    /// `struct iovec[2]` (base, length; base, length) for REGISTER, as plain words so the
    /// queue can move to its thread.
    iov: Box<[usize; 4]>,
    commit_id: u64,
}

impl Entry {
    fn new() -> io::Result<Self> {
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
        })
    }
}

/// One CPU's queue, served by one thread.
struct Queue {
    qid: u16,
    /// Where its thread runs: its own CPU, or the nearest one the daemon may use.
    cpu: usize,
    /// The session's device, once the mount has handed it over.
    device: Option<OwnedFd>,
    stop: OwnedFd,
    // Declared before `entries`: the io_uring is torn down before the buffers it names.
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Entry>,
    scratch: Vec<u8>,
    handoff: handoff::Handoff,
}

impl Queue {
    fn new(qid: u16, cpu: usize, callers: Arc<handoff::Callers>) -> io::Result<Self> {
        let stop = nix::sys::eventfd::EventFd::from_flags(nix::sys::eventfd::EfdFlags::EFD_CLOEXEC)
            .map_err(io::Error::from)?;
        let mut builder = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
        if failpoint_submit() {
            // A ring only this (the INIT) thread may submit to: the queue thread's first
            // submission is refused by the kernel (EEXIST), as a broken io_uring would be.
            builder.setup_single_issuer();
        }
        let uring = builder.build((ENTRIES_PER_QUEUE as u32 + 1).next_power_of_two())?;
        Ok(Self {
            qid,
            cpu,
            device: None,
            stop: stop.into(),
            uring,
            entries: (0..ENTRIES_PER_QUEUE)
                .map(|_| Entry::new())
                .collect::<io::Result<_>>()?,
            scratch: Vec::new(),
            handoff: handoff::Handoff::new(callers, qid),
        })
    }

    /// The ring command for entry `i`: REGISTER names its buffers, COMMIT_AND_FETCH hands
    /// back its reply (by the request's commit id) and asks for the next request.
    fn command(&self, i: usize, cmd: u32) -> squeue::Entry128 {
        let mut req = [0u8; 80];
        // struct fuse_uring_cmd_req: flags (u64), commit_id (u64), qid (u16).
        if cmd == abi::CMD_COMMIT_AND_FETCH {
            req[8..16].copy_from_slice(&self.entries[i].commit_id.to_le_bytes());
        }
        req[16..18].copy_from_slice(&self.qid.to_le_bytes());
        let fd = self.device.as_ref().map_or(-1, |d| d.as_raw_fd());
        let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd)
            .cmd(req)
            .build()
            .user_data(i as u64);
        if cmd == abi::CMD_REGISTER {
            let iov = &self.entries[i].iov;
            with_address(sqe, iov.as_ptr() as u64, 2)
        } else {
            sqe
        }
    }

    fn push(&mut self, sqe: &squeue::Entry128) {
        // SAFETY: every buffer an SQE names (the entry's iovec array, header and payload) is
        // owned by this queue and outlives its io_uring (field order), and no entry is
        // submitted twice: each SQE is pushed once per completion of the same entry.
        // The queue has room: it holds one SQE per entry plus the stop poll.
        unsafe {
            self.uring
                .submission()
                .push(sqe)
                .expect("the submission queue holds every entry");
        }
    }

    fn serve(mut self, device: &DeviceSlot, ops: &Operations) {
        pin_to_cpu(self.cpu);
        match device.wait() {
            Some(Ok(fd)) => self.device = Some(fd),
            Some(Err(e)) => {
                tracing::error!(qid = self.qid, error = %e, "cannot use the FUSE device");
                return;
            }
            None => return,
        }
        let poll = opcode::PollAdd::new(types::Fd(self.stop.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(STOP);
        // SAFETY: a poll names no buffer, only the eventfd this queue owns.
        unsafe {
            self.uring
                .submission()
                .push(&poll.into())
                .expect("the submission queue has room for the stop poll");
        }
        for i in 0..self.entries.len() {
            let sqe = self.command(i, abi::CMD_REGISTER);
            self.push(&sqe);
        }
        let started = Instant::now();
        let mut completions = Vec::with_capacity(ENTRIES_PER_QUEUE + 1);
        let mut submitted = false;
        loop {
            if submitted && !self.uring.submission().is_empty() && self.handoff.next() {
                // The replies go alone, so that their callers wake while this thread yields.
                let (handoff, uring) = (&mut self.handoff, &self.uring);
                match handoff.hand_off(&ops.metrics, || uring.submit()) {
                    Err(e) if e.raw_os_error() != Some(libc::EINTR) => {
                        tracing::error!(qid = self.qid, error = %e, "FUSE ring queue failed");
                        return;
                    }
                    // Submitted, or left for the wait below.
                    _ => {}
                }
            }
            match self.uring.submit_and_wait(1) {
                Ok(_) => submitted = true,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if !submitted => {
                    // The entries never reached the kernel, which holds every request until
                    // they do: turn the ring off for this mount instead.
                    tracing::error!(qid = self.qid, error = %e, "FUSE ring queue cannot submit");
                    self.fall_back();
                    return;
                }
                Err(e) => {
                    tracing::error!(qid = self.qid, error = %e, "FUSE ring queue failed");
                    return;
                }
            }
            completions.clear();
            completions.extend(self.uring.completion().map(|c| (c.user_data(), c.result())));
            for &(user_data, result) in &completions {
                if user_data == STOP {
                    return;
                }
                let i = user_data as usize;
                match -result {
                    0 => {
                        self.answer(i, ops);
                        let sqe = self.command(i, abi::CMD_COMMIT_AND_FETCH);
                        self.push(&sqe);
                    }
                    // The kernel has not processed the INIT reply yet: register again.
                    libc::EAGAIN | libc::EINTR if started.elapsed() < REGISTER_PATIENCE => {
                        std::thread::sleep(Duration::from_micros(200));
                        let sqe = self.command(i, abi::CMD_REGISTER);
                        self.push(&sqe);
                    }
                    // Unmounted or aborted: the entries are over.
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => {
                        tracing::debug!(qid = self.qid, "FUSE ring queue ends");
                        return;
                    }
                    errno => {
                        tracing::error!(
                            qid = self.qid,
                            error = %io::Error::from_raw_os_error(errno),
                            "FUSE ring entry failed; the kernel serves requests over /dev/fuse"
                        );
                        return;
                    }
                }
            }
        }
    }

    /// Makes the kernel serve this mount over /dev/fuse: a REGISTER it refuses (no buffers)
    /// turns FUSE over io_uring off for the connection (`fc->io_uring = 0`), and the requests
    /// waiting for the ring go to /dev/fuse. For a queue that failed before its entries
    /// reached the kernel.
    fn fall_back(&self) {
        let refused = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(1)
            .and_then(|mut uring| {
                let sqe = with_address(self.command(0, abi::CMD_REGISTER), 0, 0);
                // SAFETY: the command names no buffer (address 0, no iovecs).
                unsafe { uring.submission().push(&sqe) }.map_err(io::Error::other)?;
                uring.submit_and_wait(1)?;
                let result = uring.completion().next().map_or(0, |c| c.result());
                Ok(result)
            });
        match refused {
            Ok(r) if r < 0 => tracing::warn!(
                qid = self.qid,
                "FUSE over io_uring turned off for this mount: serving over /dev/fuse"
            ),
            other => tracing::error!(
                qid = self.qid,
                ?other,
                "could not turn FUSE over io_uring off; requests may wait for this queue"
            ),
        }
    }

    /// Answers the request in entry `i` and writes the reply into it.
    fn answer(&mut self, i: usize, ops: &Operations) {
        let e = &mut self.entries[i];
        let f = wire::Fields(&e.header[..]);
        e.commit_id = f.u64(abi::ENT_COMMIT_ID).unwrap_or(0);
        let in_len = f.u32(abi::ENT_PAYLOAD_SZ).unwrap_or(0) as usize;
        let Some(h) = wire::InHeader::parse(&e.header[..]) else {
            return;
        };
        ops.metrics.add_ring_request();
        self.handoff.saw(h.pid);
        let op_in = &e.header[abi::OP_IN..abi::OP_IN + 128];
        let (error, len) =
            dispatch::answer_or_eio(ops, &h, op_in, &mut e.payload, in_len, &mut self.scratch);
        wire::put_out_header(&mut e.header[..], h.unique, error, len);
        e.header[abi::ENT_PAYLOAD_SZ..abi::ENT_PAYLOAD_SZ + 4]
            .copy_from_slice(&(len as u32).to_le_bytes());
    }
}

/// Failpoint `fuse-ring-submit` (tests: `FAILPOINTS=fuse-ring-submit=return`) makes every
/// queue's first submission fail, to show that the mount then falls back to /dev/fuse.
fn failpoint_submit() -> bool {
    fail::fail_point!("fuse-ring-submit", |_| true);
    false
}

/// Sets an SQE's `addr` and `len` (the io_uring crate's UringCmd80 leaves them zero; the
/// FUSE REGISTER command takes its iovec array there).
fn with_address(sqe: squeue::Entry128, addr: u64, len: u32) -> squeue::Entry128 {
    const ADDR: usize = 16;
    const LEN: usize = 24;
    // SAFETY: Entry128 is #[repr(C)] (a `struct io_uring_sqe` and 64 more bytes, 128 in all;
    // checked by a test), made only of integers and unions of integers, so every byte
    // pattern is a valid value; `addr` and `len` sit at offsets 16 and 24 of the kernel's
    // `struct io_uring_sqe` (its ABI, also checked by a test).
    unsafe {
        let mut bytes: [u8; 128] = std::mem::transmute(sqe);
        bytes[ADDR..ADDR + 8].copy_from_slice(&addr.to_ne_bytes());
        bytes[LEN..LEN + 4].copy_from_slice(&len.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
    }
}

/// The CPUs this process may run on: its affinity when the queues start (a cpuset narrows it
/// too). Empty if it cannot be read.
fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..nix::sched::CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect()
}

/// The CPU that serves `cpu`'s queue: `cpu` itself if the daemon may run there (or nothing
/// is known of where it may), else the nearest allowed one (the lower of two as near).
fn serving_cpu(cpu: usize, allowed: &[usize]) -> usize {
    allowed
        .iter()
        .copied()
        .min_by_key(|&a| (a.abs_diff(cpu), a))
        .unwrap_or(cpu)
}

/// Keeps the calling thread on `cpu`, where the kernel queues the requests of that CPU's
/// callers (or, see [`serving_cpu`], the nearest CPU the daemon may use). A CPU that cannot be
/// used (offline) leaves the thread unpinned.
fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let pinned = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = pinned {
        tracing::debug!(cpu, error = %e, "FUSE ring queue thread not pinned");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sqe_gets_its_address_and_length_at_the_kernel_offsets() {
        assert_eq!(std::mem::size_of::<squeue::Entry128>(), 128);
        let sqe = opcode::UringCmd80::new(types::Fd(3), abi::CMD_REGISTER)
            .build()
            .user_data(42);
        let sqe = with_address(sqe, 0x1122_3344_5566_7788, 2);
        // SAFETY: as in with_address: a plain 128-byte repr(C) value.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], opcode::UringCmd80::CODE, "opcode");
        assert_eq!(&bytes[4..8], &3i32.to_ne_bytes(), "fd");
        assert_eq!(
            &bytes[16..24],
            &0x1122_3344_5566_7788u64.to_ne_bytes(),
            "addr"
        );
        assert_eq!(&bytes[24..28], &2u32.to_ne_bytes(), "len");
        assert_eq!(&bytes[32..40], &42u64.to_ne_bytes(), "user_data");
    }

    #[test]
    fn an_iovec_is_two_words() {
        assert_eq!(
            std::mem::size_of::<libc::iovec>(),
            2 * std::mem::size_of::<usize>()
        );
        let mut e = Entry::new().unwrap();
        assert_eq!(e.iov[0], e.header.as_mut_ptr() as usize);
        assert_eq!(e.iov[3], PAYLOAD_SIZE);
    }

    #[test]
    fn the_cpu_list_is_read_as_the_kernel_writes_it() {
        let cpus = possible_cpus().unwrap();
        assert!(!cpus.is_empty());
        assert_eq!(cpus[0], 0);
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_queue_of_a_cpu_the_daemon_may_not_use_is_served_from_the_nearest_it_may() {
        assert_eq!(serving_cpu(1, &[0, 1]), 1);
        assert_eq!(serving_cpu(1, &[0]), 0);
        assert_eq!(serving_cpu(5, &[2, 4, 6, 9]), 4, "as near as 6: the lower");
        assert_eq!(serving_cpu(7, &[2, 9]), 9);
        assert_eq!(serving_cpu(3, &[]), 3, "nothing known: its own");
        assert!(!allowed_cpus().is_empty(), "this process runs somewhere");
    }

    #[test]
    fn transports_parse_from_their_option_names() {
        assert_eq!(Transport::parse("auto"), Some(Transport::Auto));
        assert_eq!(Transport::parse("uring"), Some(Transport::Uring));
        assert_eq!(Transport::parse("dev"), Some(Transport::Device));
        assert_eq!(Transport::parse("ring"), None);
    }

    #[test]
    fn a_dev_ring_is_never_offered() {
        assert!(!Ring::new(Transport::Device).wanted());
    }

    #[test]
    fn queues_started_before_the_device_comes_stop_at_once() {
        let (_tmp, ops) = crate::fuse::ops::test_operations();
        let ring = Ring::new(Transport::Uring);
        let n = ring.start(ops).unwrap();
        assert_eq!(n, possible_cpus().unwrap().len());
        assert_eq!(ring.queues.lock().unwrap().len(), n);
        let t = Instant::now();
        ring.stop();
        assert!(ring.queues.lock().unwrap().is_empty());
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "stop waited {:?} for queues that had no device",
            t.elapsed()
        );
    }
}
