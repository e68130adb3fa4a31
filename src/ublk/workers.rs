//! The threads that carry out a device's requests. A queue thread drives the kernel's
//! io_uring and must never block on the store (one slow read would stall every request of
//! its queue), so each request goes to these workers and its answer comes back over a
//! channel, with the queue's eventfd written to wake its ring.
//!
//! Suspending (a daemon shutting down with the device kept for recovery) lets the requests
//! being carried out finish, then holds every later one unanswered: the kernel reissues
//! those to the next server (`UBLK_F_USER_RECOVERY_REISSUE`), so no user sees an error.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use nix::sys::eventfd::EventFd;

use super::lock;
use super::request::Request;
use crate::blockdev::BlockDevice;

/// Workers per device: enough to keep several store reads in flight at QD16 on two CPUs.
const WORKERS: usize = 4;

/// One request handed to the workers, with where its answer goes.
pub(super) struct Job {
    pub request: Request,
    /// A WRITE's bytes.
    pub data: Vec<u8>,
    pub reply: smol::channel::Sender<Answer>,
    /// The requesting queue's eventfd, written once the answer is sent.
    pub wake: Arc<EventFd>,
}

/// A request's result for the kernel, and a READ's bytes.
pub(super) struct Answer {
    pub result: i32,
    pub data: Vec<u8>,
}

#[derive(Default)]
struct Gate {
    suspended: bool,
    running: usize,
}

/// A device's workers.
pub(super) struct Workers {
    device: Arc<BlockDevice>,
    jobs: Mutex<Option<Sender<Job>>>,
    gate: Arc<(Mutex<Gate>, Condvar)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    pub fn start(device: Arc<BlockDevice>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let gate = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
        let mut threads = Vec::new();
        for i in 0..WORKERS {
            let (rx, gate, device) = (rx.clone(), gate.clone(), device.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ublk-io-{i}"))
                    .spawn(move || loop {
                        let Ok(job) = lock(&rx).recv() else { return };
                        let Job {
                            request,
                            data: written,
                            reply,
                            wake,
                        } = job;
                        let mut data = Vec::new();
                        let result =
                            gated(&gate, || carry_out(&device, request, &written, &mut data));
                        // The queue may be gone (the device stopped): nobody waits then.
                        if reply.try_send(Answer { result, data }).is_ok() {
                            let _ = wake.write(1);
                        }
                    })?,
            );
        }
        Ok(Self {
            device,
            jobs: Mutex::new(Some(tx)),
            gate,
            threads: Mutex::new(threads),
        })
    }

    /// Hands `job` to a worker; false once the workers are stopped.
    pub fn submit(&self, job: Job) -> bool {
        lock(&self.jobs)
            .as_ref()
            .is_some_and(|tx| tx.send(job).is_ok())
    }

    /// Carries `request` out on the calling thread (a queue thread with no other request
    /// to serve: no hand-over to a worker and back), under the same suspend gate.
    pub fn carry_out_here(&self, request: Request, written: &[u8], read: &mut Vec<u8>) -> i32 {
        gated(&self.gate, || {
            carry_out(&self.device, request, written, read)
        })
    }

    /// Waits for the requests being carried out; later ones are never answered.
    pub fn suspend(&self) {
        let (m, cv) = &*self.gate;
        let mut g = lock(m);
        g.suspended = true;
        while g.running > 0 {
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Stops the workers once the queued requests are answered (the queues are down).
    pub fn stop(&self) {
        lock(&self.jobs).take();
        for t in std::mem::take(&mut *lock(&self.threads)) {
            let _ = t.join();
        }
    }
}

/// Runs `f` unless the device is suspended (then waits forever: the request stays with the
/// kernel for the next server), counted as running meanwhile.
fn gated(gate: &(Mutex<Gate>, Condvar), f: impl FnOnce() -> i32) -> i32 {
    let (m, cv) = gate;
    {
        let mut g = lock(m);
        while g.suspended {
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.running += 1;
    }
    let result = f();
    lock(m).running -= 1;
    cv.notify_all();
    result
}

/// Carries out one request on the device, a WRITE's bytes from `written`, a READ's into
/// `read`: the bytes done, or a negative errno.
fn carry_out(device: &BlockDevice, request: Request, written: &[u8], read: &mut Vec<u8>) -> i32 {
    let r = match request {
        Request::Read { offset, len } => device.read(offset, len, read),
        Request::Write { offset, fua, .. } => device.write(offset, written, fua),
        Request::Flush => device.flush(),
        Request::Discard { offset, len, fua } => device.discard(offset, len, fua),
        Request::Unsupported(_) => return request.done(),
    };
    match r {
        Ok(()) => request.done(),
        Err(e) => {
            tracing::warn!(volume = device.name(), ?request, error = %e, "ublk request failed");
            -e.errno()
        }
    }
}
