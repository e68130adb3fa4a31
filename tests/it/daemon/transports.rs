//! FUSE over io_uring and /dev/fuse side by side, the fall-back from a ring queue that
//! cannot submit, and what Python's file I/O sees on a mount.

use super::*;

/// Python's open() asks isatty() (an ioctl) of every file; select.poll and copy_file_range
/// reach the filesystem too. None of them leaves a warning in the daemon's log (fuser's
/// defaults logged "[Not Implemented]" for each), and the mount table shows the filesystem as
/// `fuse.tenantfs`.
#[test]
fn python_file_io_leaves_no_warnings_and_the_mount_type_is_fuse_tenantfs() {
    let h = Host::new("pyio");
    let mp = h.dir("m");
    h.create_tenant("t");
    let (d, _notify) = start_daemon_env(&h, &h.root().join("notify"), &[("TENANTFS_LOG", "info")]);
    h.ok(&["mount", "t", mp.to_str().unwrap()]);
    let _g = h.guard("t", &mp, d.0.id());
    let listed = check(&mut cmd(
        "findmnt",
        &[
            "-n",
            "-r",
            "-t",
            "fuse.tenantfs",
            "-o",
            "FSTYPE,SOURCE,VFS-OPTIONS,FS-OPTIONS",
            "--mountpoint",
            mp.to_str().unwrap(),
        ],
    ));
    // tenantfs mounts by mount(2) itself with the options fuser's mount gave: devices and
    // setuid bits honoured, permissions checked by the kernel for every user.
    assert_eq!(
        listed.trim(),
        "fuse.tenantfs tenantfs:t rw,relatime \
         rw,user_id=0,group_id=0,default_permissions,allow_other",
        "findmnt -t fuse.tenantfs"
    );
    let script = format!(
        "import os, select\n\
         d = {dir:?}\n\
         for i in range(20):\n\
         \x20   with open(f'{{d}}/f{{i}}', 'w') as f: f.write('x' * i)\n\
         \x20   with open(f'{{d}}/f{{i}}') as f: assert f.read() == 'x' * i\n\
         fd = os.open(f'{{d}}/f19', os.O_RDONLY)\n\
         assert not os.isatty(fd)\n\
         p = select.poll(); p.register(fd, select.POLLIN); assert p.poll(1000)\n\
         out = os.open(f'{{d}}/copy', os.O_WRONLY | os.O_CREAT, 0o644)\n\
         n = 0\n\
         while n < 19: n += os.copy_file_range(fd, out, 19 - n)\n\
         os.close(out); os.close(fd)\n\
         assert open(f'{{d}}/copy').read() == 'x' * 19\n",
        dir = mp.to_str().unwrap()
    );
    check(&mut cmd("python3", &["-c", &script]));
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(
        log.contains("mounted"),
        "the log is not at info level: {log}"
    );
    assert!(!log.contains("Not Implemented"), "{log}");
}

/// The /proc directories of `pid`'s threads whose name starts with `prefix`.
pub(super) fn thread_dirs(pid: u32, prefix: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| t.path())
        .filter(|t| std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .collect()
}

/// Threads of `pid` whose name starts with `prefix`.
pub(super) fn threads_named(pid: u32, prefix: &str) -> usize {
    thread_dirs(pid, prefix).len()
}

