//! Cold 4 KiB random reads of a tenant whose data is 4x the cache budget, against host ext4
//! with O_DIRECT on the same disk, in turn in one run: fio QD1, psync, O_DIRECT, a 1 GiB
//! file, a 256 MiB cache budget; before each side the page cache is dropped and the daemon's
//! cache released. Per side: IOPS, p50, p99, and what the disk read per fio read (reads and
//! KiB, from /proc/diskstats). Target: tenantfs >= 0.8x ext4's IOPS.
//!
//! usage: make build && cargo run --release --example bench_cold_reads [-- SECONDS REPS]
//! Needs root, /dev/fuse and fio.

mod common;

use std::path::Path;
use std::process::Command;

use common::daemon::{lay_out, run, SideBySide};
use common::{fio_side, median};

/// Read I/Os completed and sectors read by the disk under /var/tmp, from /proc/diskstats.
fn disk_reads() -> (u64, u64) {
    let dev = std::fs::metadata("/var/tmp").map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.dev()
    });
    let (major, minor) = match dev {
        Ok(d) => (libc::major(d), libc::minor(d)),
        Err(e) => panic!("/var/tmp: {e}"),
    };
    let stats = std::fs::read_to_string("/proc/diskstats").expect("/proc/diskstats");
    for line in stats.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 6 && f[0] == major.to_string() && f[1] == minor.to_string() {
            return (f[3].parse().unwrap(), f[5].parse().unwrap());
        }
    }
    panic!("no /proc/diskstats line for {major}:{minor}");
}

struct Side {
    iops: f64,
    p50: f64,
    p99: f64,
    reads_per_op: f64,
    kib_per_op: f64,
}

/// fio's cold QD1 random reads of `file` for `secs`.
fn cold_reads(file: &Path, secs: u32, release: impl Fn()) -> Side {
    run(Command::new("sync").arg("-f").arg(file));
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");
    release();
    let (r0, s0) = disk_reads();
    let v = fio_side(
        Command::new("fio").args([
            "--name=cold",
            &format!("--filename={}", file.display()),
            "--size=1G",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=psync",
            "--time_based",
            &format!("--runtime={secs}"),
            "--output-format=json",
        ]),
        "cold reads",
    );
    let (r1, s1) = disk_reads();
    let ops = v["total_ios"].as_f64().unwrap().max(1.0);
    let pct = |p: &str| v["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    Side {
        iops: v["iops"].as_f64().unwrap(),
        p50: pct("50.000000"),
        p99: pct("99.000000"),
        reads_per_op: (r1 - r0) as f64 / ops,
        kib_per_op: ((s1 - s0) * 512) as f64 / 1024.0 / ops,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let reps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let s = SideBySide::new_with("cold-reads", "a", "[cache]\nbudget = \"256M\"\n");
    s.daemon.mount_with("a", &s.mnt, "");
    let (host, tenant) = (s.host.join("f"), s.mnt.join("f"));
    lay_out(&host, 1024);
    lay_out(&tenant, 1024);
    let release = || run(&mut s.daemon.cli(&["cache", "release", "64G"]));
    println!("Cold 4 KiB random reads, QD1, O_DIRECT, 1 GiB file, 256 MiB cache, {secs} s each:");
    println!();
    println!(
        "| rep | ext4 IOPS | p50 us | p99 us | disk KiB/read | tenantfs IOPS | p50 us | p99 us \
         | disk reads/read | disk KiB/read | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for rep in 1..=reps {
        let h = cold_reads(&host, secs, || {});
        let t = cold_reads(&tenant, secs, release);
        let ratio = t.iops / h.iops;
        ratios.push(ratio);
        println!(
            "| {rep} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | \
             {ratio:.2}x |",
            h.iops, h.p50, h.p99, h.kib_per_op, t.iops, t.p50, t.p99, t.reads_per_op, t.kib_per_op
        );
    }
    println!();
    println!("median ratio {:.2}x (target >= 0.8x)", median(ratios));
    s.daemon.umount(&s.mnt);
}
