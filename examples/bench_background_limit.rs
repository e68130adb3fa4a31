//! A byte limit against what the tenant's store writes behind it: a tenant mounted with
//! `bandwidth=LIMIT` does fio 4 KiB random writes (libaio, QD8, O_DIRECT) over a 256 MiB file
//! laid out unlimited first, for SECONDS; then it rests until the daemon's disk has been quiet
//! for 5 s (its flushes, compactions and folds done; 300 s at most). Reported: what fio wrote
//! a second, and what the daemon moved to and from the disk a second (`/proc/PID/io`:
//! read_bytes + write_bytes) over the run and over the run and the rest, each against the
//! limit, and the background bytes `stats` counted. Run it on a
//! build before the background work was charged (`TENANTFS_BIN=...`) for the difference.
//!
//! usage: make build && cargo run --release --example bench_background_limit [-- SECONDS LIMIT]
//! Needs root, /dev/fuse and fio.

mod common;

use std::time::{Duration, Instant};

use common::daemon::{lay_out, run, Daemon};
use common::fio_side;

/// The daemon's disk reads and writes so far, bytes (`/proc/PID/io`).
fn disk_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/PID/io");
    io.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            matches!(k, "read_bytes" | "write_bytes").then(|| v.trim().parse::<u64>().ok())?
        })
        .sum()
}

fn parse_size(s: &str) -> u64 {
    let (n, unit) = s.split_at(s.trim_end_matches(['K', 'M', 'G']).len());
    let n: u64 = n.parse().expect("LIMIT: a size such as 16M");
    n << match unit {
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => 0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: u32 = args.first().map_or(60, |s| s.parse().expect("SECONDS"));
    let limit_arg = args.get(1).cloned().unwrap_or_else(|| "16M".into());
    let limit = parse_size(&limit_arg);
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-bglimit-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // Small write buffers: the store flushes, and then compacts, while fio runs.
    let config = "[cache]\nbudget = \"256M\"\n[store]\nwrite_buffers = \"16M\"\n";
    let daemon = Daemon::start_with(&tmp.path().join("daemon"), config, &["t"]);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    daemon.mount_with("t", &mnt, "");
    let file = mnt.join("f");
    lay_out(&file, 256);
    run(&mut daemon.cli(&["tenant", "set", "t", "--bandwidth", &limit_arg]));
    std::thread::sleep(Duration::from_secs(10));
    let stats = || -> serde_json::Value {
        let out = daemon.cli(&["stats", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["mounts"][0].clone()
    };
    let (pid, bg0) = (
        daemon.pid(),
        stats()["background_bytes"].as_u64().unwrap_or(0),
    );
    let (disk0, start) = (disk_bytes(pid), Instant::now());
    let fio = fio_side(
        &mut common::daemon::fio_for(
            &file,
            "256M",
            secs,
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=8",
            ],
        ),
        "randwrite",
    );
    let (disk_run, run_secs) = (disk_bytes(pid) - disk0, start.elapsed().as_secs_f64());
    // Until the daemon's disk is quiet: the same work done, however it was paced.
    let (mut last, mut quiet_since) = (disk_bytes(pid), Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(5)
        && start.elapsed() < Duration::from_secs(u64::from(secs) + 300)
    {
        std::thread::sleep(Duration::from_millis(500));
        let now = disk_bytes(pid);
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    // (The quiet 5 s are not part of the work.)
    let all_secs = (quiet_since - start).as_secs_f64();
    let disk_all = last - disk0;
    let bg = stats()["background_bytes"].as_u64().unwrap_or(0) - bg0;
    let mib = |b: f64| b / (1 << 20) as f64;
    let fio_bps = fio["bw_bytes"].as_f64().unwrap();
    println!(
        "limit {limit_arg}/s · fio 4k randwrite QD8 {secs} s: {:.1} MiB/s ({:.2}x the limit) · \
         the daemon's disk I/O: {:.1} MiB/s over the run ({:.2}x), {:.1} MiB/s until its disk \
         was quiet, {:.0} s in all ({:.2}x) · background work counted: {:.0} MiB",
        mib(fio_bps),
        fio_bps / limit as f64,
        mib(disk_run as f64 / run_secs),
        disk_run as f64 / run_secs / limit as f64,
        mib(disk_all as f64 / all_secs),
        all_secs,
        disk_all as f64 / all_secs / limit as f64,
        mib(bg as f64),
    );
    daemon.umount(&mnt);
}
