//! A block volume served two ways by one daemon, side by side: over NBD (fio's nbd engine on
//! the daemon's unix socket export) and as FUSE + loop (the volume mounted, its `device` file
//! behind a loop device: the only way before block volumes, two kernel round trips per I/O).
//! The same 1 GiB region of the same volume, the same jobs; ratio = NBD / FUSE+loop.
//!
//! Jobs (SECONDS each, one job, written once with 1 MiB writes first, caches warm in both):
//!   4k randread QD1 | 4k randwrite QD1 | 4k randread QD16 | 1M seq read QD4 | 1M seq write QD4
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example bench_nbd
//! [-- SECONDS]. Needs root, fio (with its nbd engine), losetup, /dev/fuse.

mod common;
use common::daemon::{enable_fuse_uring, run, Daemon};

use std::fs;
use std::process::Command;

#[derive(Clone, Copy, Default)]
struct Result {
    iops: f64,
    mibs: f64,
    p50: f64,
}

const JOBS: [(&str, &[&str]); 5] = [
    (
        "4k randread QD1",
        &["--rw=randread", "--bs=4k", "--iodepth=1"],
    ),
    (
        "4k randwrite QD1",
        &["--rw=randwrite", "--bs=4k", "--iodepth=1"],
    ),
    (
        "4k randread QD16",
        &["--rw=randread", "--bs=4k", "--iodepth=16"],
    ),
    ("1M seq read QD4", &["--rw=read", "--bs=1M", "--iodepth=4"]),
    (
        "1M seq write QD4",
        &["--rw=write", "--bs=1M", "--iodepth=4"],
    ),
];

/// One fio job on `target` (fio arguments naming the engine and the file or URI).
fn fio(target: &[String], name: &str, args: &[&str], seconds: u32) -> Result {
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--name={name}"))
        .args(target)
        .args(["--size=1G", "--numjobs=1", "--output-format=json"])
        .args(if seconds > 0 {
            vec![format!("--runtime={seconds}"), "--time_based".into()]
        } else {
            vec![]
        })
        .args(args);
    let side = common::fio_side(&mut cmd, name);
    Result {
        iops: side["iops"].as_f64().unwrap(),
        mibs: side["bw_bytes"].as_f64().unwrap() / f64::from(1 << 20),
        p50: side["clat_ns"]["percentile"]["50.000000"]
            .as_f64()
            .unwrap_or(0.0)
            / 1e3,
    }
}

fn suite(target: &[String], seconds: u32) -> Vec<Result> {
    fio(
        target,
        "layout",
        &["--rw=write", "--bs=1M", "--iodepth=4"],
        0,
    );
    JOBS.iter()
        .map(|(name, args)| fio(target, name, args, seconds))
        .collect()
}

fn main() {
    let seconds: u32 = std::env::args()
        .nth(1)
        .map_or(15, |s| s.parse().expect("SECONDS is a number"));
    enable_fuse_uring();
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-nbd-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let daemon = Daemon::start(&tmp.path().join("daemon"), "unused");
    run(&mut daemon.cli(&["volume", "create", "vol", "--size", "2G"]));

    // NBD: the daemon's export on a unix socket.
    let sock = tmp.path().join("vol.sock");
    let addr = format!("unix:{}", sock.display());
    run(&mut daemon.cli(&["volume", "attach", "vol", "--nbd", &addr]));
    let nbd_target = vec![
        "--ioengine=nbd".to_owned(),
        format!("--uri=nbd+unix:///?socket={}", sock.display()),
    ];
    let nbd = suite(&nbd_target, seconds);
    run(&mut daemon.cli(&["volume", "detach", "vol"]));

    // FUSE + loop: the same volume mounted, its device file behind a loop device.
    let mnt = tmp.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    daemon.mount("vol", &mnt, "uring");
    let device = mnt.join("device");
    let attach = |dio: &str| {
        Command::new("losetup")
            .args(["--find", "--show", &format!("--direct-io={dio}")])
            .arg(&device)
            .output()
            .unwrap()
    };
    let mut out = attach("on");
    let dio = out.status.success();
    if !dio {
        out = attach("off");
    }
    assert!(
        out.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let loop_target = vec![
        "--ioengine=libaio".to_owned(),
        "--direct=1".to_owned(),
        format!("--filename={loopdev}"),
    ];
    let looped = suite(&loop_target, seconds);
    run(Command::new("losetup").args(["-d", &loopdev]));
    daemon.umount(&mnt);

    println!(
        "block volume, 1 GiB region, {seconds} s per job; NBD: fio nbd engine on the daemon's \
         unix socket; FUSE+loop: libaio O_DIRECT on {loopdev} (loop direct I/O {}) over the \
         volume's FUSE mount (io_uring transport); ratio = NBD IOPS / FUSE+loop IOPS",
        if dio { "on" } else { "off: refused" }
    );
    println!("| job | NBD | FUSE+loop | ratio |");
    println!("|---|---:|---:|---:|");
    let cell = |r: &Result| {
        format!(
            "{:.1}k IOPS, {:.0} MiB/s, p50 {:.0} us",
            r.iops / 1e3,
            r.mibs,
            r.p50
        )
    };
    for (i, (job, _)) in JOBS.iter().enumerate() {
        println!(
            "| {job} | {} | {} | {:.2} |",
            cell(&nbd[i]),
            cell(&looped[i]),
            nbd[i].iops / looped[i].iops
        );
    }
}
