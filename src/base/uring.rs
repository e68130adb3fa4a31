//! The io_uring engine for pack I/O: a tokio-uring runtime on a dedicated thread.
//!
//! Callers stay synchronous: `read_at`, `write_at` and `read_many` send one request (a `dup` of
//! the caller's file descriptor and the operations, each naming the caller's buffer by raw
//! pointer) over a channel to the ring thread and block until it answers. The ring thread
//! submits every operation of every queued request at once (a `read_many` of N slots is N
//! reads in flight, one `io_uring_enter`), waits for all of them, then answers each request.
//!
//! What makes the raw pointers sound: the ring thread answers a request only after every one
//! of its operations has completed, and the caller does not return (so its buffers stay
//! borrowed) before the answer. The only ways to lose an in-flight operation (a panic in the
//! ring thread or in one of its tasks) abort the process instead of answering, so a caller can
//! never get its buffer back while the kernel may still write into it.
//!
//! Works with O_DIRECT files: the buffers are the caller's (page-aligned, see
//! `pack::aligned`), nothing is copied.

use std::fs::File;
use std::io;
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio_uring::buf::{IoBuf, IoBufMut};

use super::pack::PackIo;

/// Submission queue entries: more than any prefetch batch, so one batch is one submission.
const DEFAULT_ENTRIES: u32 = 256;

/// A caller's buffer that the kernel writes into (a read).
struct ReadBuf {
    ptr: *mut u8,
    len: usize,
}

/// A caller's buffer that the kernel reads from (a write).
struct WriteBuf {
    ptr: *const u8,
    len: usize,
}

// SAFETY: `ptr` is a borrowed buffer whose borrow outlives the operation (see the module doc:
// the caller blocks until every operation of its request completed), and it does not move
// while the runtime holds the `ReadBuf`, so the pointer is stable; `bytes_init` is the whole
// length because the caller's slice is initialised memory.
unsafe impl IoBuf for ReadBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

// SAFETY: as for `IoBuf` above; the caller handed us a `&mut [u8]`, so nothing else reads or
// writes it while the kernel fills it, and every byte is already initialised (`set_init` has
// nothing to record).
unsafe impl IoBufMut for ReadBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    // SAFETY: the buffer is a caller's initialised `&mut [u8]`: there is no length to record.
    unsafe fn set_init(&mut self, _pos: usize) {}
}

// SAFETY: the pointer comes from a `&[u8]` that the caller keeps borrowed until every
// operation of its request completed, and it does not move while the runtime holds it.
unsafe impl IoBuf for WriteBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

enum Op {
    Read { buf: ReadBuf, offset: u64 },
    Write { buf: WriteBuf, offset: u64 },
}

struct Request {
    /// A duplicate of the caller's descriptor (same open file, so O_DIRECT holds); the ring
    /// thread closes it when the request is done.
    file: File,
    ops: Vec<Op>,
    reply: mpsc::SyncSender<io::Result<()>>,
}

// SAFETY: the raw pointers in `ops` are only handed to the kernel by the ring thread, while the
// thread that owns the buffers is blocked waiting for the answer; no Rust code dereferences
// them on either side during that time.
unsafe impl Send for Request {}

/// Pack I/O through io_uring on a dedicated thread. Use where a benchmark shows it faster than
/// [`PreadIo`](super::PreadIo) (see BENCHMARKS.md); `new` fails where io_uring is not
/// available, so callers can fall back.
pub struct UringIo {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    /// Held by the ring thread: dead once the thread has finished (tests check drop stops it).
    #[cfg(test)]
    alive: std::sync::Weak<()>,
}

impl UringIo {
    /// Starts the ring thread; an error (io_uring disabled or unsupported, no memory for the
    /// ring) means: use `PreadIo`.
    pub fn new() -> io::Result<Self> {
        Self::with_entries(DEFAULT_ENTRIES)
    }

