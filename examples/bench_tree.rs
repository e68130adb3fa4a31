//! A tree of small files through the daemon vs the same commands on host ext4, in one run:
//! untar + sync, tar of the tree out, `cp -a` + sync, `git checkout` + sync and `rm -rf` +
//! sync. The tree is /usr/include and /usr/share/doc of this machine (about 12,000 files;
//! the target is each step at most 2x its ext4 time).
//!
//! Every step starts cold: the page cache is dropped and the daemon's caches are released
//! first. `tar c` writes into a pipe that this program drains (GNU tar skips reading files
//! when its output is /dev/null). The git repository lives on host ext4 and is cloned with
//! `--no-checkout` into each target, so the timed `git checkout` writes the work tree and the
//! index only. The tenant runs each round twice, mounted over FUSE's io_uring and over
//! /dev/fuse (FUSE over io_uring is turned on first if the kernel has it off).
//!
//! Then, to show where a step's time goes, one more round over the ring under `perf record -e
//! fuse:fuse_request_send` (the kernel's own tracepoint, so every request counts, whoever
//! asked for it): the requests each step made the kernel send, by opcode, and a floor: the
//! synchronous ones times what a request costs when the daemon has nothing to do (a statfs
//! loop on the mount, less the same loop on ext4), against the step's ext4 time. A floor
//! above 2x ext4 means no daemon-side work can bring the step under 2x; only fewer round
//! trips or cheaper ones can. Every timed tenant step also reads the daemon's own account of
//! the time it spent answering requests (`busy_us` in `tenantfs stats --json`): the step's
//! time less that is what the round trips and the caller took, the time a daemon answering
//! in no time would still take with the same requests. (Busy time includes requests nobody
//! waited for, such as RELEASE, so the rest is if anything an underestimate.)
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example bench_tree
//! [-- ROUNDS] (default 2; the table shows the median of the rounds). Needs root, tar, git,
//! /dev/fuse; perf (linux-perf) for the request counts, which are skipped without it.

