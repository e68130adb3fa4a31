//! Disk space per byte of file data after random rewrites of a file written in bulk: does the
//! garbage the rewrites leave come back by itself? (The target: space comes back without a
//! command; bulk writes go to extent files, random 4 KiB writes are folded into chunks that
//! leave the extent files partly or wholly unnamed.)
//!
//! Three scenarios, each on host ext4 and on a tenant of its own served by one daemon, side by
//! side: a 1 GiB file written with 1 MiB writes and fsynced, then SECONDS of 4 KiB random
//! writes (QD1) over (a) the whole file (fio, direct), (b) its first 700 MiB (fio, direct),
//! (c) three 64 KiB chunks of every four (pwrite, then an fsync): every extent file keeps a
//! quarter of its chunks. Then the file is left alone but for an fsync every 5 s
//! (collections start on a request) for WAIT seconds. Reported:
//! the directory's bytes on disk (`du`-like: allocated blocks) per byte of file, after the
//! bulk write, right after the random writes and at the end, and the ratio to ext4.
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example
//! bench_space [-- SECONDS [WAIT]]. Needs root, fio, /dev/fuse.

mod common;
use common::daemon::{enable_fuse_uring, run, Daemon};
use common::Rng;

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const FILE: u64 = 1 << 30;

/// Bytes allocated under `dir` (files' blocks, as `du` counts them).
fn allocated(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += allocated(&entry.path());
        } else {
            total += meta.blocks() * 512;
        }
    }
    total
}

fn fio(file: &Path, args: &[&str]) {
    run(Command::new("fio")
        .arg("--name=space")
        .arg(format!("--filename={}", file.display()))
        .args(["--ioengine=psync", "--output-format=terse"])
        .args(args));
}

/// Where the random writes go.
#[derive(Clone, Copy)]
enum Rewrite {
    /// fio randwrite, direct, over the first this many bytes (a fio size).
    Range(&'static str),
    /// 4 KiB writes into the chunks (64 KiB) not a multiple of 4.
    ThreeChunksInFour,
}

fn rewrite(file: &Path, how: Rewrite, seconds: u32) {
    match how {
        Rewrite::Range(range) => fio(
            file,
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--direct=1",
                "--io_size=100G",
                &format!("--size={range}"),
                &format!("--runtime={seconds}"),
                "--time_based",
            ],
        ),
        Rewrite::ThreeChunksInFour => {
            let f = fs::OpenOptions::new().write(true).open(file).unwrap();
            let mut rng = Rng::new(7);
            let block = vec![0xa5u8; 4096];
            let chunks = FILE >> 16;
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(seconds.into()) {
                for _ in 0..256 {
                    let chunk = rng.below(chunks);
                    if !chunk.is_multiple_of(4) {
                        let at = (chunk << 16) + (rng.below(16) << 12);
                        f.write_at(&block, at).unwrap();
                    }
                }
            }
            f.sync_all().unwrap();
        }
    }
}

/// Disk bytes per file byte of `store` after the bulk write, after the random writes
/// (`how`, for `seconds`), and after `wait` seconds of fsyncs every 5 s.
fn scenario(file: &Path, store: &Path, how: Rewrite, seconds: u32, wait: u64) -> [f64; 3] {
    let per_byte = || allocated(store) as f64 / FILE as f64;
    fio(
        file,
        &["--size=1G", "--rw=write", "--bs=1M", "--end_fsync=1"],
    );
    let written = per_byte();
    rewrite(file, how, seconds);
    let rewritten = per_byte();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(wait) {
        std::thread::sleep(Duration::from_secs(5));
        fs::File::open(file).unwrap().sync_all().unwrap();
    }
    [written, rewritten, per_byte()]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u32 = args.next().map_or(20, |s| s.parse().expect("SECONDS"));
    let wait: u64 = args.next().map_or(120, |s| s.parse().expect("WAIT"));
    enable_fuse_uring();
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-space-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let daemon = Daemon::start(&tmp.path().join("daemon"), "whole");
    for tenant in ["part", "strided"] {
        run(&mut daemon.cli(&["tenant", "create", tenant]));
    }
    let stores = tmp.path().join("daemon/data/tenants");
    println!(
        "disk bytes per file byte: 1 GiB file written in 1 MiB writes + fsync, then {seconds} s \
         of 4 KiB random writes, then {wait} s with an fsync every 5 s"
    );
    println!("| random writes over | fs | after bulk write | after random writes | at the end | ratio to ext4 at the end |");
    println!("|---|---|---:|---:|---:|---:|");
    for (tenant, how, label) in [
        ("whole", Rewrite::Range("1G"), "the whole file"),
        ("part", Rewrite::Range("700M"), "its first 700 MiB"),
        ("strided", Rewrite::ThreeChunksInFour, "3 chunks in 4"),
    ] {
        let ext4 = tmp.path().join(format!("ext4-{tenant}"));
        fs::create_dir_all(&ext4).unwrap();
        let e = scenario(&ext4.join("f"), &ext4, how, seconds, 0);
        let mnt = tmp.path().join(format!("mnt-{tenant}"));
        fs::create_dir_all(&mnt).unwrap();
        daemon.mount(tenant, &mnt, "uring");
        let t = scenario(&mnt.join("f"), &stores.join(tenant), how, seconds, wait);
        daemon.umount(&mnt);
        for (fs_name, r) in [("ext4", e), ("tenantfs", t)] {
            println!(
                "| {label} | {fs_name} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r[0],
                r[1],
                r[2],
                r[2] / e[2]
            );
        }
    }
}
