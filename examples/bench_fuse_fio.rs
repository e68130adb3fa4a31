//! fio on tenant mounts vs the same jobs on a host ext4 directory, in one run, plus
//! create/stat/unlink rates. Answers three questions:
//!   1. what FUSE + encrypted RocksDB costs against the host filesystem (ratios per job);
//!   2. which default block size (4 KiB vs 64 KiB) to use (4k random write, 128k sequential read);
//!   3. the page-cache policy trade-off: cache=direct (FOPEN_DIRECT_IO) vs cache=kernel, on
//!      buffered 4k random re-reads: IOPS and how much of the file the page cache then holds.
//!
//! usage: cargo build --release && cargo run --release --example bench_fuse_fio [-- SECONDS SIZE_MIB]
//! Needs root, fio and /dev/fuse.

mod common;
use common::tenantfs_bin;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

struct Target {
    label: String,
    dir: PathBuf,
}

struct Job {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
    iodepth: u32,
    direct: bool,
}

/// Sequential jobs first: they read the file as fio laid it out; the random writes that
/// follow leave the store with many overlapping versions until compaction catches up.
const JOBS: &[Job] = &[
    Job {
        name: "1M seq write",
        rw: "write",
        bs: "1M",
        iodepth: 1,
        direct: true,
    },
    Job {
        name: "1M seq read",
        rw: "read",
        bs: "1M",
        iodepth: 1,
        direct: true,
    },
    Job {
        name: "128k seq read",
        rw: "read",
        bs: "128k",
        iodepth: 1,
        direct: true,
    },
    Job {
        name: "4k randread qd1",
        rw: "randread",
        bs: "4k",
        iodepth: 1,
        direct: true,
    },
    Job {
        name: "4k randread qd16",
        rw: "randread",
        bs: "4k",
        iodepth: 16,
        direct: true,
    },
    Job {
        name: "4k randwrite qd1",
        rw: "randwrite",
        bs: "4k",
        iodepth: 1,
        direct: true,
    },
    Job {
        name: "4k randwrite qd16",
        rw: "randwrite",
        bs: "4k",
        iodepth: 16,
        direct: true,
    },
];

