//! What one FUSE request costs through the daemon, and how much of it is the wake-up of a
//! thread on another CPU: the question that decided the FUSE-over-io_uring transport (are
//! queues per CPU worth building?).
//!
//! Three request kinds the daemon answers without touching the disk, each timed as a loop of
//! 20,000 calls on host ext4 and on a tenant mount: statfs (STATFS: the volume does nothing),
//! chmod (SETATTR: one RocksDB write) and a 4 KiB pread of a cached block (READ). The tenant
//! loops run over /dev/fuse three ways (unpinned, the caller and every daemon thread pinned to
//! one CPU, the two pinned to different CPUs), then over FUSE's io_uring (`transport=uring`,
//! enabled first if the kernel has it off), whose per-CPU queues should give the one-CPU
//! cost without pinning anything.
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example
//! bench_fuse_request [-- CALLS]. Needs root, /dev/fuse and at least 2 CPUs.

mod common;
use common::daemon::{enable_fuse_uring, run, SideBySide};

use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Pins every thread of `pid` (None: this process's main thread, which runs the loops) to
/// `cpus` with taskset(1).
fn pin(pid: Option<u32>, cpus: &str) {
    let mut c = Command::new("taskset");
    match pid {
        Some(pid) => c.args(["-a", "-p", "-c", cpus, &pid.to_string()]),
        None => c.args(["-p", "-c", cpus, &std::process::id().to_string()]),
    };
    run(c.stdout(Stdio::null()));
}

/// Microseconds per call of each request kind on `dir`.
fn costs(dir: &Path, calls: u32) -> [f64; 3] {
    let path = dir.join("rt.dat");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    file.write_all_at(&vec![7u8; 1 << 20], 0).unwrap();
    let mut buf = vec![0u8; 4096];
    file.read_exact_at(&mut buf, 0).unwrap();
    let per_call = |f: &mut dyn FnMut(u32)| {
        let t = Instant::now();
        for i in 0..calls {
            f(i);
        }
        t.elapsed().as_secs_f64() * 1e6 / f64::from(calls)
    };
    [
        per_call(&mut |_| {
            nix::sys::statvfs::statvfs(dir).unwrap();
        }),
        per_call(&mut |i| {
            let mode = if i % 2 == 0 { 0o644 } else { 0o600 };
            file.set_permissions(fs::Permissions::from_mode(mode))
                .unwrap();
        }),
        per_call(&mut |i| {
            file.read_exact_at(&mut buf, u64::from(i % 256) * 4096)
                .unwrap();
        }),
    ]
}

fn main() {
    let calls: u32 = std::env::args()
        .nth(1)
        .map_or(20_000, |s| s.parse().expect("CALLS is a number"));
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(cpus >= 2, "needs 2 CPUs to compare same-CPU and cross-CPU");
    enable_fuse_uring();
    let SideBySide {
        daemon,
        host,
        mnt,
        tmp: _tmp,
    } = SideBySide::new("request", "rt");
    let all = format!("0-{}", cpus - 1);

    let ext4 = costs(&host, calls);
    // /dev/fuse: unpinned, then the caller and every daemon thread on one CPU, then the two
    // on different CPUs.
    daemon.mount("rt", &mnt, "dev");
    let free = costs(&mnt, calls);
    pin(Some(daemon.pid()), "0");
    pin(None, "0");
    let same = costs(&mnt, calls);
    pin(None, "1");
    let cross = costs(&mnt, calls);
    pin(None, &all);
    pin(Some(daemon.pid()), &all);
    daemon.umount(&mnt);
    // io_uring: each CPU's queue thread is pinned to it by the daemon; nothing else pinned.
    daemon.mount("rt", &mnt, "uring");
    let ring = costs(&mnt, calls);
    daemon.umount(&mnt);

    println!("FUSE request cost: {calls} calls each, microseconds per call");
    println!(
        "| request | host ext4 | /dev/fuse | /dev/fuse, caller and daemon on one CPU | \
         /dev/fuse, on different CPUs | io_uring | io_uring / /dev/fuse |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, name) in [
        "statfs (STATFS, nothing to do)",
        "chmod (SETATTR: one store write)",
        "4 KiB pread, cached (READ)",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            ext4[i],
            free[i],
            same[i],
            cross[i],
            ring[i],
            ring[i] / free[i]
        );
    }
}
