//! The /dev/fuse transport: worker threads that read requests from the mount's device, answer
//! them through [`dispatch`] and write the replies back, growing on demand from one.
//!
//! Why our own loop: fuser's `Session::run` starts a fixed number of threads per mount, so an
//! idle mount kept five threads (one waiting for the end, four reading the device). Here the
//! session's own thread is the first worker; a worker that takes a request when no other is
//! waiting starts one more (up to [`Workers::max`]), so concurrent requests never queue
//! behind a busy thread; a worker that has waited [`IDLE_RETIRE`] without a request ends,
//! except the first. An idle mount costs that one thread. Over the ring this loop carries
//! only FORGET and INTERRUPT (the kernel sends nothing else here), so it stays at one thread.
//!
//! How: the device is non-blocking; a worker waits in poll(2) with a timeout, then reads.
//! Several waiting workers may all wake for one request; one reads it, the others find the
//! device empty (EAGAIN) and wait again. Each read is one whole request (the kernel never
//! splits them), in a buffer as large as the largest write. The mount is gone when a read
//! says ENODEV; the first worker then joins every other before it returns, so nothing of the
//! volume outlives [`serve`].

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno as Sys;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::buffer::RequestBuffer;
use super::dispatch;
use super::ops::{Operations, MAX_WRITE};
use super::wire::{self, opcode, Fields, InHeader, IN_HEADER_SIZE, OUT_HEADER_SIZE};

/// How long a worker beyond the first waits for a request before it ends.
pub const IDLE_RETIRE: Duration = Duration::from_secs(5);

/// A read buffer: the largest write request and its headers.
pub(super) const BUFFER_SIZE: usize = MAX_WRITE as usize + 4096;

/// The thread counts of one mount's workers.
#[derive(Default)]
struct Counts {
    /// Workers alive, the first included.
    running: usize,
    /// Workers waiting for a request (not answering one).
    waiting: usize,
    /// Workers started by others; joined when they have ended.
    started: Vec<JoinHandle<()>>,
}

/// The workers of one mount.
struct Workers {
    /// Shared with the mount's notifier: one descriptor for both.
    device: Arc<OwnedFd>,
    ops: Arc<Operations>,
    /// The most workers at once.
    max: usize,
    /// Thread name of the workers started on demand.
    name: String,
    counts: Mutex<Counts>,
}

/// What a worker's wait for a request gave.
enum Next {
    /// A request of this many bytes is in the buffer.
    Request(usize),
    /// No request came within [`IDLE_RETIRE`].
    Idle,
    /// Nothing to read after all (another worker took it, or a signal): wait again.
    Again,
    /// The mount is gone.
    Ended,
}

