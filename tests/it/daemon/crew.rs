//! The host's ring threads, shared by every mount: a request that waits (on its tenant's
//! limit, announced; or in a stall nobody announced, caught by the watch) holds no other
//! tenant's requests on the same CPU, and the threads do not grow with the mounts.

use super::transports::threads_named;
use super::*;
use std::os::unix::fs::FileExt;

/// Runs `f` on a thread confined to CPU 0, whose requests the kernel puts on CPU 0's queue.
fn on_cpu0<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        let mut one = nix::sched::CpuSet::new();
        one.set(0).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).unwrap();
        f()
    })
}

/// Small files written, read back and listed in `dir`: how long 100 rounds took.
fn busy_rounds(dir: std::path::PathBuf) -> Duration {
    let start = Instant::now();
    for i in 0..100 {
        let p = dir.join(format!("f{}", i % 10));
        std::fs::write(&p, [i as u8; 100]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), [i as u8; 100]);
        assert!(std::fs::metadata(&p).is_ok());
    }
    start.elapsed()
}

/// Tenant `a` and `b` mounted over the ring through a daemon started with `env`.
fn two_ring_mounts(
    name: &str,
    env: &[(&str, &str)],
    a_options: &str,
) -> (
    Host,
    common::guards::Daemon,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    enable_fuse_uring();
    let h = Host::new(name);
    h.create_tenant("a");
    h.create_tenant("b");
    let (d, _n) = start_daemon_env(&h, &h.root().join("notify"), env);
    let (ma, mb) = (h.dir("a"), h.dir("b"));
    h.ok(&["mount", "-o", a_options, "a", ma.to_str().unwrap()]);
    h.ok(&["mount", "-o", "transport=uring", "b", mb.to_str().unwrap()]);
    (h, d, ma, mb)
}

/// A request stalled in the daemon for 3 s without saying it waits (a failpoint in MKNOD):
/// the watch gives its thread's lead to another, so another tenant's requests from the same
/// CPU are answered meanwhile, in well under the stall.
#[test]
fn a_stalled_request_holds_no_other_tenants_requests() {
    let (h, mut d, ma, mb) = two_ring_mounts(
        "crewstall",
        &[("FAILPOINTS", "fuse-request-stall=sleep(3000)")],
        "transport=uring",
    );
    let pid = d.0.id();
    let fifo = ma.join("fifo");
    let stalled = on_cpu0(move || {
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        Instant::now()
    });
    std::thread::sleep(Duration::from_millis(300));
    let took = on_cpu0(move || busy_rounds(mb)).join().unwrap();
    let done = Instant::now();
    let stall_ended = stalled.join().unwrap();
    assert!(
        done < stall_ended,
        "the other tenant's 100 rounds ({took:?}) ended only after the stall"
    );
    assert!(
        took < Duration::from_millis(2000),
        "100 rounds took {took:?}"
    );
    assert!(
        threads_named(pid, "fuse-ring-0") >= 2,
        "the stalled thread gave its lead to another"
    );
    assert!(std::fs::symlink_metadata(ma.join("fifo")).is_ok());
    d.terminate_cleanly(&[&ma, &h.dir("b")]);
}

/// A tenant limited to 2 requests a second reads from 4 threads on CPU 0, so its requests
/// wait on their limit (which they announce): another tenant's requests from CPU 0 are
/// answered meanwhile at full speed.
#[test]
fn a_request_waiting_on_its_limit_holds_no_other_tenants_requests() {
    let (h, mut d, ma, mb) = two_ring_mounts("crewlimit", &[], "transport=uring,iops=2");
    std::fs::write(ma.join("f"), vec![1u8; 1 << 20]).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (f, stop) = (ma.join("f"), stop.clone());
            on_cpu0(move || {
                let file = std::fs::File::open(f).unwrap();
                let mut buf = [0u8; 4096];
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    file.read_exact_at(&mut buf, 4096 * u64::from(n % 200))
                        .unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let took = on_cpu0(move || busy_rounds(mb)).join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u32 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(
        took < Duration::from_millis(2000),
        "100 rounds took {took:?}"
    );
    assert!(
        reads <= 20,
        "the limited tenant did {reads} reads at 2 a second"
    );
    d.terminate_cleanly(&[&ma, &h.dir("b")]);
}

/// Twenty idle mounts over the ring cost no thread of their own.
#[test]
fn ring_threads_do_not_grow_with_the_mounts() {
    enable_fuse_uring();
    let h = Host::new("crewflat");
    let names: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    for n in &names {
        h.create_tenant(n);
    }
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let threads = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    let mounts: Vec<_> = names.iter().map(|n| h.dir(n)).collect();
    h.ok(&[
        "mount",
        "-o",
        "transport=uring",
        "t0",
        mounts[0].to_str().unwrap(),
    ]);
    std::fs::write(mounts[0].join("x"), b"x").unwrap();
    let one = threads();
    for (n, m) in names.iter().zip(&mounts).skip(1) {
        h.ok(&["mount", "-o", "transport=uring", n, m.to_str().unwrap()]);
        std::fs::write(m.join("x"), b"x").unwrap();
    }
    let twenty = threads();
    assert!(
        twenty <= one + 2,
        "threads with one mount {one}, with twenty {twenty}"
    );
    let refs: Vec<&std::path::Path> = mounts.iter().map(|m| m.as_path()).collect();
    d.terminate_cleanly(&refs);
}