    /// As `new`, with `entries` submission queue entries (a power of two, 1 to 32768).
    pub fn with_entries(entries: u32) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<io::Result<()>>(1);
        #[cfg(test)]
        let token = std::sync::Arc::new(());
        #[cfg(test)]
        let alive = std::sync::Arc::downgrade(&token);
        let thread = crate::threads::spawn("tenantfs-uring", move || {
            #[cfg(test)]
            let _token = token;
            let rt = match tokio_uring::Runtime::new(tokio_uring::builder().entries(entries)) {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            rt.block_on(serve(rx));
        })?;
        let started = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the io_uring thread ended while starting")));
        if let Err(e) = started {
            let _ = thread.join();
            return Err(e);
        }
        tracing::debug!(entries, "io_uring pack I/O thread started");
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            #[cfg(test)]
            alive,
        })
    }

    /// Runs `ops` on the ring thread and waits until all of them have completed.
    ///
    /// # Safety
    ///
    /// Every pointer in `ops` must be valid for its operation (writable for reads, readable for
    /// writes, `len` bytes) and not accessed by anything else until this returns. This call
    /// returns only once the kernel is done with all of them (see the module doc), so borrows
    /// held across the call satisfy this.
    // SAFETY: (contract of callers) see `# Safety` above; the three callers below each state
    // why their borrows meet it.
    unsafe fn run(&self, file: &File, ops: Vec<Op>) -> io::Result<()> {
        let gone = || io::Error::other("the io_uring thread has stopped");
        let file = file.try_clone()?;
        let (reply, answer) = mpsc::sync_channel(1);
        self.tx
            .as_ref()
            .ok_or_else(gone)?
            .send(Request { file, ops, reply })
            .map_err(|_| gone())?;
        // A closed channel without an answer means the request was dropped unstarted: the
        // ring thread aborts the process rather than drop one with operations in flight.
        answer.recv().map_err(|_| gone())?
    }

    #[cfg(test)]
    fn thread_alive(&self) -> std::sync::Weak<()> {
        self.alive.clone()
    }
}

impl Drop for UringIo {
    fn drop(&mut self) {
        // Closing the channel ends the ring thread's loop once queued requests are done.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the io_uring pack I/O thread panicked");
            }
        }
    }
}

fn check_len(len: usize) -> io::Result<()> {
    // One io_uring read or write moves at most u32::MAX bytes (Linux: less than 2 GiB).
    if len > i32::MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "pack I/O buffer larger than 2 GiB",
        ));
    }
    Ok(())
}

impl PackIo for UringIo {
    fn read_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_many(file, &mut [(offset, buf)])
    }

    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        check_len(buf.len())?;
        let op = Op::Write {
            buf: WriteBuf {
                ptr: buf.as_ptr(),
                len: buf.len(),
            },
            offset,
        };
        // SAFETY: `buf` is borrowed for this whole call and `run` returns only after the write
        // completed, so the kernel reads it only while it is alive and unchanged.
        unsafe { self.run(file, vec![op]) }
    }

    /// All reads in flight at once; returns when every one has completed. On error (the first
    /// failing read's), the buffers of the reads that succeeded hold their data.
    fn read_many(&self, file: &File, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let mut ops = Vec::with_capacity(reads.len());
        for (offset, buf) in reads.iter_mut() {
            check_len(buf.len())?;
            ops.push(Op::Read {
                buf: ReadBuf {
                    ptr: buf.as_mut_ptr(),
                    len: buf.len(),
                },
                offset: *offset,
            });
        }
        // SAFETY: every buffer is reached through `reads`, exclusively borrowed for this whole
        // call (distinct `&mut` slices, so no two reads share memory), and `run` returns only
        // after all of the reads completed.
        unsafe { self.run(file, ops) }
    }
}

/// Aborts the process if dropped while unwinding: a panic on the ring thread with operations
/// in flight must not let their callers return and reuse buffers the kernel still writes.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("io_uring pack I/O thread panicked with operations in flight");
            std::process::abort();
        }
    }
}

/// The ring thread: takes every queued request, runs all their operations at once, answers
/// each when its operations are done; ends when the channel closes.
async fn serve(rx: mpsc::Receiver<Request>) {
    // Blocking here is fine: with nothing in flight the runtime has nothing else to do.
    while let Ok(first) = rx.recv() {
        let _guard = AbortOnUnwind;
        let mut requests = vec![first];
        while let Ok(r) = rx.try_recv() {
            requests.push(r);
        }
        if requests.len() == 1 {
            // The common case: no task to spawn (a panic here unwinds through the guard).
            if let Some(r) = requests.pop() {
                run_request(r).await;
            }
            continue;
        }
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|r| tokio_uring::spawn(run_request(r)))
            .collect();
        for t in tasks {
            if t.await.is_err() {
                // A task that panicked may have dropped operations still in flight, and its
                // caller gets no answer: the only safe way out.
                tracing::error!("io_uring pack I/O task panicked");
                std::process::abort();
            }
        }
    }
}

