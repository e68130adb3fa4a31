//! The pressure readers against this machine's live files (cgroup v1 here; v2 is covered by
//! fixtures in src/pressure/signals.rs).

use crate::common::cgroup;

use std::path::Path;

use cgroup::Cgroup;
use tenantfs::pressure::signals::{read_host_psi, read_mem_available, CgroupMemory};

#[test]
fn live_signals_read() {
    let psi = read_host_psi().expect("PSI is enabled on this kernel");
    assert!(psi.some.avg10 >= 0.0 && psi.some.avg10 <= 100.0);
    let avail = read_mem_available().unwrap();
    assert!(avail > 0);
    let cg = CgroupMemory::of_self().unwrap().expect("a memory cgroup");
    let state = cg.state().unwrap();
    assert!(state.current > 0, "{cg:?}: {state:?}");
    if let Some(max) = state.max {
        assert!(max >= state.current / 2, "{state:?}");
    }
}

#[test]
fn v1_cgroup_limit_is_seen() {
    // A real memory-capped v1 cgroup: its files report the limit we set.
    let Some(cg) = Cgroup::new("limit", 256 << 20) else {
        return;
    };
    let state = CgroupMemory::V1(cg.0.clone()).state().unwrap();
    assert_eq!(state.max, Some(256 << 20));
    assert_eq!(state.current, 0, "no task in the new cgroup");
}

/// Random 4k reads over `file` from 4 jobs for `secs` inside `cg`, whose limit is far below
/// the file: the reads keep refaulting evicted pages, which the kernel counts as memory stall
/// (about 150 ms of host `some` stall in 3 s here).
fn thrash(cg: &Cgroup, file: &Path, secs: u32) {
    let st = cg
        .command("fio")
        .args([
            "--name=thrash",
            "--rw=randread",
            "--bs=4k",
            "--invalidate=0",
            "--numjobs=4",
        ])
        .args(["--time_based", "--output=/dev/null"])
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--runtime={secs}"))
        .status()
        .unwrap();
    assert!(st.success(), "fio in the thrashing cgroup: {st}");
}

/// A governor started after a burst of memory stall does not shrink the cache for it: a new
/// PSI trigger can fire in its first window for stall from before it existed (the kernel
/// starts the window from a total it updates only while triggers exist), and the watcher
/// checks that the stall really grew since registration.
#[test]
fn a_new_governor_ignores_stall_from_before_it_started() {
    use std::os::fd::AsFd;
    use std::time::Duration;
    use tenantfs::pressure::{Governor, GovernorConfig};
    let (Some(small), Some(empty)) = (
        Cgroup::new("thrash", 64 << 20),
        Cgroup::new("governed", 1 << 30),
    ) else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let file = dir.path().join("ws");
    let mut data = vec![0u8; 1 << 20];
    let mut f = std::fs::File::create(&file).unwrap();
    for i in 0..512usize {
        data.iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i ^ j) as u8 | 1);
        std::io::Write::write_all(&mut f, &data).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let (stall, window) = (Duration::from_millis(100), Duration::from_secs(2));

    // Whether this kernel has the quirk: a bare trigger registered after a burst.
    thrash(&small, &file, 3);
    let mut t = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/pressure/memory")
        .unwrap();
    let line = format!("some {} {}\0", stall.as_micros(), window.as_micros());
    std::io::Write::write_all(&mut t, line.as_bytes()).unwrap();
    let mut fds = [nix::poll::PollFd::new(
        t.as_fd(),
        nix::poll::PollFlags::POLLPRI,
    )];
    let bare_fired = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1500u16)).unwrap() > 0;
    drop(t);
    eprintln!("a bare PSI trigger after the burst fired at once: {bare_fired}");

    // The governor's watcher, after the same burst.
    thrash(&small, &file, 3);
    let budget = 256 << 20;
    let cache = std::sync::Arc::new(tenantfs::cache::HostCache::new(budget));
    let g = Governor::start(
        cache.clone(),
        budget,
        GovernorConfig {
            cgroup: Some(CgroupMemory::V1(empty.0.clone())),
            v1_pressure_level: false,
            psi_stall: stall,
            psi_window: window,
            // The burst is recent, so PSI averages are high: leave them out, this is about
            // the trigger.
            policy: tenantfs::pressure::PolicyConfig {
                psi_some_avg10: 100.0,
                ..Default::default()
            },
            ..GovernorConfig::default()
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let stats = g.stats();
    drop(g);
    assert_eq!(
        stats.shrinks, 0,
        "bare trigger fired: {bare_fired}; {stats:?}"
    );
    assert_eq!(cache.budget(), budget);
}
