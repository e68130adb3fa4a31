//! A tree of small files through the daemon vs the same commands on host ext4, in one run:
//! untar + sync, tar of the tree out, `cp -a` + sync, `git checkout` + sync and `rm -rf` +
//! sync. The tree is /usr/include and /usr/share/doc of this machine (about 12,000 files;
//! issue 12 asks each step to take at most 2x its ext4 time).
//!
//! Every step starts cold: the page cache is dropped and the daemon's caches are released
//! first. `tar c` writes into a pipe that this program drains (GNU tar skips reading files
//! when its output is /dev/null). The git repository lives on host ext4 and is cloned with
//! `--no-checkout` into each target, so the timed `git checkout` writes the work tree and the
//! index only. The tenant runs each round twice, mounted over FUSE's io_uring and over
//! /dev/fuse (FUSE over io_uring is turned on first if the kernel has it off).
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example bench_tree
//! [-- ROUNDS] (default 2; the table shows the median of the rounds). Needs root, tar, git, /dev/fuse.

mod common;
use common::daemon::{enable_fuse_uring, run, Daemon};
use common::median;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const STEPS: [&str; 5] = [
    "untar + sync",
    "tar c (read the tree)",
    "cp -a + sync",
    "git checkout + sync",
    "rm -rf + sync",
];

fn sh(script: &str) {
    run(Command::new("sh").args(["-c", script]));
}

/// Drops the page cache and, for the tenant, the daemon's caches.
fn cold(daemon: Option<&Daemon>) {
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    if let Some(d) = daemon {
        run(&mut d.cli(&["cache", "release", "64G"]));
    }
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// The five steps on `dir`; seconds per step.
fn steps(dir: &Path, tar: &Path, repo: &Path, daemon: Option<&Daemon>) -> [f64; 5] {
    let tree = dir.join("tree");
    let copy = dir.join("copy");
    let clone = dir.join("clone");
    fs::create_dir_all(&tree).unwrap();
    let mut t = [0.0; 5];
    cold(daemon);
    t[0] = timed(|| {
        run(Command::new("tar").arg("xf").arg(tar).arg("-C").arg(&tree));
        sh("sync");
    });
    cold(daemon);
    t[1] = timed(|| {
        let mut child = Command::new("tar")
            .args(["cf", "-", "-C"])
            .arg(&tree)
            .arg(".")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        assert!(child.wait().unwrap().success());
        assert!(total > 100 << 20, "tar wrote only {total} bytes");
    });
    cold(daemon);
    t[2] = timed(|| {
        run(Command::new("cp").arg("-a").arg(&tree).arg(&copy));
        sh("sync");
    });
    run(Command::new("git")
        .args(["clone", "-q", "--no-checkout", "--no-hardlinks"])
        .arg(repo)
        .arg(&clone));
    cold(daemon);
    t[3] = timed(|| {
        run(Command::new("git")
            .arg("-C")
            .arg(&clone)
            .args(["checkout", "-q", "-f", "main"]));
        sh("sync");
    });
    cold(daemon);
    t[4] = timed(|| {
        run(Command::new("rm")
            .arg("-rf")
            .arg(&tree)
            .arg(&copy)
            .arg(&clone));
        sh("sync");
    });
    t
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(2, |s| s.parse().expect("ROUNDS is a number"));
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-tree-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let tar = tmp.path().join("tree.tar");
    run(Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .args(["-C", "/", "usr/include", "usr/share/doc"]));
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    run(Command::new("tar").arg("xf").arg(&tar).arg("-C").arg(&src));
    let files = String::from_utf8(
        Command::new("find")
            .arg(&src)
            .args(["-type", "f"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .lines()
    .count();
    let repo = tmp.path().join("repo.git");
    sh(&format!(
        "cd {src} && git init -q -b main && git add -A && \
         git -c user.name=bench -c user.email=bench@localhost commit -qm tree && \
         git clone -q --bare . {repo}",
        src = src.display(),
        repo = repo.display()
    ));
    fs::remove_dir_all(&src).unwrap();

    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    let daemon = Daemon::start(&tmp.path().join("daemon"), "tree");
    let mnt = tmp.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    enable_fuse_uring();
    const TRANSPORTS: [&str; 2] = ["uring", "dev"];

    let mut ext4 = vec![Vec::new(); STEPS.len()];
    let mut tenant = [vec![Vec::new(); STEPS.len()], vec![Vec::new(); STEPS.len()]];
    for _ in 0..rounds {
        let a = steps(&host, &tar, &repo, None);
        for i in 0..STEPS.len() {
            ext4[i].push(a[i]);
        }
        for (k, transport) in TRANSPORTS.iter().enumerate() {
            daemon.mount("tree", &mnt, transport);
            let b = steps(&mnt, &tar, &repo, Some(&daemon));
            daemon.umount(&mnt);
            for i in 0..STEPS.len() {
                tenant[k][i].push(b[i]);
            }
        }
    }

    println!(
        "small-file tree: {files} files ({} MiB tar), median of {rounds} rounds, each step cold",
        fs::metadata(&tar).unwrap().len() >> 20
    );
    println!(
        "| step | host ext4 s | tenantfs io_uring s | / ext4 | tenantfs /dev/fuse s | / ext4 |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, step) in STEPS.iter().enumerate() {
        let a = median(ext4[i].clone());
        let u = median(tenant[0][i].clone());
        let d = median(tenant[1][i].clone());
        println!(
            "| {step} | {a:.2} | {u:.2} | {:.2} | {d:.2} | {:.2} |",
            u / a,
            d / a
        );
    }
}
