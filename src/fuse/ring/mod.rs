//! FUSE over io_uring: the kernel queues each request on the queue of the CPU its caller runs
//! on, and a thread on that CPU answers it there.
//!
//! Why: over /dev/fuse a request wakes whichever worker thread sleeps in `read`, usually on
//! the other CPU, and that cross-CPU wake-up is most of a request's cost on this kind of host
//! (BENCHMARKS.md, "What a FUSE request costs": a statfs takes 13-16 us, 46-63 us with the
//! two sides pinned to different CPUs, and 10-11 us over the ring).
//!
//! How (Linux >= 6.14, `enable_uring` on): at INIT a mount's [`Ring`] makes its entries (a
//! 288-byte header and a payload buffer as large as the biggest request, for each of the
//! kernel's queues), and once mounted registers them (`FUSE_IO_URING_CMD_REGISTER`) on the
//! host's rings ([`reactor`]): one io_uring per CPU the daemon may run on, shared by every
//! mount, so the daemon's threads do not grow with its mounts. A queue of a CPU the daemon
//! may not run on (taskset, `CPUAffinity=`, a cpuset) is served by the nearest CPU it may. A
//! completion means a request is in an entry; a thread answers it through
//! [`crate::fuse::ops::Operations`] and hands the entry back with the reply
//! (`COMMIT_AND_FETCH`), submitted as SCHED_IDLE while its callers are being moved off their
//! CPU by the wake-ups ([`handoff`]). The mount's /dev/fuse device still carries FORGET and
//! INTERRUPT, which never go over the ring: the same rings poll it ([`connection`]), and
//! its end (ENODEV at unmount) ends the session.

mod abi;
mod connection;
mod handoff;
mod reactor;

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::fuse::ops::{Operations, MAX_WRITE};
use connection::Entry;
pub use handoff::COOLDOWN as HANDOFF_COOLDOWN;

/// The module parameter root sets to let mounts use FUSE over io_uring.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";
/// Ring entries per queue: one being answered, one the kernel can fill meanwhile.
const ENTRIES_PER_QUEUE: usize = 2;
/// The payload buffer: the largest request or reply (max_write; the kernel sizes reads the
/// same through max_pages).
const PAYLOAD_SIZE: usize = MAX_WRITE as usize;

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
    state: Mutex<RingState>,
}

enum RingState {
    /// Not offered to the kernel (yet).
    Off,
    /// Negotiated at INIT: the entries wait for the mounted device.
    Started {
        reactors: &'static reactor::Reactors,
        ops: Arc<Operations>,
        entries: Vec<Entry>,
    },
    /// On the host's rings.
    Attached(Arc<connection::Connection>),
    Stopped,
}