/// A daemon confined to CPU 0 (taskset here; systemd's `CPUAffinity=` and a cpuset confine it
/// the same way) keeps every thread there, the ring threads that serve the other CPU's queue
/// included, and still answers a caller that runs on the other CPU (whose requests the
/// kernel puts on that CPU's queue).
#[test]
fn a_daemon_confined_to_one_cpu_keeps_its_ring_queues_there() {
    enable_fuse_uring();
    let ring_cpus = possible_cpus();
    assert!(
        ring_cpus >= 2,
        "needs two CPUs: one for the daemon, one for its caller"
    );
    let h = Host::new("affinity");
    h.create_tenant("t");
    let mp = h.dir("m");
    let d = start_daemon_under(&h, &h.root().join("notify"), &["taskset", "-c", "0"]);
    let pid = d.0.id();
    h.ok(&["mount", "-o", "transport=uring", "t", mp.to_str().unwrap()]);
    let _g = h.guard("t", &mp, pid);
    // A new thread names itself once it runs, which may be just after the mount returns.
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads_named(pid, "fuse-ring-0") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (on0, on1) = (
        threads_named(pid, "fuse-ring-0"),
        threads_named(pid, "fuse-ring-1"),
    );
    assert!(
        on0 >= 1 && on1 == 0,
        "ring threads for the one CPU the daemon may use: {on0} for CPU 0, {on1} for CPU 1"
    );
    // Requests from CPU 1 go to queue 1, which a thread on CPU 0 answers.
    let f = mp.join("from-cpu-1");
    let script = format!(
        "import os\n\
         p = {f:?}\n\
         for i in range(200):\n\
         \x20   with open(p, 'wb') as w: w.write(bytes([i % 251]) * 10000)\n\
         \x20   with open(p, 'rb') as r: assert r.read() == bytes([i % 251]) * 10000\n\
         print(os.sched_getaffinity(0))\n",
        f = f.to_str().unwrap()
    );
    let out = check(&mut cmd("taskset", &["-c", "1", "python3", "-c", &script]));
    assert_eq!(out.trim(), "{1}", "the caller ran on CPU 1");
    let st = mount_stats(&h, "t");
    assert!(
        st["ring_requests"].as_u64().unwrap() >= 400,
        "the caller's requests did not come over the ring: {st}"
    );
    let outside: Vec<String> = thread_dirs(pid, "")
        .iter()
        .filter_map(|t| {
            let cpus = cpus_allowed(t)?;
            let name = std::fs::read_to_string(t.join("comm")).ok()?;
            (cpus != "0").then(|| format!("{} on {cpus}", name.trim()))
        })
        .collect();
    assert!(
        outside.is_empty(),
        "daemon threads outside CPU 0: {outside:?}"
    );
}

/// The CPUs a thread may run on (`/proc/PID/task/TID`'s `Cpus_allowed_list`).
fn cpus_allowed(task: &std::path::Path) -> Option<String> {
    let status = std::fs::read_to_string(task.join("status")).ok()?;
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    Some(cpus.trim().to_owned())
}

/// A thread's nice value (field 19 of its stat).
fn nice(task: &std::path::Path) -> i32 {
    let stat = std::fs::read_to_string(task.join("stat")).unwrap();
    let fields = &stat[stat.rfind(')').unwrap() + 2..];
    fields.split(' ').nth(16).unwrap().parse().unwrap()
}

