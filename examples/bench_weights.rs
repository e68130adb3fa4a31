//! Weights between busy tenants of one daemon (`-o weight=N`): two tenants, each with fio
//! doing 4 KiB O_DIRECT random reads of a cached 256 MiB file with two jobs (both saturate
//! the 2-CPU host), run at once; each tenant's share of the IOPS, for weights 100:300 (target
//! 25% +- 5% and 75% +- 5%), 100:100 (50% each) and no weights at all (the queue not engaged:
//! what the kernel's scheduler gives). Then the check that sharing gives nothing away: a QD1
//! tenant reading a 1 GiB file through a 256 MiB cache (its reads wait on the disk) beside a
//! tenant reading its cached file with two jobs, with and without weights: the cached tenant
//! must keep its IOPS (a tenant slowed by its own disk reads must not hold the other to its
//! pace).
//!
//! usage: make build && cargo run --release --example bench_weights [-- REPEATS SECONDS]
//! Needs root, /dev/fuse and fio.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use common::{fio_side, median, tenantfs_bin};

/// One daemon over a fresh data dir, with tenants `a` and `b` mounted with `options`.
struct Daemon {
    dir: tempfile::TempDir,
    daemon: Child,
    mounts: Vec<PathBuf>,
}

/// `tenantfs` on the data dir and config in `dir`.
fn tenantfs(dir: &Path) -> Command {
    let mut c = Command::new(tenantfs_bin());
    c.arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--config")
        .arg(dir.join("cfg.toml"));
    c
}

fn cli(dir: &Path, args: &[&str]) {
    let out = tenantfs(dir).args(args).output().expect("tenantfs runs");
    assert!(
        out.status.success(),
        "tenantfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Daemon {
    fn start(budget: &str, options: [&str; 2]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bench-weights-")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::write(
            dir.path().join("cfg.toml"),
            format!("[cache]\nbudget = \"{budget}\"\n"),
        )
        .unwrap();
        cli(dir.path(), &["init"]);
        cli(dir.path(), &["tenant", "create", "a"]);
        cli(dir.path(), &["tenant", "create", "b"]);
        let daemon = tenantfs(dir.path())
            .arg("daemon")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            daemon,
            dir,
            mounts: Vec::new(),
        };
        let socket = d.dir.path().join("data/tenantfs.sock");
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            sleep(Duration::from_millis(50));
        }
        for (name, opts) in ["a", "b"].into_iter().zip(options) {
            let mp = d.dir.path().join(format!("m{name}"));
            std::fs::create_dir_all(&mp).unwrap();
            let mps = mp.to_str().unwrap().to_owned();
            if opts.is_empty() {
                cli(d.dir.path(), &["mount", name, &mps]);
            } else {
                cli(d.dir.path(), &["mount", "-o", opts, name, &mps]);
            }
            d.mounts.push(mp);
        }
        d
    }

    fn mount(&self, i: usize) -> &Path {
        &self.mounts[i]
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for mp in &self.mounts {
            let _ = Command::new("umount").arg(mp).status();
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.daemon.wait();
    }
}

/// Writes `mib` MiB of noise to `path`, and reads it once (into the cache, if it fits).
fn lay_out(path: &Path, mib: usize) {
    use std::io::{Read, Write};
    let mut rng = common::Rng::new(mib as u64);
    let piece: Vec<u8> = (0..1 << 20).map(|_| rng.below(256) as u8).collect();
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..mib {
        let mut p = piece.clone();
        p[..8].copy_from_slice(&(i as u64).to_le_bytes());
        f.write_all(&p).unwrap();
    }
    f.sync_all().unwrap();
    let mut back = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back.len(), mib << 20);
}

/// fio 4 KiB random reads of `file` (`size`) with `jobs` jobs for `secs`.
fn fio(file: &Path, size: &str, jobs: u32, secs: u32) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=weights",
        &format!("--filename={}", file.display()),
        &format!("--size={size}"),
        "--bs=4k",
        "--rw=randread",
        "--direct=1",
        "--ioengine=psync",
        &format!("--numjobs={jobs}"),
        "--group_reporting",
        "--time_based",
        &format!("--runtime={secs}"),
        "--output-format=json",
    ]);
    c
}

/// Runs `a` and `b` at once: their (IOPS, p99 us).
fn side_by_side(mut a: Command, mut b: Command) -> [(f64, f64); 2] {
    let ta = std::thread::spawn(move || fio_side(&mut a, "a"));
    let vb = fio_side(&mut b, "b");
    let va = ta.join().unwrap();
    [va, vb].map(|v| {
        (
            v["iops"].as_f64().unwrap(),
            v["clat_ns"]["percentile"]["99.000000"]
                .as_f64()
                .unwrap_or(0.0)
                / 1e3,
        )
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let repeats: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let secs: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);

    println!("Two busy tenants, 4 KiB random reads of a cached 256 MiB file, 2 jobs each, {secs} s, {repeats} runs:");
    println!();
    println!(
        "| weights a : b | a's share of IOPS (runs) | median | target | total IOPS (median) |"
    );
    println!("|---|---|---:|---:|---:|");
    for (label, opts, target) in [
        ("100 : 300", ["weight=100", "weight=300"], "25% +- 5%"),
        ("100 : 100", ["weight=100", "weight=100"], "50% +- 5%"),
        ("none (queue not engaged)", ["", ""], "-"),
    ] {
        let (mut shares, mut totals) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            let d = Daemon::start("1G", opts);
            for i in 0..2 {
                lay_out(&d.mount(i).join("f"), 256);
            }
            let [(a, _), (b, _)] = side_by_side(
                fio(&d.mount(0).join("f"), "256M", 2, secs),
                fio(&d.mount(1).join("f"), "256M", 2, secs),
            );
            shares.push(a / (a + b));
            totals.push(a + b);
        }
        let runs: Vec<String> = shares
            .iter()
            .map(|s| format!("{:.1}%", s * 100.0))
            .collect();
        println!(
            "| {label} | {} | {:.1}% | {target} | {:.0} |",
            runs.join(", "),
            median(shares) * 100.0,
            median(totals)
        );
    }

    println!();
    println!("Sharing gives nothing away: a, QD1 4 KiB random reads of a 1 GiB file through a 256 MiB cache (from the disk); b, 2 jobs on its cached 64 MiB file; {secs} s, {repeats} runs, medians:");
    println!();
    println!("| weights | a IOPS | a p99 us | b IOPS | b p99 us |");
    println!("|---|---:|---:|---:|---:|");
    for (label, opts) in [
        ("none", ["", ""]),
        ("100 : 100", ["weight=100", "weight=100"]),
    ] {
        let mut rows = Vec::new();
        for _ in 0..repeats {
            let d = Daemon::start("256M", opts);
            lay_out(&d.mount(0).join("f"), 1024);
            lay_out(&d.mount(1).join("f"), 64);
            rows.push(side_by_side(
                fio(&d.mount(0).join("f"), "1G", 1, secs),
                fio(&d.mount(1).join("f"), "64M", 2, secs),
            ));
        }
        let col = |t: usize, k: usize| {
            median(
                rows.iter()
                    .map(|r| if k == 0 { r[t].0 } else { r[t].1 })
                    .collect(),
            )
        };
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} | {:.0} |",
            col(0, 0),
            col(0, 1),
            col(1, 0),
            col(1, 1)
        );
    }
}
