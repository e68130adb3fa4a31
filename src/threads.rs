//! Threads the daemon starts for its tenants' work behind their requests (read-ahead, folds,
//! collections, the closes of extent files, a base's io_uring thread, a mount's end), on
//! every CPU the daemon was given.
//!
//! Why: a new thread inherits the CPU affinity of the thread that starts it, and much of this
//! work is started while a FUSE ring's crew thread answers a request, pinned to its CPU
//! (`fuse::ring`). The read-ahead pool, started on its first job, stayed on that one CPU for
//! the daemon's life: a stream's read-ahead then shared it with the ring that answers that
//! CPU's callers while the other CPU idled, and a quiet tenant's cached reads there fell to
//! a few percent of their rate (BENCHMARKS.md, "A stream beside a cached set").
//!
//! How: [`spawn`] gives the new thread the main thread's affinity before it runs anything:
//! what the daemon was started with (taskset, systemd's `CPUAffinity=`), within its cpuset.
//!
//! Work that no request waits on yet (read-ahead) runs below the threads that answer
//! requests ([`spawn_below_requests`]: [`BELOW_REQUESTS_NICE`] nicer): a tenant's stream on one
//! CPU then takes the other only where that one's requests leave it idle. Measured on 2 vCPUs
//! (`bench_scan`): a quiet tenant's cached reads beside a stream on the other CPU, 0.37x of
//! alone at the same nice, 0.84x below; the stream alone 1,709 MiB/s and 1,699.

use std::io;
use std::thread::JoinHandle;

use nix::sched::{sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// Starts `f` on a thread named `name` that may run on every CPU the main thread may.
pub fn spawn<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            on_main_threads_cpus();
            f()
        })
}

/// How far above the daemon's nice value [`spawn_below_requests`] puts a thread (requests are
/// answered at the daemon's own). A thread 10 above has about a tenth of the CPU beside a busy
/// one at the daemon's.
pub const BELOW_REQUESTS_NICE: i32 = 10;

/// [`spawn`], the thread [`BELOW_REQUESTS_NICE`] above the daemon's nice value: for work that
/// no request waits on (one that did would wait behind every request of the CPU).
pub fn spawn_below_requests<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn(name, move || {
        // SAFETY: nice takes no pointer and touches no memory of ours; on Linux it changes
        // the calling thread's nice value only (test:
        // `below_requests_is_niced_and_others_are_not`). Raising it needs no privilege. (-1
        // is also a nice value; a daemon started at -11 logs this needlessly.)
        if unsafe { libc::nice(BELOW_REQUESTS_NICE) } == -1 {
            let e = io::Error::last_os_error();
            tracing::debug!(error = %e, "background thread left at the daemon's nice value");
        }
        f()
    })
}

/// Gives the calling thread the main thread's CPU affinity (the main thread's id is the
/// process's). Left as it is if either cannot be read or set.
fn on_main_threads_cpus() {
    let main = Pid::from_raw(std::process::id() as i32);
    let set = sched_getaffinity(main).and_then(|cpus| sched_setaffinity(Pid::from_raw(0), &cpus));
    if let Err(e) = set {
        tracing::debug!(error = %e, "thread left on the CPUs of the thread that started it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus_of_this_thread() -> Vec<usize> {
        let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
        (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    }

    /// The nice value of the calling thread (field 19 of its stat).
    fn nice_of_this_thread() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn below_requests_is_niced_and_others_are_not() {
        let here = nice_of_this_thread();
        let below = spawn_below_requests("b", nice_of_this_thread).unwrap();
        let plain = spawn("p", nice_of_this_thread).unwrap();
        assert_eq!(below.join().unwrap(), (here + BELOW_REQUESTS_NICE).min(19));
        assert_eq!(
            plain.join().unwrap(),
            here,
            "spawn leaves the nice value alone"
        );
        assert_eq!(nice_of_this_thread(), here, "only the new thread was niced");
    }

    #[test]
    fn a_thread_started_by_a_pinned_thread_gets_the_main_threads_cpus() {
        let main = sched_getaffinity(Pid::from_raw(std::process::id() as i32)).unwrap();
        let main: Vec<usize> = (0..nix::sched::CpuSet::count())
            .filter(|&c| main.is_set(c).unwrap_or(false))
            .collect();
        let pinned_to = main[0];
        let (pinned, started) = std::thread::spawn(move || {
            let mut one = nix::sched::CpuSet::new();
            one.set(pinned_to).unwrap();
            sched_setaffinity(Pid::from_raw(0), &one).unwrap();
            let pinned = cpus_of_this_thread();
            let plain = std::thread::spawn(cpus_of_this_thread).join().unwrap();
            assert_eq!(
                plain, pinned,
                "a plain thread inherits its starter's affinity"
            );
            let started = spawn("t", cpus_of_this_thread).unwrap().join().unwrap();
            (pinned, started)
        })
        .join()
        .unwrap();
        assert_eq!(pinned, vec![pinned_to]);
        assert_eq!(started, main, "the thread took the main thread's CPUs");
    }
}