mod common;
use common::daemon::{enable_fuse_uring, run, Daemon, SideBySide};
use common::median;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// The five steps on `dir`; `measure(i, step)` runs step `i` (timing or tracing it).
fn steps(
    dir: &Path,
    tar: &Path,
    repo: &Path,
    daemon: Option<&Daemon>,
    measure: &mut dyn FnMut(usize, &mut dyn FnMut()),
) {
    let tree = dir.join("tree");
    let copy = dir.join("copy");
    let clone = dir.join("clone");
    fs::create_dir_all(&tree).unwrap();
    cold(daemon);
    measure(0, &mut || {
        run(Command::new("tar").arg("xf").arg(tar).arg("-C").arg(&tree));
        sh("sync");
    });
    cold(daemon);
    measure(1, &mut || {
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
    measure(2, &mut || {
        run(Command::new("cp").arg("-a").arg(&tree).arg(&copy));
        sh("sync");
    });
    run(Command::new("git")
        .args(["clone", "-q", "--no-checkout", "--no-hardlinks"])
        .arg(repo)
        .arg(&clone));
    cold(daemon);
    measure(3, &mut || {
        run(Command::new("git")
            .arg("-C")
            .arg(&clone)
            .args(["checkout", "-q", "-f", "main"]));
        sh("sync");
    });
    cold(daemon);
    measure(4, &mut || {
        run(Command::new("rm")
            .arg("-rf")
            .arg(&tree)
            .arg(&copy)
            .arg(&clone));
        sh("sync");
    });
}

/// One step's numbers: seconds, and for the tenant the daemon's time answering requests
/// (seconds) and how many it answered.
#[derive(Clone, Copy, Default)]
struct Timed {
    secs: f64,
    busy: f64,
    requests: u64,
}

/// The daemon's request count and busy seconds for the mount of tenant `tree`.
fn busy(daemon: &Daemon) -> (u64, f64) {
    let out = daemon.cli(&["stats", "--json"]).output().unwrap();
    assert!(out.status.success(), "tenantfs stats failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = v["mounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["tenant"] == "tree"))
        .expect("tenant tree is mounted");
    (
        m["requests"].as_u64().unwrap_or(0),
        m["busy_us"].as_u64().unwrap_or(0) as f64 / 1e6,
    )
}

/// Each step timed; on the tenant, with the daemon's busy time and requests during it.
fn timed_steps(dir: &Path, tar: &Path, repo: &Path, daemon: Option<&Daemon>) -> [Timed; 5] {
    let mut t = [Timed::default(); 5];
    steps(dir, tar, repo, daemon, &mut |i, step| {
        let before = daemon.map(busy);
        t[i].secs = timed(step);
        if let (Some(d), Some((n0, b0))) = (daemon, before) {
            let (n1, b1) = busy(d);
            (t[i].requests, t[i].busy) = (n1 - n0, b1 - b0);
        }
    });
    t
}

/// `perf record` of the kernel's FUSE request tracepoint, system-wide, into `out`; None
/// without perf.
fn start_trace(out: &Path) -> Option<Child> {
    let child = Command::new("perf")
        .args(["record", "-q", "-a", "-e", "fuse:fuse_request_send", "-o"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_secs(1)); // perf attaches to every CPU first
    Some(child)
}

/// Stops the trace; the requests it saw, by opcode name.
fn stop_trace(mut perf: Child, out: &Path) -> BTreeMap<String, u64> {
    let pid = nix::unistd::Pid::from_raw(perf.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    perf.wait().unwrap();
    let script = Command::new("perf")
        .args(["script", "-F", "trace", "-i"])
        .arg(out)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&script.stdout).lines() {
        if let Some(op) = line.split(['(', ')']).nth(1) {
            *counts
                .entry(op.trim_start_matches("FUSE_").to_owned())
                .or_insert(0) += 1;
        }
    }
    counts
}

/// Requests the kernel sends without the caller waiting for them.
const ASYNC: [&str; 3] = ["RELEASE", "FORGET", "BATCH_FORGET"];

/// Microseconds per statfs(2) of `dir`, over 20,000 calls.
fn statfs_us(dir: &Path) -> f64 {
    const N: u32 = 20_000;
    let t = Instant::now();
    for _ in 0..N {
        nix::sys::statfs::statfs(dir).unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(N)
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(2, |s| s.parse().expect("ROUNDS is a number"));
    let SideBySide {
        daemon,
        host,
        mnt,
        tmp,
    } = SideBySide::new("tree", "tree");
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

    enable_fuse_uring();
    const TRANSPORTS: [&str; 2] = ["uring", "dev"];

    let mut ext4 = vec![Vec::new(); STEPS.len()];
    let mut tenant = [vec![Vec::new(); STEPS.len()], vec![Vec::new(); STEPS.len()]];
    for _ in 0..rounds {
        let a = timed_steps(&host, &tar, &repo, None);
        for i in 0..STEPS.len() {
            ext4[i].push(a[i].secs);
        }
        for (k, transport) in TRANSPORTS.iter().enumerate() {
            daemon.mount("tree", &mnt, transport);
            let b = timed_steps(&mnt, &tar, &repo, Some(&daemon));
            daemon.umount(&mnt);
            for i in 0..STEPS.len() {
                tenant[k][i].push(b[i]);
            }
        }
    }

    // The traced round, over the ring: requests per step, and what one costs with no work.
    daemon.mount("tree", &mnt, "uring");
    let trace = tmp.path().join("fuse.perf");
    let mut requests: Vec<Option<BTreeMap<String, u64>>> = vec![None; STEPS.len()];
    steps(&mnt, &tar, &repo, Some(&daemon), &mut |i, step| {
        let perf = start_trace(&trace);
        step();
        requests[i] = perf.map(|p| stop_trace(p, &trace));
    });
    let noop_us = median((0..3).map(|_| statfs_us(&mnt) - statfs_us(&host)).collect());
    daemon.umount(&mnt);

    println!(
        "small-file tree: {files} files ({} MiB tar), median of {rounds} rounds, each step cold",
        fs::metadata(&tar).unwrap().len() >> 20
    );
    println!(
        "| step | host ext4 s | tenantfs io_uring s | / ext4 | tenantfs /dev/fuse s | / ext4 |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let secs = |runs: &[Timed], f: fn(&Timed) -> f64| median(runs.iter().map(f).collect());
    for (i, step) in STEPS.iter().enumerate() {
        let a = median(ext4[i].clone());
        let u = secs(&tenant[0][i], |t| t.secs);
        let d = secs(&tenant[1][i], |t| t.secs);
        println!(
            "| {step} | {a:.2} | {u:.2} | {:.2} | {d:.2} | {:.2} |",
            u / a,
            d / a
        );
    }

    // What the daemon's own work took, and what was left: the round trips and the caller.
    println!();
    println!(
        "where the time over the ring went (medians): the daemon's time answering requests \
         (busy, its own metric) and the rest, which a daemon answering in no time would still take"
    );
    println!(
        "| step | io_uring s | requests | daemon busy s | us per request | rest s | rest / ext4 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, step) in STEPS.iter().enumerate() {
        let runs = &tenant[0][i];
        let u = secs(runs, |t| t.secs);
        let b = secs(runs, |t| t.busy);
        let n = secs(runs, |t| t.requests as f64);
        let rest = secs(runs, |t| t.secs - t.busy);
        println!(
            "| {step} | {u:.2} | {n:.0} | {b:.2} | {:.1} | {rest:.2} | {:.2} |",
            b * 1e6 / n.max(1.0),
            rest / median(ext4[i].clone())
        );
    }

    println!();
    println!(
        "requests the kernel sent per step over the ring (perf, fuse:fuse_request_send); \
         a request with nothing to do costs {noop_us:.1} us more than on ext4 (statfs)"
    );
    println!("| step | requests per file, by opcode | synchronous | floor s (synchronous x {noop_us:.1} us) | floor / ext4 |");
    println!("|---|---|---:|---:|---:|");
    for (i, step) in STEPS.iter().enumerate() {
        let Some(counts) = &requests[i] else {
            println!("| {step} | (no perf) | | | |");
            continue;
        };
        let mut by_count: Vec<_> = counts.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1));
        let per_file: Vec<String> = by_count
            .iter()
            .filter(|(_, &n)| n as f64 / files as f64 >= 0.05)
            .map(|(op, &n)| format!("{op} {:.2}", n as f64 / files as f64))
            .collect();
        let sync: u64 = counts
            .iter()
            .filter(|(op, _)| !ASYNC.contains(&op.as_str()))
            .map(|(_, n)| n)
            .sum();
        let floor = sync as f64 * noop_us / 1e6;
        println!(
            "| {step} | {} | {sync} | {floor:.2} | {:.2} |",
            per_file.join(", "),
            floor / median(ext4[i].clone())
        );
    }
}
