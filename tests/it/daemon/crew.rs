//! The host's ring threads, shared by every mount: a request that waits (on its tenant's
//! limit, held by the ring without a thread; or in a stall nobody announced, caught by the
//! watch) holds no other tenant's requests on the same CPU, and the threads do not grow with
//! the mounts or with the requests their limits hold.

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

/// Runs `stall` (a request that holds its thread for seconds) on CPU 0 and, 300 ms into it,
/// 100 rounds of small requests on tenant dir `other` from CPU 0; asserts the rounds ended
/// before the stall did. How long the rounds took, and the stall.
fn rounds_during(
    other: std::path::PathBuf,
    stall: impl FnOnce() + Send + 'static,
) -> (Duration, Duration) {
    let start = Instant::now();
    let stalled = on_cpu0(move || {
        stall();
        Instant::now()
    });
    std::thread::sleep(Duration::from_millis(300));
    let took = on_cpu0(move || busy_rounds(other)).join().unwrap();
    let done = Instant::now();
    let stall_ended = stalled.join().unwrap();
    assert!(
        done < stall_ended,
        "the other tenant's 100 rounds ({took:?}) ended only after the stall"
    );
    (took, stall_ended - start)
}

/// A 1 MiB write to `a_dir`, kept busy 3 s by the `fuse-long-write` failpoint, beside 100
/// rounds on tenant dir `other` (see [`rounds_during`]).
fn long_write_beside_rounds(a_dir: &std::path::Path, other: std::path::PathBuf) {
    let big = a_dir.join("big");
    let (_, write_took) = rounds_during(other, move || {
        std::fs::write(&big, vec![7u8; 1 << 20]).unwrap();
    });
    assert!(
        write_took >= Duration::from_millis(2900),
        "the failpoint did not keep the write busy ({write_took:?})"
    );
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
    let (took, _) = rounds_during(mb, move || {
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    });
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

/// A large write that keeps its thread busy on the CPU for 3 s (a failpoint: encrypting and
/// hashing a MiB takes about a millisecond, the failpoint stretches it) gives up its lead
/// before it starts: another tenant's requests from the same CPU are answered meanwhile,
/// sharing the CPU, not after it. (The watch takes the lead only from a thread asleep.)
#[test]
fn a_long_request_holds_no_other_tenants_requests() {
    let (h, mut d, ma, mb) = two_ring_mounts(
        "crewlong",
        &[("FAILPOINTS", "fuse-long-write=delay(3000)")],
        "transport=uring",
    );
    long_write_beside_rounds(&ma, mb);
    assert_eq!(std::fs::read(ma.join("big")).unwrap(), vec![7u8; 1 << 20]);
    d.terminate_cleanly(&[&ma, &h.dir("b")]);
}

/// The same over mounts fallen back to /dev/fuse (the ring could not register: a failpoint),
/// whose requests the host's ring threads read from the device: the large write still gives
/// up its thread's lead. The daemon is kept to CPU 0, so both devices are read on its ring.
#[test]
fn a_long_request_over_the_dev_fuse_fallback_holds_no_other_tenants_requests() {
    let (h, mut d, ma, mb) = on_cpu0(|| {
        two_ring_mounts(
            "crewfallback",
            &[(
                "FAILPOINTS",
                "fuse-ring-submit=return;fuse-long-write=delay(3000)",
            )],
            "transport=uring",
        )
    })
    .join()
    .unwrap();
    long_write_beside_rounds(&ma, mb);
    for t in ["a", "b"] {
        assert_eq!(
            mount_stats(&h, t)["ring_requests"].as_u64(),
            Some(0),
            "{t} was not served over /dev/fuse"
        );
    }
    assert_eq!(std::fs::read(ma.join("big")).unwrap(), vec![7u8; 1 << 20]);
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

/// Requests their tenants' limits hold wait on the ring, not on threads: six tenants limited
/// to 2 requests a second, each with 4 readers (24 requests held at once), add no crew
/// threads (before, each held request held one), keep to their limits, and an unlimited
/// tenant beside them is answered at once.
#[test]
fn requests_held_by_their_limits_hold_no_threads() {
    enable_fuse_uring();
    let h = Host::new("crewheld");
    let names: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    for n in names.iter().map(String::as_str).chain(["free"]) {
        h.create_tenant(n);
    }
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let free = h.dir("free");
    h.ok(&[
        "mount",
        "-o",
        "transport=uring",
        "free",
        free.to_str().unwrap(),
    ]);
    let mounts: Vec<_> = names.iter().map(|n| h.dir(n)).collect();
    for (n, m) in names.iter().zip(&mounts) {
        h.ok(&[
            "mount",
            "-o",
            "transport=uring,iops=2",
            n,
            m.to_str().unwrap(),
        ]);
        std::fs::write(m.join("f"), vec![1u8; 64 << 10]).unwrap();
    }
    // The writes' own waits are over (threads a crew started stay: what counts is growth).
    std::thread::sleep(Duration::from_millis(500));
    let crew_before = threads_named(pid, "fuse-ring");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Instant::now();
    let readers: Vec<_> = mounts
        .iter()
        .flat_map(|m| (0..4).map(move |_| m.join("f")))
        .map(|f| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let file = std::fs::File::open(f).unwrap();
                let mut buf = [0u8; 4096];
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    file.read_exact_at(&mut buf, 4096 * (n % 16)).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let crew_held = threads_named(pid, "fuse-ring");
    let took = busy_rounds(free.clone());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "crew {crew_before} -> {crew_held} threads with 24 requests held; {reads} reads in {secs:.1} s; 100 free rounds in {took:?}"
    );
    assert!(
        crew_held <= crew_before + 2,
        "held requests hold threads: {crew_before} crew threads before, {crew_held} with 24 requests held"
    );
    // 6 tenants at 2 a second, each with a burst of 1 and the first request free.
    let most = (6.0 * (2.0 * secs + 2.0)) as u64;
    assert!(
        reads <= most,
        "{reads} reads in {secs:.1} s: more than {most}"
    );
    assert!(
        took < Duration::from_secs(2),
        "100 free rounds took {took:?}"
    );
    let refs: Vec<&std::path::Path> = mounts
        .iter()
        .map(|m| m.as_path())
        .chain([free.as_path()])
        .collect();
    d.terminate_cleanly(&refs);
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

/// Requests held for their turn among busy tenants (weights 1 and 3, readers of both kept
/// busy) wait on the ring, as requests held by their limits do: no crew thread sleeps for a
/// turn (a thread that held one slept 50 us at a time, in nanosleep).
#[test]
fn requests_held_for_their_turn_hold_no_threads() {
    enable_fuse_uring();
    let h = Host::new("crewturn");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let mounts: Vec<_> = [("light", 100), ("heavy", 300)]
        .iter()
        .map(|&(n, w)| {
            h.create_tenant(n);
            let m = h.dir(n);
            let opts = format!("transport=uring,weight={w}");
            h.ok(&["mount", "-o", &opts, n, m.to_str().unwrap()]);
            std::fs::write(m.join("f"), vec![3u8; 256 << 10]).unwrap();
            (n, m)
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = mounts
        .iter()
        .flat_map(|(_, m)| (0..4).map(move |_| m.join("f")))
        .map(|f| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let file = std::fs::File::open(f).unwrap();
                let mut buf = vec![0u8; 64 << 10];
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    file.read_exact_at(&mut buf, (64 << 10) * (n % 4)).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    // What each crew thread's system call is, sampled: nanosleep (35) or clock_nanosleep (230)
    // is a thread sleeping for a turn.
    let (mut samples, mut sleeping) = (0, 0);
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        for t in super::transports::thread_dirs(pid, "fuse-ring") {
            let Ok(call) = std::fs::read_to_string(t.join("syscall")) else {
                continue;
            };
            samples += 1;
            if matches!(call.split_whitespace().next(), Some("35" | "230")) {
                sleeping += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let held_us: Vec<u64> = mounts
        .iter()
        .map(|(n, _)| mount_stats(&h, n)["throttled_us"].as_u64().unwrap())
        .collect();
    eprintln!(
        "{sleeping} of {samples} crew thread samples asleep in nanosleep; reads {reads:?}; \
         held us (light, heavy) {held_us:?}"
    );
    assert!(
        held_us.iter().any(|&us| us > 0),
        "no request was held for its turn: the test shows nothing"
    );
    assert_eq!(
        sleeping, 0,
        "crew threads slept for turns in {sleeping} of {samples} samples"
    );
    let paths: Vec<&std::path::Path> = mounts.iter().map(|(_, m)| m.as_path()).collect();
    d.terminate_cleanly(&paths);
}
