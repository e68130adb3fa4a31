//! The data-path fio suite in one run: the same jobs on host ext4 and on a tenant
//! mount of one daemon (`[cache] budget = "2G"`), served once over FUSE's io_uring and once
//! over /dev/fuse; ratios to ext4.
//!
//! The jobs are those of `../shared/tools/fio-suite.sh` (a 1 GiB file laid out with 1 MiB
//! writes, one job, QD1 psync, SECONDS each; "cold" = page cache dropped and, on tenant
//! mounts, the daemon's caches emptied with `tenantfs cache release`), plus the acceptance's
//! "4k randread direct with the file in the host cache" (the file read once, no drop):
//!   randread 4k direct cold | randread 4k direct, file cached | randwrite 4k direct |
//!   randread 4k buffered, file read once | 1M seq read cold | 1M seq write + fsync
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example
//! bench_fio_suite [-- SECONDS]. Needs root, fio, /dev/fuse; turns FUSE over io_uring on.

mod common;
use common::daemon::{enable_fuse_uring, run, SideBySide};

use std::fs;
use std::path::Path;
use std::process::Command;

/// One fio result: IOPS, MiB/s, p50 and p99 completion latency in microseconds.
#[derive(Clone, Copy, Default)]
struct Result {
    iops: f64,
    mibs: f64,
    p50: f64,
    p99: f64,
}

const JOBS: [&str; 6] = [
    "4k randread direct, cold",
    "4k randread direct, file in the host cache",
    "4k randwrite direct",
    "4k randread buffered, file read once",
    "1M seq read, cold",
    "1M seq write + fsync",
];

fn fio(file: &Path, name: &str, args: &[&str], seconds: u32) -> Result {
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--name={name}"))
        .arg(format!("--filename={}", file.display()))
        .args([
            "--size=1G",
            "--numjobs=1",
            "--iodepth=1",
            "--ioengine=psync",
            "--output-format=json",
        ])
        .args(if seconds > 0 {
            vec![format!("--runtime={seconds}"), "--time_based".into()]
        } else {
            vec![]
        })
        .args(args);
    let side = common::fio_side(&mut cmd, name);
    let pct = |p: &str| side["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    Result {
        iops: side["iops"].as_f64().unwrap(),
        mibs: side["bw_bytes"].as_f64().unwrap() / f64::from(1 << 20),
        p50: pct("50.000000"),
        p99: pct("99.000000"),
    }
}

/// Runs the suite in `dir`; `cold` empties every cache a cold job must not find warm.
fn suite(dir: &Path, seconds: u32, cold: &dyn Fn()) -> [Result; 6] {
    let f = dir.join("fio.1g");
    let job = |name: &str, args: &[&str]| fio(&f, name, args, seconds);
    let warm = || fio(&f, "warm", &["--rw=read", "--bs=1M", "--direct=0"], 0);
    let direct_4k_reads = ["--rw=randread", "--bs=4k", "--direct=1"];
    fio(&f, "layout", &["--rw=write", "--bs=1M", "--end_fsync=1"], 0);
    let mut r = [Result::default(); 6];
    cold();
    r[0] = job("randread-4k-direct", &direct_4k_reads);
    warm();
    r[1] = job("randread-4k-direct-cached", &direct_4k_reads);
    cold();
    r[2] = job(
        "randwrite-4k-direct",
        &["--rw=randwrite", "--bs=4k", "--direct=1"],
    );
    cold();
    warm();
    r[3] = job(
        "randread-4k-buffered",
        &["--rw=randread", "--bs=4k", "--direct=0", "--invalidate=0"],
    );
    cold();
    r[4] = job("read-1m-seq", &["--rw=read", "--bs=1M", "--direct=0"]);
    cold();
    r[5] = job(
        "write-1m-seq-fsync",
        &["--rw=write", "--bs=1M", "--direct=0", "--end_fsync=1"],
    );
    fs::remove_file(&f).unwrap();
    r
}

fn drop_page_cache() {
    nix::unistd::sync();
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

fn main() {
    let seconds: u32 = std::env::args()
        .nth(1)
        .map_or(20, |s| s.parse().expect("SECONDS is a number"));
    enable_fuse_uring();
    let SideBySide {
        daemon,
        host: ext4,
        mnt,
        tmp: _tmp,
    } = SideBySide::new("fio", "fio");

    let host = suite(&ext4, seconds, &drop_page_cache);
    let mut tenant = Vec::new();
    for transport in ["uring", "dev"] {
        daemon.mount("fio", &mnt, transport);
        let cold = || {
            drop_page_cache();
            run(&mut daemon.cli(&["cache", "release", "4G"]));
        };
        tenant.push(suite(&mnt, seconds, &cold));
        daemon.umount(&mnt);
    }

    println!(
        "fio suite: 1 GiB file, QD1 psync, {seconds} s per job; ratio = IOPS / host ext4 IOPS"
    );
    println!(
        "| job | host ext4 | tenantfs io_uring | ratio | tenantfs /dev/fuse | ratio | io_uring / /dev/fuse |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let cell = |r: &Result| {
        format!(
            "{:.1}k IOPS, {:.0} MiB/s, p50 {:.1} us, p99 {:.0} us",
            r.iops / 1e3,
            r.mibs,
            r.p50,
            r.p99
        )
    };
    for (i, job) in JOBS.iter().enumerate() {
        let (e, u, d) = (&host[i], &tenant[0][i], &tenant[1][i]);
        println!(
            "| {job} | {} | {} | {:.3} | {} | {:.3} | {:.2} |",
            cell(e),
            cell(u),
            u.iops / e.iops,
            cell(d),
            d.iops / e.iops,
            u.iops / d.iops
        );
    }
}