async fn run_request(req: Request) {
    let _guard = AbortOnUnwind;
    let file = Rc::new(tokio_uring::fs::File::from_std(req.file));
    let mut ops = req.ops;
    if ops.len() == 1 {
        if let Some(op) = ops.pop() {
            let _ = req.reply.send(run_op(file, op).await);
        }
        return;
    }
    let tasks: Vec<_> = ops
        .into_iter()
        .map(|op| tokio_uring::spawn(run_op(file.clone(), op)))
        .collect();
    let mut result = Ok(());
    for t in tasks {
        match t.await {
            Ok(r) => {
                if result.is_ok() {
                    result = r;
                }
            }
            Err(_) => {
                tracing::error!("io_uring pack I/O operation panicked");
                std::process::abort();
            }
        }
    }
    let _ = req.reply.send(result);
}

async fn run_op(file: Rc<tokio_uring::fs::File>, op: Op) -> io::Result<()> {
    match op {
        Op::Read { buf, offset } => {
            let len = buf.len;
            let (res, _) = file.read_at(buf, offset).await;
            let n = res?;
            // A slot is always fully present: a short read is damage or a bad offset.
            if n != len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read at offset {offset}: {n} of {len} bytes"),
                ));
            }
            Ok(())
        }
        Op::Write { buf, offset } => file.write_all_at(buf, offset).await.0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::pack::{aligned, PreadIo};
    use super::*;
    use crate::cache::SlabAllocator;
    use std::os::unix::fs::OpenOptionsExt;

    const BS: usize = 4096;

    fn direct_file(dir: &std::path::Path, slots: usize) -> File {
        let path = dir.join("p");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .expect("O_DIRECT under /var/tmp");
        let slabs = SlabAllocator::new();
        let mut data = aligned(&slabs, slots * BS).unwrap();
        for (i, b) in data.chunks_mut(BS).enumerate() {
            b.fill(i as u8 ^ 0x5a);
            b[..8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        PreadIo.write_at(&f, &data[..slots * BS], 0).unwrap();
        f
    }

    fn check_slot(buf: &[u8], i: usize) {
        assert_eq!(&buf[..8], &(i as u64).to_le_bytes(), "slot {i}");
        assert!(buf[8..BS].iter().all(|&b| b == i as u8 ^ 0x5a), "slot {i}");
    }

    #[test]
    fn writes_and_reads_round_trip_with_o_direct() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = direct_file(dir.path(), 4);
        let io = UringIo::new().unwrap();
        let slabs = SlabAllocator::new();
        let mut w = aligned(&slabs, 2 * BS).unwrap();
        w.fill(0xc3);
        io.write_at(&f, &w[..2 * BS], 4 * BS as u64).unwrap();
        let mut r = aligned(&slabs, 2 * BS).unwrap();
        io.read_at(&f, &mut r[..2 * BS], 4 * BS as u64).unwrap();
        assert!(r[..2 * BS].iter().all(|&b| b == 0xc3));
        io.read_at(&f, &mut r[..BS], 2 * BS as u64).unwrap();
        check_slot(&r[..BS], 2);
        // What uring wrote, pread reads.
        let mut p = aligned(&slabs, BS).unwrap();
        PreadIo.read_at(&f, &mut p[..BS], 5 * BS as u64).unwrap();
        assert!(p[..BS].iter().all(|&b| b == 0xc3));
    }

    /// Buffers are filled when `read_many` returns, and the kernel never touches them after:
    /// overwriting them right away and looking again later finds only what we wrote.
    #[test]
    fn batched_reads_complete_before_return_and_buffers_are_not_touched_after() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let slots = 64;
        let f = direct_file(dir.path(), slots);
        let io = UringIo::new().unwrap();
        let slabs = SlabAllocator::new();
        let mut bufs: Vec<_> = (0..32).map(|_| aligned(&slabs, BS).unwrap()).collect();
        for round in 0..20 {
            let first = round % (slots - 32);
            let mut reads: Vec<(u64, &mut [u8])> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| (((first + i) * BS) as u64, &mut b[..BS]))
                .collect();
            io.read_many(&f, &mut reads).unwrap();
            drop(reads);
            for (i, b) in bufs.iter_mut().enumerate() {
                check_slot(&b[..BS], first + i);
                b.fill(0xee);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(bufs.iter().all(|b| b[..BS].iter().all(|&x| x == 0xee)));
        // Buffers freed right after a call can be reused at once (the slab hands them out
        // again): nothing lands in them later.
        for _ in 0..20 {
            let mut b = aligned(&slabs, BS).unwrap();
            io.read_at(&f, &mut b[..BS], 7 * BS as u64).unwrap();
            check_slot(&b[..BS], 7);
        }
    }

    /// One bad read in a batch (past the end: short; misaligned for O_DIRECT: EINVAL) fails
    /// the call, after every read finished; the good ones hold their slots.
    #[test]
    fn a_failing_read_in_a_batch_is_an_error_and_the_others_are_correct() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = direct_file(dir.path(), 8);
        let io = UringIo::new().unwrap();
        let slabs = SlabAllocator::new();
        for bad_offset in [(20 * BS) as u64, 100] {
            let mut bufs: Vec<_> = (0..8).map(|_| aligned(&slabs, BS).unwrap()).collect();
            let mut reads: Vec<(u64, &mut [u8])> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    let off = if i == 3 { bad_offset } else { (i * BS) as u64 };
                    (off, &mut b[..BS])
                })
                .collect();
            let e = io.read_many(&f, &mut reads).unwrap_err();
            if bad_offset == 100 {
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
            } else {
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
            }
            for (i, b) in bufs.iter().enumerate() {
                if i != 3 {
                    check_slot(&b[..BS], i);
                }
            }
        }
        // A short single read (the slot straddles the end) is an error too, not a partial fill.
        let mut b = aligned(&slabs, 2 * BS).unwrap();
        let e = io.read_at(&f, &mut b[..2 * BS], 7 * BS as u64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        // And the engine still works after errors.
        io.read_at(&f, &mut b[..BS], 0).unwrap();
        check_slot(&b[..BS], 0);
    }

    /// Several threads at once each get their own slots (requests batched on one ring).
    #[test]
    fn concurrent_callers_get_their_own_data() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let slots = 64;
        let f = direct_file(dir.path(), slots);
        let io = UringIo::new().unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let (io, f) = (&io, &f);
                s.spawn(move || {
                    let slabs = SlabAllocator::new();
                    let mut bufs: Vec<_> = (0..8).map(|_| aligned(&slabs, BS).unwrap()).collect();
                    for round in 0..50 {
                        let first = (t * 13 + round * 7) % (slots - 8);
                        let mut reads: Vec<(u64, &mut [u8])> = bufs
                            .iter_mut()
                            .enumerate()
                            .map(|(i, b)| (((first + i) * BS) as u64, &mut b[..BS]))
                            .collect();
                        io.read_many(f, &mut reads).unwrap();
                        for (i, b) in bufs.iter().enumerate() {
                            check_slot(&b[..BS], first + i);
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn drop_stops_the_ring_thread() {
        let io = UringIo::new().unwrap();
        let alive = io.thread_alive();
        assert!(alive.upgrade().is_some());
        drop(io);
        assert!(alive.upgrade().is_none(), "ring thread still running");
    }

    #[test]
    fn setup_failure_is_an_error_not_a_panic() {
        // Zero entries is refused by io_uring_setup (EINVAL), as a disabled io_uring would be.
        let e = UringIo::with_entries(0).err().expect("setup must fail");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    }

    #[test]
    fn default_read_many_matches() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = direct_file(dir.path(), 8);
        let slabs = SlabAllocator::new();
        let mut bufs: Vec<_> = (0..8).map(|_| aligned(&slabs, BS).unwrap()).collect();
        let mut reads: Vec<(u64, &mut [u8])> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| (((7 - i) * BS) as u64, &mut b[..BS]))
            .collect();
        PreadIo.read_many(&f, &mut reads).unwrap();
        for (i, b) in bufs.iter().enumerate() {
            check_slot(&b[..BS], 7 - i);
        }
    }
}