fn tenantfs(data: &Path, args: &[&str]) {
    let out = Command::new(tenantfs_bin())
        .arg("--data-dir")
        .arg(data)
        .args(["--config", "/dev/null"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tenantfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs one fio job; returns (IOPS, MB/s, p50 completion latency in us).
fn fio(dir: &Path, job: &Job, secs: u32, size_mib: u32) -> (f64, f64, f64) {
    let engine = if job.iodepth > 1 { "libaio" } else { "psync" };
    let out = Command::new("fio")
        .arg("--name=bench")
        .arg(format!("--filename={}", dir.join("fio.dat").display()))
        .arg(format!("--size={size_mib}M"))
        .arg(format!("--rw={}", job.rw))
        .arg(format!("--bs={}", job.bs))
        .arg(format!("--iodepth={}", job.iodepth))
        .arg(format!("--ioengine={engine}"))
        .arg(format!("--direct={}", u8::from(job.direct)))
        .arg(format!("--runtime={secs}"))
        // invalidate=0: keep whatever the page cache holds (the cache-policy comparison).
        .args([
            "--time_based",
            "--randrepeat=0",
            "--invalidate=0",
            "--output-format=json",
        ])
        .output()
        .expect("fio is installed");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("fio json");
    let j = &v["jobs"][0];
    let side = if job.rw.contains("write") {
        &j["write"]
    } else {
        &j["read"]
    };
    let iops = side["iops"].as_f64().unwrap_or(0.0);
    let bw = side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6;
    let p50 = side["clat_ns"]["percentile"]["50.000000"]
        .as_f64()
        .unwrap_or(0.0)
        / 1000.0;
    (iops, bw, p50)
}

/// create, stat and unlink of `n` empty files: operations per second of each.
fn metadata_rates(dir: &Path, n: usize) -> (f64, f64, f64) {
    let d = dir.join("meta");
    fs::create_dir_all(&d).unwrap();
    let t = Instant::now();
    for i in 0..n {
        fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    let create = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        fs::metadata(d.join(format!("f{i}"))).unwrap();
    }
    let stat = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    let unlink = n as f64 / t.elapsed().as_secs_f64();
    (create, stat, unlink)
}

/// Bytes of `file` resident in the page cache (fincore).
fn resident(file: &Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "--output", "RES"])
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u32 = args.next().map_or(8, |s| s.parse().unwrap());
    let size_mib: u32 = args.next().map_or(256, |s| s.parse().unwrap());
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-fuse-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let data = tmp.path().join("data");
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    tenantfs(&data, &["init"]);
    let mut targets = vec![Target {
        label: "host ext4".into(),
        dir: host.clone(),
    }];
    let mut mounts = Vec::new();
    for (name, bs) in [("b4k", "4096"), ("b64k", "65536")] {
        tenantfs(&data, &["tenant", "create", name, "--block-size", bs]);
        let mnt = tmp.path().join(name);
        fs::create_dir_all(&mnt).unwrap();
        tenantfs(&data, &["mount", name, mnt.to_str().unwrap()]);
        mounts.push(mnt.clone());
        targets.push(Target {
            label: format!("tenantfs {}K blocks", bs.parse::<u32>().unwrap() / 1024),
            dir: mnt,
        });
    }

    println!(
        "fio: {size_mib} MiB file, {secs} s per job, 1 job; psync at qd1, libaio at qd16; direct=1"
    );
    print!("| job |");
    for t in &targets {
        print!(" {} IOPS | p50 us |", t.label);
    }
    for t in &targets[1..] {
        print!(" {} / host |", t.label);
    }
    println!();
    println!(
        "|---|{}{}",
        "---:|---:|".repeat(targets.len()),
        "---:|".repeat(targets.len() - 1)
    );
    for job in JOBS {
        let results: Vec<_> = targets
            .iter()
            .map(|t| fio(&t.dir, job, secs, size_mib))
            .collect();
        print!("| {} |", job.name);
        for (iops, _, p50) in &results {
            print!(" {iops:.0} | {p50:.1} |");
        }
        for (iops, _, _) in &results[1..] {
            print!(" {:.2} |", iops / results[0].0);
        }
        println!();
    }

    println!();
    println!("metadata: 5000 empty files, one thread");
    println!("| target | create/s | stat/s | unlink/s | create vs host |");
    println!("|---|---:|---:|---:|---:|");
    let base = metadata_rates(&host, 5000);
    println!(
        "| host ext4 | {:.0} | {:.0} | {:.0} | 1.00 |",
        base.0, base.1, base.2
    );
    for t in &targets[1..] {
        let r = metadata_rates(&t.dir, 5000);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} |",
            t.label,
            r.0,
            r.1,
            r.2,
            r.0 / base.0
        );
    }

    // Page-cache policy: the same 4 KiB-block tenant mounted with cache=direct, then
    // cache=kernel; buffered (direct=0) 4k random reads of a file that was read once.
    println!();
    println!("page-cache policy: buffered 4k random reads (direct=0), qd1, {size_mib} MiB file read once first");
    println!("| mount option | IOPS | p50 us | file bytes in page cache after | vs cache=direct |");
    println!("|---|---:|---:|---:|---:|");
    let mnt = &mounts[0];
    let mut direct_iops = 0.0;
    for opt in ["cache=direct", "cache=kernel"] {
        tenantfs(&data, &["umount", mnt.to_str().unwrap()]);
        tenantfs(&data, &["mount", "b4k", mnt.to_str().unwrap(), "-o", opt]);
        let file = mnt.join("fio.dat");
        let _ = fs::read(&file).unwrap();
        let job = Job {
            name: "buffered 4k randread",
            rw: "randread",
            bs: "4k",
            iodepth: 1,
            direct: false,
        };
        let (iops, _, p50) = fio(mnt, &job, secs, size_mib);
        if opt == "cache=direct" {
            direct_iops = iops;
        }
        println!(
            "| {opt} | {iops:.0} | {p50:.1} | {} MiB | {:.2} |",
            resident(&file) >> 20,
            iops / direct_iops
        );
    }

    for m in &mounts {
        tenantfs(&data, &["umount", m.to_str().unwrap()]);
    }
}