impl Ring {
    pub fn new(transport: Transport) -> Self {
        Self {
            transport,
            state: Mutex::new(RingState::Off),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether to offer io_uring at INIT.
    pub fn wanted(&self) -> bool {
        self.transport != Transport::Device && kernel_enabled()
    }

    /// Makes the mount's entries, one set per kernel queue, and starts the host's rings if
    /// they are not yet; returns the number of queues. The entries register once the mount
    /// hands over its device ([`Ring::attach`]).
    pub fn start(&self, ops: Arc<Operations>) -> io::Result<usize> {
        let reactors = reactor::host(connection::handle)?;
        let queues = reactors.for_queue.len();
        let entries = (0..queues * ENTRIES_PER_QUEUE)
            .map(|_| Entry::new())
            .collect::<io::Result<Vec<_>>>()?;
        *self.state() = RingState::Started {
            reactors,
            ops,
            entries,
        };
        Ok(queues)
    }

    /// Whether the kernel took the ring at INIT: the mount is then served by [`Ring::attach`].
    pub fn is_started(&self) -> bool {
        matches!(*self.state(), RingState::Started { .. })
    }

    /// Serves the mounted session's `device` on the host's rings: registers the entries and
    /// polls the device; `on_end` runs on a thread of its own once the mount is gone.
    pub fn attach(&self, device: Arc<OwnedFd>, on_end: Box<dyn FnOnce() + Send>) {
        let mut state = self.state();
        let RingState::Started {
            reactors,
            ops,
            entries,
        } = std::mem::replace(&mut *state, RingState::Stopped)
        else {
            tracing::error!("a FUSE ring attached without being started");
            return;
        };
        let conn = connection::attach(reactors, ops, entries, device, on_end, failpoint_submit());
        *state = RingState::Attached(conn);
    }

    /// Waits until the kernel is done with the mount's entries (it ends them when the mount
    /// is gone), so that nothing of the mount outlives its session.
    pub fn stop(&self) {
        let conn = match std::mem::replace(&mut *self.state(), RingState::Stopped) {
            RingState::Attached(c) => c,
            _ => return,
        };
        if !conn.wait_gone(Duration::from_secs(10)) {
            tracing::error!("FUSE ring entries still registered 10 s after the mount ended");
            return;
        }
        // The thread that answered the last completion may still hold the connection a
        // moment: the volume goes with its last reference, and is to be closed on return.
        let start = Instant::now();
        let mut conn = conn;
        loop {
            match Arc::try_unwrap(conn) {
                Ok(c) => {
                    drop(c);
                    return;
                }
                Err(c) if start.elapsed() < Duration::from_secs(1) => {
                    conn = c;
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(_) => {
                    tracing::warn!("a FUSE ring thread still holds an ended mount");
                    return;
                }
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Failpoint `fuse-ring-submit` (tests: `FAILPOINTS=fuse-ring-submit=return`): a mount's
/// entries cannot be registered, to show that the mount then falls back to /dev/fuse.
fn failpoint_submit() -> bool {
    fail::fail_point!("fuse-ring-submit", |_| true);
    false
}

/// Makes the kernel serve the mount of `device` over /dev/fuse: a REGISTER it refuses (no
/// buffers) turns FUSE over io_uring off for the connection (`fc->io_uring = 0`), and the
/// requests waiting for the ring go to /dev/fuse. For a mount whose entries cannot be
/// registered, since the kernel holds every request until they are.
fn fall_back(device: RawFd) {
    let refused = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(1)
        .and_then(|mut uring| {
            let sqe = opcode::UringCmd80::new(types::Fd(device), abi::CMD_REGISTER)
                .cmd([0u8; 80])
                .build();
            let sqe = with_address(sqe, 0, 0);
            // SAFETY: the command names no buffer (address 0, no iovecs).
            unsafe { uring.submission().push(&sqe) }.map_err(io::Error::other)?;
            uring.submit_and_wait(1)?;
            let result = uring.completion().next().map_or(0, |c| c.result());
            Ok(result)
        });
    match refused {
        Ok(r) if r < 0 => {
            tracing::warn!("FUSE over io_uring turned off for this mount: serving over /dev/fuse")
        }
        other => tracing::error!(
            ?other,
            "could not turn FUSE over io_uring off; requests may wait for the ring"
        ),
    }
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
        let e = Entry::new().unwrap();
        let (iov, header) = e.iovec_and_header();
        assert_eq!(iov[0], header);
        assert_eq!(iov[1], abi::HEADER_SIZE);
        assert_eq!(iov[3], PAYLOAD_SIZE);
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
    fn a_ring_started_before_the_device_comes_stops_at_once() {
        let (_tmp, ops) = crate::fuse::ops::test_operations();
        let ring = Ring::new(Transport::Uring);
        let n = ring.start(ops).unwrap();
        assert_eq!(n, possible_cpus().unwrap().len());
        assert!(ring.is_started());
        let t = Instant::now();
        ring.stop();
        assert!(!ring.is_started());
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "stop waited {:?} for entries that were never registered",
            t.elapsed()
        );
    }
}