/// Threads the daemon starts while a ring thread (pinned to its CPU) answers a request run
/// on all the daemon's CPUs, not that one: the read-ahead pool, which a stream's first
/// read-ahead starts, kept the one CPU of the ring that started it for the daemon's life.
/// The pool runs 10 nicer than the threads that answer requests.
#[test]
fn threads_started_by_a_ring_thread_run_on_all_the_daemons_cpus() {
    enable_fuse_uring();
    assert!(
        possible_cpus() >= 2,
        "needs two CPUs: a thread pinned to one of them differs from the daemon"
    );
    let h = Host::new("spread");
    h.create_tenant("t");
    let mp = h.dir("m");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    h.ok(&["mount", "-o", "transport=uring", "t", mp.to_str().unwrap()]);
    let f = mp.join("stream");
    std::fs::write(&f, vec![7u8; 8 << 20]).unwrap();
    h.ok(&["cache", "release", "4G"]);
    let mut file = std::fs::File::open(&f).unwrap();
    let mut buf = vec![0u8; 128 << 10];
    while std::io::Read::read(&mut file, &mut buf).unwrap() > 0 {}
    drop(file);
    assert!(
        mount_stats(&h, "t")["ring_requests"].as_u64().unwrap() > 64,
        "the reads did not come over the ring"
    );
    let main = std::path::PathBuf::from(format!("/proc/{pid}/task/{pid}"));
    let daemons = cpus_allowed(&main).unwrap();
    let below = (nice(&main) + 10).min(19);
    // A new thread has its name before it sets its CPUs and nice value: looked at again
    // until both are set, or 5 s.
    let elsewhere = || -> Vec<String> {
        thread_dirs(pid, "")
            .iter()
            .filter_map(|t| {
                let name = std::fs::read_to_string(t.join("comm")).ok()?;
                let (cpus, nice) = (cpus_allowed(t)?, nice(t));
                let ring = name.starts_with("fuse-ring");
                let pool = name.starts_with("tenantfs-readah");
                let wrong = (!ring && cpus != daemons) || (pool && nice != below);
                wrong.then(|| format!("{} on {cpus} at nice {nice}", name.trim()))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while (threads_named(pid, "tenantfs-readah") == 0 || !elsewhere().is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        threads_named(pid, "tenantfs-readah") > 0,
        "no read-ahead thread started"
    );
    let wrong = elsewhere();
    assert!(
        wrong.is_empty(),
        "threads not on the daemon's CPUs ({daemons}), or read-ahead not at nice {below}: \
         {wrong:?}"
    );
    d.terminate_cleanly(&[&mp]);
}

/// The CPUs the kernel makes ring queues for.
fn possible_cpus() -> usize {
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    cpus.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum::<usize>()
}

/// FUSE over io_uring through the daemon: a mount with transport=uring answers its requests
/// on the host's ring threads (`stats` counts them), one with transport=dev only over
/// /dev/fuse; the ring threads are per CPU, not per mount: a second ring mount adds none, and
/// they stay when mounts go; a transport the kernel lacks or a misspelt one is a clear error.
#[test]
fn io_uring_and_dev_fuse_transports_serve_side_by_side() {
    enable_fuse_uring();
    let h = Host::new("transport");
    let (mr, md, mr2) = (h.dir("ring"), h.dir("dev"), h.dir("ring2"));
    h.create_tenant("r");
    h.create_tenant("d");
    h.create_tenant("r2");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    h.ok(&["mount", "-o", "transport=uring", "r", mr.to_str().unwrap()]);
    h.ok(&["mount", "-o", "transport=dev", "d", md.to_str().unwrap()]);
    let ring_threads = threads_named(pid, "fuse-ring-");
    assert!(
        (1..=2 * possible_cpus()).contains(&ring_threads),
        "a crew per CPU: {ring_threads} ring threads"
    );
    h.ok(&[
        "mount",
        "-o",
        "transport=uring",
        "r2",
        mr2.to_str().unwrap(),
    ]);
    std::fs::write(mr2.join("x"), b"second ring mount").unwrap();
    assert_eq!(std::fs::read(mr2.join("x")).unwrap(), b"second ring mount");
    assert!(
        threads_named(pid, "fuse-ring-") <= ring_threads.max(2 * possible_cpus()),
        "a second ring mount starts no threads of its own"
    );
    assert_eq!(threads_named(pid, "tenantfs-r"), 0, "no session thread");
    h.ok(&["umount", mr2.to_str().unwrap()]);
    for m in [&mr, &md] {
        std::fs::create_dir(m.join("dir")).unwrap();
        std::fs::write(m.join("dir/f"), vec![5u8; 300_000]).unwrap();
        std::fs::rename(m.join("dir/f"), m.join("g")).unwrap();
        assert_eq!(std::fs::read(m.join("g")).unwrap(), vec![5u8; 300_000]);
        set_xattr(&m.join("g"), "user.k", b"v");
        assert_eq!(
            xattrs(&m.join("g")).get(&b"user.k"[..]).map(|v| &v[..]),
            Some(&b"v"[..])
        );
        std::os::unix::fs::symlink("g", m.join("s")).unwrap();
        assert_eq!(std::fs::read_link(m.join("s")).unwrap().to_str(), Some("g"));
        let names: Vec<_> = std::fs::read_dir(m)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        std::fs::remove_file(m.join("s")).unwrap();
        std::fs::remove_dir(m.join("dir")).unwrap();
    }
    // A 1 MiB write from a buffer 16 bytes into a page (where malloc puts large buffers)
    // spans 257 pages: one request on either transport (max_write 2 MiB asks for 512 pages;
    // the kernel allows what fs.fuse.max_pages_limit does, which `make test` raises), not
    // 1 MiB - 16 bytes and then 16 bytes.
    let limit: u32 = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(256);
    assert!(
        limit >= 257,
        "fs.fuse.max_pages_limit is {limit}: run `make test`, or as root \
         `echo 512 > /proc/sys/fs/fuse/max_pages_limit`"
    );
    let mut buf = vec![0u8; (1 << 20) + 8192];
    let skip = 4096 - buf.as_ptr() as usize % 4096 + 16;
    buf[skip..skip + (1 << 20)].fill(9);
    for (m, t) in [(&mr, "r"), (&md, "d")] {
        let calls = || {
            mount_stats(&h, t)["ops"]["write"]["calls"]
                .as_u64()
                .unwrap()
        };
        let before = calls();
        std::fs::write(m.join("big"), &buf[skip..skip + (1 << 20)]).unwrap();
        assert_eq!(calls(), before + 1, "{t}: a 1 MiB write came in pieces");
        assert_eq!(std::fs::read(m.join("big")).unwrap(), vec![9u8; 1 << 20]);
        std::fs::remove_file(m.join("big")).unwrap();
    }
    let (r, dv) = (mount_stats(&h, "r"), mount_stats(&h, "d"));
    assert!(r["ring_requests"].as_u64().unwrap() >= 15, "{r}");
    assert_eq!(dv["ring_requests"].as_u64(), Some(0), "{dv}");
    // Every request counts, over either transport, with the time spent answering it.
    for m in [&r, &dv] {
        let n = m["requests"].as_u64().unwrap();
        assert!(n >= 15 && n >= m["ring_requests"].as_u64().unwrap(), "{m}");
        assert!(m["busy_us"].as_u64().unwrap() > 0, "{m}");
    }
    assert!(r["ops"]["write"]["calls"].as_u64().unwrap() >= 1, "{r}");
    h.ok(&["umount", mr.to_str().unwrap()]);
    assert!(
        threads_named(pid, "fuse-ring-") >= 1,
        "the host's ring threads stay for the next mount"
    );
    // The data written over the ring is there after a remount over /dev/fuse.
    h.ok(&["mount", "-o", "transport=dev", "r", mr.to_str().unwrap()]);
    assert_eq!(std::fs::read(mr.join("g")).unwrap(), vec![5u8; 300_000]);
    let err = h.fails(&[
        "mount",
        "-o",
        "transport=carrier-pigeon",
        "r",
        h.dir("x").to_str().unwrap(),
    ]);
    assert!(err.contains("transport=uring"), "{err}");
    d.terminate_cleanly(&[&mr, &md]);
}

/// A ring queue that cannot submit (failpoint: its io_uring refuses the queue thread, EEXIST)
/// after FUSE over io_uring was negotiated: the kernel would hold every request until all
/// queues register, so the queue turns the ring off for that mount and it serves over
/// /dev/fuse; nothing hangs, nothing is lost.
#[test]
fn a_ring_queue_that_cannot_submit_falls_back_to_dev_fuse() {
    enable_fuse_uring();
    let h = Host::new("ringfail");
    let m = h.dir("m");
    h.create_tenant("f");
    let notify = h.root().join("notify");
    let (mut d, _n) = start_daemon_env(&h, &notify, &[("FAILPOINTS", "fuse-ring-submit=return")]);
    h.ok(&["mount", "-o", "transport=uring", "f", m.to_str().unwrap()]);
    std::fs::write(m.join("a"), b"still served").unwrap();
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"still served");
    assert_eq!(mount_stats(&h, "f")["ring_requests"].as_u64(), Some(0));
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(
        log.contains("FUSE over io_uring turned off for this mount: serving over /dev/fuse"),
        "{log}"
    );
    d.terminate_cleanly(&[&m]);
}

/// The /dev/fuse workers of a mount grow on demand from one and shrink back: an idle mount is
/// one thread (its session's, which reads the device itself); requests while no worker waits
/// start more, never more than four in all; once requests stop, the extra workers end and the
/// mount still serves. A ring mount has no thread of its own (the host's ring threads poll
/// its device).
/// (Counted by `stats`: threads RocksDB starts without a name inherit their creator's.)
#[test]
fn dev_fuse_workers_grow_on_demand_and_an_idle_mount_keeps_one_thread() {
    enable_fuse_uring();
    let h = Host::new("workers");
    let (m, mr) = (h.dir("m"), h.dir("r"));
    h.create_tenant("w");
    h.create_tenant("v");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let workers = |t: &str| {
        let s = mount_stats(&h, t);
        (
            s["fuse_workers"].as_u64().unwrap(),
            s["fuse_workers_peak"].as_u64().unwrap(),
        )
    };
    let settle = |t: &str| {
        let start = Instant::now();
        while workers(t).0 != 1 && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(100));
        }
        workers(t).0
    };
    h.ok(&["mount", "-o", "transport=dev", "w", m.to_str().unwrap()]);
    assert_eq!(settle("w"), 1, "an idle mount: one worker");
    assert_eq!(threads_named(pid, "tenantfs-w"), 1, "one session thread");
    std::fs::write(m.join("f"), vec![3u8; 1 << 20]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let f = std::fs::File::open(m.join("f")).unwrap();
                let mut buf = [0u8; 4096];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    use std::os::unix::fs::FileExt;
                    f.read_exact_at(&mut buf, 8192).unwrap();
                    assert_eq!(buf, [3u8; 4096]);
                }
            });
        }
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let (_, peak) = workers("w");
    assert!(
        (2..=4).contains(&peak),
        "four readers at once: between 2 and 4 workers, saw {peak}"
    );
    assert_eq!(settle("w"), 1, "the extra workers end once idle");
    assert_eq!(std::fs::read(m.join("f")).unwrap(), vec![3u8; 1 << 20]);
    h.ok(&["mount", "-o", "transport=uring", "v", mr.to_str().unwrap()]);
    std::fs::write(mr.join("g"), b"over the ring").unwrap();
    assert_eq!(std::fs::read(mr.join("g")).unwrap(), b"over the ring");
    assert_eq!(workers("v").0, 0, "a ring mount: no /dev/fuse worker");
    assert_eq!(threads_named(pid, "tenantfs-v"), 0);
    d.terminate_cleanly(&[&m, &mr]);
}

