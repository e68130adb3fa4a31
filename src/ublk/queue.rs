//! One ublk queue: a thread with the queue's io_uring, one task per tag on a local executor.
//! A tag's task fetches a request (its data copied by the driver into the tag's buffer),
//! hands it to the workers, and commits the answer while fetching the next request, in one
//! command. A further task keeps a poll on the queue's eventfd in the same ring, so a worker's
//! answer wakes the thread out of its wait for the ring.

use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;

use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::uring_async::wait_and_handle_io_events;
use libublk::{BufDesc, UblkError};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::request::Request;
use super::workers::{Answer, Job, Workers};

/// How long an idle queue waits on its ring before looking again (the driver's own idle
/// handling; answers wake it at once through the eventfd).
const IDLE_SECS: u64 = 20;

/// Serves queue `qid` of `dev` until the device stops.
pub(super) fn serve(qid: u16, dev: &UblkDev, workers: &Arc<Workers>) {
    let queue = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(error) => {
            tracing::error!(queue = qid, %error, "cannot set up a ublk queue");
            return;
        }
    };
    let wake = match EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC) {
        Ok(e) => Arc::new(e),
        Err(error) => {
            tracing::error!(queue = qid, %error, "cannot make a ublk queue's eventfd");
            return;
        }
    };
    let exe = Rc::new(smol::LocalExecutor::new());
    let tasks: Vec<_> = (0..dev.dev_info.queue_depth)
        .map(|tag| {
            let (q, workers, wake) = (queue.clone(), workers.clone(), wake.clone());
            exe.spawn(async move {
                match serve_tag(&q, tag, &workers, &wake).await {
                    Ok(()) | Err(UblkError::QueueIsDown) => {}
                    Err(error) => tracing::error!(tag, %error, "ublk tag stopped"),
                }
            })
        })
        .collect();
    let waker = {
        let (q, wake) = (queue.clone(), wake.clone());
        exe.spawn(async move { watch_eventfd(&q, &wake).await })
    };
    let ex = exe.clone();
    smol::block_on(exe.run(async move {
        let run = || while ex.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        if let Err(error) = wait_and_handle_io_events(&queue, Some(IDLE_SECS), run, done).await {
            tracing::error!(queue = qid, %error, "ublk queue stopped");
        }
    }));
    drop(waker);
}

/// One tag's loop: fetch a request, carry it out through the workers, commit its result.
async fn serve_tag(
    q: &UblkQueue<'_>,
    tag: u16,
    workers: &Workers,
    wake: &Arc<EventFd>,
) -> Result<(), UblkError> {
    let max = q.dev.dev_info.max_io_buf_bytes;
    let mut buf = IoBuf::<u8>::new(max as usize);
    let (reply, answers) = smol::channel::bounded::<Answer>(1);
    q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf))
        .await?;
    loop {
        let iod = q.get_iod(tag);
        let request = Request::decode(iod.op_flags, iod.start_sector, iod.nr_sectors, max);
        let written = match request {
            Request::Write { len, .. } => &buf.as_slice()[..len as usize],
            _ => &[],
        };
        // The requests this queue holds now (counted as the ring is reaped, so the others of
        // this batch are in it already): one alone is carried out here, saving the hand-over
        // to a worker and the wake-up back (two thread switches per request at QD1) and the
        // copy of a write's bytes; those that sync (FLUSH, FUA) and any that have company go
        // to the workers.
        #[allow(deprecated)]
        let alone = q.get_inflight_nr_io() <= 1;
        let (result, read) = if alone && request.is_quick() {
            let mut read = Vec::new();
            (workers.carry_out_here(request, written, &mut read), read)
        } else if workers.submit(Job {
            request,
            data: written.to_vec(),
            reply: reply.clone(),
            wake: wake.clone(),
        }) {
            match answers.recv().await {
                Ok(answer) => (answer.result, answer.data),
                Err(_) => (-libc::EIO, Vec::new()),
            }
        } else {
            (-libc::EIO, Vec::new())
        };
        if let (Request::Read { .. }, true) = (request, result >= 0) {
            buf.as_mut_slice()[..read.len()].copy_from_slice(&read);
        }
        q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), result)
            .await?;
    }
}

/// Keeps a poll on the eventfd in the queue's ring: each answer's write completes it, which
/// wakes the ring's wait; the tasks the answers woke then run.
async fn watch_eventfd(q: &UblkQueue<'_>, wake: &EventFd) {
    let fd = io_uring_ublk::types::Fd(wake.as_raw_fd());
    loop {
        let poll = io_uring_ublk::opcode::PollAdd::new(fd, libc::POLLIN as u32).build();
        if q.ublk_submit_sqe(poll).await < 0 {
            return;
        }
        // Reset the count (non-blocking: another wake may have read it already).
        let _ = wake.read();
    }
}