/// Serves the mount of `device` on this thread and on up to `max - 1` more started on demand
/// (named `name`); returns when the mount is gone and every worker has ended.
pub fn serve(device: Arc<OwnedFd>, ops: Arc<Operations>, max: usize, name: &str) -> io::Result<()> {
    fcntl(device.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let workers = Arc::new(Workers {
        device,
        ops,
        max: max.max(1),
        name: name.chars().take(15).collect(),
        counts: Mutex::new(Counts {
            running: 1,
            waiting: 1,
            started: Vec::new(),
        }),
    });
    workers.publish(&workers.counts());
    let result = workers.work(true);
    // Every worker reads ENODEV once the mount is gone; wait for all of them (a worker that
    // took a request just before may still start another, hence the loop).
    loop {
        let started = std::mem::take(&mut workers.counts().started);
        if started.is_empty() {
            break;
        }
        for t in started {
            if t.join().is_err() {
                tracing::error!("a FUSE worker thread panicked");
            }
        }
    }
    result
}

impl Workers {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes the number of running workers (`stats`, metrics).
    fn publish(&self, c: &Counts) {
        self.ops.metrics.set_fuse_workers(c.running);
    }

    /// One worker's loop; the first never retires.
    fn work(self: &Arc<Self>, first: bool) -> io::Result<()> {
        let mut scratch = Vec::new();
        let mut buf = match RequestBuffer::new(BUFFER_SIZE) {
            Ok(b) => b,
            Err(e) => {
                self.leave();
                return Err(e);
            }
        };
        let result = loop {
            match self.next(&mut buf) {
                Ok(Next::Request(n)) => {
                    self.took();
                    self.handle(&mut buf, n, &mut scratch);
                    self.counts().waiting += 1;
                }
                Ok(Next::Idle) if !first && self.counts().running > 1 => {
                    tracing::debug!("an idle FUSE worker ends");
                    break Ok(());
                }
                Ok(Next::Idle | Next::Again) => {}
                Ok(Next::Ended) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.leave();
        result
    }

    /// Counts a waiting worker out as it ends.
    fn leave(&self) {
        let mut c = self.counts();
        c.running -= 1;
        c.waiting -= 1;
        self.publish(&c);
    }

    /// Waits up to [`IDLE_RETIRE`] for a request and reads it.
    fn next(&self, buf: &mut [u8]) -> io::Result<Next> {
        let mut fds = [PollFd::new(self.device.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(IDLE_RETIRE).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) => return Ok(Next::Idle),
            Ok(_) => {}
            Err(Sys::EINTR) => return Ok(Next::Again),
            Err(e) => return Err(e.into()),
        }
        match nix::unistd::read(self.device.as_raw_fd(), buf) {
            Ok(n) => Ok(Next::Request(n)),
            // EAGAIN: another worker read it; ENOENT: the request was interrupted before it
            // was read.
            Err(Sys::EAGAIN | Sys::EINTR | Sys::ENOENT) => Ok(Next::Again),
            Err(Sys::ENODEV) => Ok(Next::Ended),
            Err(e) => Err(e.into()),
        }
    }

    /// Counts this worker busy and starts another when none is left waiting.
    fn took(self: &Arc<Self>) {
        let mut c = self.counts();
        c.waiting -= 1;
        if c.waiting > 0 || c.running >= self.max {
            return;
        }
        // Reap workers that retired, so the list stays as short as the pool.
        let (ended, alive): (Vec<_>, Vec<_>) = std::mem::take(&mut c.started)
            .into_iter()
            .partition(|t| t.is_finished());
        c.started = alive;
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || {
                if let Err(e) = me.work(false) {
                    tracing::error!(error = %e, "a FUSE worker failed");
                }
            });
        match spawned {
            Ok(t) => {
                c.running += 1;
                c.waiting += 1;
                c.started.push(t);
                self.publish(&c);
                tracing::debug!(workers = c.running, "FUSE worker started");
            }
            Err(e) => tracing::warn!(error = %e, "cannot start another FUSE worker"),
        }
        drop(c);
        for t in ended {
            let _ = t.join();
        }
    }

    /// Answers the request in `buf[..n]`.
    fn handle(&self, buf: &mut [u8], n: usize, scratch: &mut Vec<u8>) {
        answer(&self.device, &self.ops, buf, n, scratch);
    }
}

/// Answers the request read from `device` into `buf[..n]` (the reply goes out from the same
/// buffer): what a /dev/fuse worker does with each request, and the host's ring threads with
/// what a ring mount's device still carries (FORGET, INTERRUPT; everything once the ring is
/// off).
pub(super) fn answer(
    device: &OwnedFd,
    ops: &Operations,
    buf: &mut [u8],
    n: usize,
    scratch: &mut Vec<u8>,
) {
    let Some(h) = InHeader::parse(&buf[..n]).filter(|_| n >= IN_HEADER_SIZE) else {
        tracing::warn!(bytes = n, "a FUSE request shorter than its header; ignored");
        return;
    };
    let args_len = n - IN_HEADER_SIZE;
    if consume(ops, &h, &buf[IN_HEADER_SIZE..n]) {
        return;
    }
    let fixed = wire::fixed_in_size(h.opcode);
    let (error, len) = if args_len < fixed {
        (-libc::EINVAL, 0)
    } else if h.opcode == opcode::DESTROY {
        (0, 0)
    } else {
        let (op_in, rest) = buf[IN_HEADER_SIZE..].split_at_mut(fixed);
        // On a ring thread (a mount fallen back to /dev/fuse), a large write gives up the
        // thread's lead first, as over the ring; on a mount's own worker this does nothing.
        if dispatch::limited_bytes(&h, op_in).is_some_and(|b| dispatch::is_long(&h, b)) {
            crate::serving::will_wait();
        }
        dispatch::answer_or_eio(ops, &h, op_in, rest, args_len - fixed, scratch)
    };
    let mut out = [0u8; OUT_HEADER_SIZE];
    wire::put_out_header(&mut out, h.unique, error, len);
    let reply = IN_HEADER_SIZE + fixed;
    let bufs = [IoSlice::new(&out), IoSlice::new(&buf[reply..reply + len])];
    match nix::sys::uio::writev(device, &bufs) {
        // ENOENT: the request was interrupted and nothing waits for the reply; ENODEV: the
        // mount is gone, which the next read says.
        Ok(_) | Err(Sys::ENOENT | Sys::ENODEV) => {}
        Err(e) => tracing::error!(opcode = h.opcode, error = %e, "cannot send a FUSE reply"),
    }
}

/// Handles the requests that get no reply; says whether `h` was one.
fn consume(ops: &Operations, h: &InHeader, args: &[u8]) -> bool {
    match h.opcode {
        opcode::FORGET => {
            if let Some(nlookup) = Fields(args).u64(0) {
                ops.forget(h.nodeid, nlookup);
            }
        }
        opcode::BATCH_FORGET => {
            let count = Fields(args).u32(0).unwrap_or(0) as usize;
            let forgets = args.get(8..).unwrap_or_default();
            for one in forgets.chunks_exact(16).take(count) {
                let f = Fields(one);
                if let (Some(ino), Some(nlookup)) = (f.u64(0), f.u64(8)) {
                    ops.forget(ino, nlookup);
                }
            }
        }
        // Interrupts are not acted on: every operation is short and finishes.
        opcode::INTERRUPT | opcode::NOTIFY_REPLY => {}
        _ => return false,
    }
    true
}