/// The scheduling policy of each of `pid`'s threads named `prefix` (field 41 of its stat).
fn policies(pid: u32, prefix: &str) -> Vec<u32> {
    thread_dirs(pid, prefix)
        .into_iter()
        .filter_map(|t| std::fs::read_to_string(t.join("stat")).ok())
        .map(|stat| {
            let after_name = &stat[stat.rfind(')').unwrap() + 2..];
            after_name.split(' ').nth(41 - 3).unwrap().parse().unwrap()
        })
        .collect()
}

/// A caller whose request arrives on another CPU's ring queue than its last one was moved by
/// the scheduler: that queue then hands its replies to the kernel as SCHED_IDLE, so that its
/// callers wake where they slept (`stats` counts each hand-off), and its thread is back at
/// SCHED_OTHER afterwards, never left waiting behind the CPU's other threads.
#[test]
fn a_caller_moved_between_cpus_gets_its_replies_handed_off() {
    use std::os::unix::fs::FileExt;
    enable_fuse_uring();
    let possible = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| possible.is_set(c).unwrap_or(false))
        .collect();
    if cpus.len() < 2 {
        eprintln!("skipped: one CPU, nowhere to move a caller to");
        return;
    }
    let h = Host::new("handoff");
    let m = h.dir("m");
    h.create_tenant("h");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    h.ok(&["mount", "-o", "transport=uring", "h", m.to_str().unwrap()]);
    std::fs::write(m.join("f"), vec![7u8; 8192]).unwrap();
    let handoffs = || mount_stats(&h, "h")["ring_handoffs"].as_u64().unwrap();
    let before = handoffs();
    // At least the reply to each queue's first moved caller. A hand-off that runs behind
    // other work (a busy host) pauses that queue's hand-offs for COOLDOWN submissions: a
    // round that saw too few sends that many requests to each queue, then moves again.
    let rounds = 5;
    let seen = std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(m.join("f")).unwrap();
            let mut buf = [0u8; 4096];
            let mut read_on = |cpu: usize, times: u32| {
                let mut one = nix::sched::CpuSet::new();
                one.set(cpu).unwrap();
                nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).unwrap();
                // Direct I/O: each read is a request, on the queue of the CPU it runs on.
                for _ in 0..times {
                    f.read_exact_at(&mut buf, 4096).unwrap();
                    assert_eq!(buf, [7u8; 4096]);
                }
            };
            for round in 1..=rounds {
                for cpu in [cpus[0], cpus[1], cpus[0], cpus[1]] {
                    read_on(cpu, 3);
                }
                if handoffs() >= before + 2 {
                    return Some(round);
                }
                for &cpu in &cpus[..2] {
                    read_on(cpu, tenantfs::fuse::RING_HANDOFF_COOLDOWN + 1);
                }
            }
            None
        })
        .join()
        .unwrap()
    });
    assert!(
        seen.is_some(),
        "moves to both queues seen in {rounds} rounds: {}",
        mount_stats(&h, "h")
    );
    let start = Instant::now();
    loop {
        let p = policies(pid, "fuse-ring-");
        assert!(!p.is_empty(), "no ring queue threads");
        if p.iter().all(|&x| x == 0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "ring queue threads left at policies {p:?} (0 is SCHED_OTHER)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    d.terminate_cleanly(&[&m]);
}

/// Runs `body(host, tenant, transport, mountpoint)` on a tenant mounted through one daemon
/// over FUSE's io_uring, then on another over /dev/fuse.
fn on_both_transports(name: &str, body: impl Fn(&Host, &str, &str, &std::path::Path)) {
    enable_fuse_uring();
    let h = Host::new(name);
    h.create_tenant("r");
    h.create_tenant("d");
    let d = start_daemon(&h, &h.root().join("notify"));
    for (tenant, transport) in [("r", "uring"), ("d", "dev")] {
        let mp = h.dir(&format!("m-{tenant}"));
        let o = format!("transport={transport}");
        h.ok(&["mount", "-o", &o, tenant, mp.to_str().unwrap()]);
        let _g = h.guard(tenant, &mp, d.0.id());
        body(&h, tenant, transport, &mp);
    }
}

/// A lookup that finds nothing is answered as a negative entry the kernel keeps for the
/// TTL, over both transports: stats of a missing path in a row reach the daemon about once
/// (each one did before: an ENOENT reply is forgotten at once), a file created after them is
/// found, and once removed it is missing again.
#[test]
fn a_missing_name_is_looked_up_once_and_a_file_created_after_it_is_found() {
    on_both_transports("negentry", |h, tenant, transport, mp| {
        // (an op with no calls yet is left out of the stats)
        let lookups = || {
            mount_stats(h, tenant)["ops"]["lookup"]["calls"]
                .as_u64()
                .unwrap_or(0)
        };
        let missing = mp.join("missing");
        let before = lookups();
        for _ in 0..20 {
            assert!(std::fs::symlink_metadata(&missing).is_err());
        }
        let asked = lookups() - before;
        assert!(
            (1..20).contains(&asked),
            "{transport}: 20 stats of a missing name asked the daemon {asked} times"
        );
        std::fs::write(&missing, b"here now").unwrap();
        assert_eq!(std::fs::read(&missing).unwrap(), b"here now", "{transport}");
        std::fs::remove_file(&missing).unwrap();
        assert!(std::fs::symlink_metadata(&missing).is_err(), "{transport}");
    });
}

/// copy_file_range(2) within a mount is served by the daemon, over both transports: the
/// bytes go from file to file inside it (no READ request reaches the daemon during the
/// copies; the kernel's fallback would send READ and WRITE per piece), a copy of 3 MiB that
/// spans several pieces and one between offsets into a hole land byte for byte, and a copy
/// from the end of the source copies nothing.
#[test]
fn copy_file_range_is_served_inside_the_daemon() {
    on_both_transports("copyrange", |h, tenant, transport, mp| {
        let src = crate::common::noise(11, (3 << 20) + 123);
        std::fs::write(mp.join("src"), &src).unwrap();
        let calls = |op: &str| {
            mount_stats(h, tenant)["ops"][op]["calls"]
                .as_u64()
                .unwrap_or(0)
        };
        let reads = calls("read");
        let script = format!(
            "import os\n\
         d = {dir:?}\n\
         s = os.open(f'{{d}}/src', os.O_RDONLY)\n\
         a = os.open(f'{{d}}/whole', os.O_WRONLY | os.O_CREAT, 0o644)\n\
         n = 0\n\
         while True:\n\
         \x20   k = os.copy_file_range(s, a, 1 << 30)\n\
         \x20   if k == 0: break\n\
         \x20   n += k\n\
         assert n == {len}, n\n\
         b = os.open(f'{{d}}/part', os.O_WRONLY | os.O_CREAT, 0o644)\n\
         assert os.copy_file_range(s, b, 10000, 5000, 70000) == 10000\n\
         assert os.copy_file_range(s, b, 10, {len}, 0) == 0\n",
            dir = mp.to_str().unwrap(),
            len = src.len()
        );
        check(&mut cmd("python3", &["-c", &script]));
        assert_eq!(
            calls("read"),
            reads,
            "{transport}: the copies sent READ requests"
        );
        assert!(
            std::fs::read(mp.join("whole")).unwrap() == src,
            "{transport}: whole copy"
        );
        let part = std::fs::read(mp.join("part")).unwrap();
        assert_eq!(part.len(), 80_000, "{transport}");
        assert!(
            part[..70_000].iter().all(|&b| b == 0),
            "{transport}: the hole before"
        );
        assert!(
            part[70_000..] == src[5000..15_000],
            "{transport}: the copied range"
        );
    });
}
