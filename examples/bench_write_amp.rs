//! Bytes written to the disk per byte of a 1 GiB sequential file write (the target: at most
//! 3, measured from the daemon's /proc/PID/io write_bytes after compaction settles).
//!
//! A tenant mounted through one daemon (`[cache] budget = "2G"`, other settings default)
//! takes three passes over one file, each `fio --rw=write --bs=1M --end_fsync=1` of 1 GiB:
//! a fresh file, an overwrite of it whole, and an overwrite in 4 KiB random writes (1 GiB of
//! them, fsync at the end: the WAL path and the folds it leaves). After each pass the
//! program waits until the daemon's `write_bytes` has not moved for SETTLE seconds (flushes,
//! folds, extent file and blob collection done), then divides what it grew by the bytes the
//! pass wrote. The same is read from the disk's own counter (sectors written, all
//! processes) for the tenant and for the same passes on host ext4 (after `sync`), as a
//! cross-check and a reference.
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example
//! bench_write_amp [-- SETTLE] (default 5 s). Needs root, fio, /dev/fuse.

mod common;
use common::daemon::SideBySide;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
/// Longest wait for the daemon's writes to settle after a pass.
const SETTLE_LIMIT: Duration = Duration::from_secs(300);

const PASSES: [(&str, &[&str]); 3] = [
    ("fresh 1 GiB, 1M writes + fsync", &["--rw=write", "--bs=1M"]),
    (
        "overwrite 1 GiB, 1M writes + fsync",
        &["--rw=write", "--bs=1M"],
    ),
    (
        "overwrite 1 GiB in 4k random writes + fsync",
        &["--rw=randwrite", "--bs=4k", "--direct=1"],
    ),
];

/// One pass: bytes the daemon wrote (None for ext4), bytes the disk wrote, seconds to settle.
#[derive(Clone, Copy)]
struct Pass {
    daemon: Option<u64>,
    disk: u64,
    settle: f64,
}

fn fio(file: &Path, args: &[&str]) {
    let out = Command::new("fio")
        .args(["--name=amp", "--size=1G", "--numjobs=1", "--iodepth=1"])
        .args(["--ioengine=psync", "--end_fsync=1", "--randrepeat=0"])
        .arg(format!("--filename={}", file.display()))
        .args(args)
        .output()
        .expect("fio runs");
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The daemon's `write_bytes` (bytes it caused to be sent to the block layer).
fn write_bytes(pid: u32) -> u64 {
    let io = fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("write_bytes in /proc/PID/io")
}

/// The stat file of the block device (partition) holding `dir`.
fn disk_stat(dir: &Path) -> PathBuf {
    let dev = fs::metadata(dir).unwrap().dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"))
}

/// Bytes the disk has written since boot (field 7 of its stat: sectors of 512 bytes).
fn disk_written(stat: &Path) -> u64 {
    let text = fs::read_to_string(stat).expect("block device stat");
    let sectors: u64 = text.split_whitespace().nth(6).unwrap().parse().unwrap();
    sectors * 512
}

/// Waits until `counter` has not moved for `quiet`; returns the seconds waited.
fn settle(counter: &dyn Fn() -> u64, quiet: Duration) -> f64 {
    let start = Instant::now();
    let (mut last, mut since) = (counter(), Instant::now());
    while since.elapsed() < quiet && start.elapsed() < SETTLE_LIMIT {
        std::thread::sleep(Duration::from_millis(250));
        let now = counter();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    start.elapsed().as_secs_f64()
}

/// The passes on a file in `dir`; `stat` is the disk under it (for a mount: under the
/// daemon's data dir).
fn passes(dir: &Path, stat: &Path, quiet: Duration, daemon: Option<u32>) -> Vec<Pass> {
    let file = dir.join("amp.1g");
    let mut out = Vec::new();
    for (_, args) in PASSES {
        let (d0, s0) = (daemon.map(write_bytes), disk_written(stat));
        fio(&file, args);
        let waited = match daemon {
            Some(pid) => settle(&|| write_bytes(pid), quiet),
            None => {
                nix::unistd::sync();
                settle(&|| disk_written(stat), quiet)
            }
        };
        out.push(Pass {
            daemon: daemon.map(|pid| write_bytes(pid) - d0.unwrap()),
            disk: disk_written(stat) - s0,
            settle: waited,
        });
    }
    fs::remove_file(&file).unwrap();
    out
}

fn main() {
    let quiet = Duration::from_secs(
        std::env::args()
            .nth(1)
            .map_or(5, |s| s.parse().expect("SETTLE is a number of seconds")),
    );
    let SideBySide {
        daemon,
        host: ext4,
        mnt,
        tmp,
    } = SideBySide::new("amp", "amp");
    daemon.mount("amp", &mnt, "auto");
    let stat = disk_stat(tmp.path());
    let tenant = passes(&mnt, &stat, quiet, Some(daemon.pid()));
    daemon.umount(&mnt);
    let host = passes(&ext4, &stat, quiet, None);

    println!("bytes written per byte of file data (1 GiB per pass); settled = no daemon write for {quiet:?}");
    println!("| pass | tenantfs: daemon write_bytes / bytes | disk written / bytes | settled after s | host ext4: disk written / bytes |");
    println!("|---|---:|---:|---:|---:|");
    for (i, (name, _)) in PASSES.iter().enumerate() {
        let (t, e) = (tenant[i], host[i]);
        let per = |b: u64| b as f64 / GIB as f64;
        println!(
            "| {name} | {:.2} | {:.2} | {:.1} | {:.2} |",
            per(t.daemon.unwrap()),
            per(t.disk),
            t.settle,
            per(e.disk)
        );
    }
}
