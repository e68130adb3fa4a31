//! Idle mounted tenants: what one more mounted tenant costs the daemon in RSS, threads and
//! open files, what it holds on disk, and how long a mount takes. Hosts mount hundreds of
//! tenants of which most sit idle, so the per-mount floor decides density (targets: <= 1 MiB
//! RSS and <= 1 MiB of disk beyond its data per idle mounted tenant, mount <= 50 ms).
//!
//! One daemon, N empty tenants (created before it starts). Steps, each followed by a settle
//! and a sample of the daemon (VmRSS, RssAnon from /proc/PID/status; threads; open
//! files) and of the disk the tenants' directories take (allocated blocks):
//!   1. daemon up, nothing mounted;
//!   2. N mounts through the control socket (each mount timed: the daemon's own work, no
//!      client process start);
//!   3. every tenant used once (a 4 KiB file written, fsynced and read back), sampled at
//!      once and again after the settle (idle stores' memtables are flushed by then);
//!   4. every mount dormant: idle for `[store] close_idle_after_secs` (IDLE_SECS, default the
//!      shipped 60), its store closed; then each woken by a read of its file (timed: the
//!      first request after a rest opens the store again), sampled once all are awake;
//!   5. the host cache released (`cache release`), as the governor would under pressure;
//!   6. N unmounts through the socket (timed).
//!
//! Then K mounts and unmounts through the CLI (`tenantfs mount`/`umount`, what an operator or
//! the mount helper pays: a process start plus the request) beside K runs of `tenantfs stats`,
//! a CLI process that only asks the daemon for its numbers: the process-start floor; and, when
//! /sbin/mount.tenantfs is installed, K `mount -t tenantfs` (mount(8) and the helper script).
//!
//! usage: cargo build --release --bins --examples
//!        cargo run --release --example bench_idle_mounts [-- TENANTS CLI_MOUNTS IDLE_SECS]
//! Needs root and /dev/fuse. It raises its open-files limit for the daemon where it may (10,000
//! mounts awake hold about 150,000 descriptors, dormant 10,000: one each). Under a lower limit
//! (this build machine's 20,000) run 10,000 with IDLE_SECS 1, so stores rest a second after
//! their last request and only the last second's mounts have theirs open.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::tenantfs_bin;
use tenantfs::control::{Client, Reply, Request};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
/// Longer than the 5 s a /dev/fuse worker beyond the first waits for a request before it ends,
/// so an idle mount is sampled with the one thread it keeps.
const SETTLE: Duration = Duration::from_secs(6);

/// VmRSS and RssAnon of `pid`, bytes.
#[derive(Clone, Copy)]
struct Rss {
    total: u64,
    anon: u64,
}

fn rss(pid: u32) -> Rss {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(key)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0u64)
            * KIB
    };
    Rss {
        total: kib("VmRSS:"),
        anon: kib("RssAnon:"),
    }
}

/// The daemon's threads, counted by name (the kernel's `comm`), most common first.
fn threads(pid: u32) -> Vec<(String, usize)> {
    let mut by_name = std::collections::BTreeMap::new();
    for t in fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        // Per-mount threads are named after their tenant: group them (t0001 -> t####).
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let name: String = comm
            .trim()
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        *by_name.entry(name).or_insert(0) += 1;
    }
    let mut v: Vec<(String, usize)> = by_name.into_iter().collect();
    v.sort_by_key(|t| std::cmp::Reverse(t.1));
    v
}

fn count(threads: &[(String, usize)]) -> usize {
    threads.iter().map(|t| t.1).sum()
}

/// Open file descriptors of `pid`.
fn open_files(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Disk the files under `dir` take (allocated blocks, not sizes).
fn allocated(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => allocated(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// One sample of the daemon and the tenants' disk after a step.
struct Sample {
    rss: Rss,
    threads: Vec<(String, usize)>,
    files: usize,
    disk: u64,
    /// What the host cache holds against its budget (memtables' charges included).
    cache_used: u64,
}

fn sample(b: &Bench, tenants: &std::path::Path) -> Sample {
    let pid = b.pid();
    let cache_used = match b.request(&Request::CacheStats) {
        Reply::Cache(c) => c.cache.used_bytes,
        other => panic!("cache_stats answered {other:?}"),
    };
    Sample {
        rss: rss(pid),
        threads: threads(pid),
        files: open_files(pid),
        disk: allocated(tenants),
        cache_used,
    }
}

struct Bench {
    bin: PathBuf,
    data: PathBuf,
    cfg: PathBuf,
    socket: PathBuf,
    daemon: Option<Child>,
    mounted: Vec<PathBuf>,
    _tmp: tempfile::TempDir,
}

impl Bench {
    fn cli(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.cfg)
            .args(args)
            .env_remove("TENANTFS_LOG");
        c
    }

    fn ok(&self, args: &[&str]) {
        let out = self.cli(args).output().expect("run tenantfs");
        assert!(
            out.status.success(),
            "tenantfs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn request(&self, req: &Request) -> Reply {
        Client::new(&self.socket)
            .call(req)
            .unwrap_or_else(|e| panic!("{req:?}: {e}"))
    }

    fn pid(&self) -> u32 {
        self.daemon.as_ref().expect("daemon").id()
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        for mp in self.mounted.drain(..) {
            let _ = Command::new("umount").arg("-l").arg(&mp).status();
        }
        if let Some(mut d) = self.daemon.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = d.wait();
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// "p50 x ms, p90 y ms, max z ms" of `ms`.
fn summary(mut ms: Vec<f64>) -> (f64, f64, f64) {
    ms.sort_by(|a, b| a.total_cmp(b));
    (pct(&ms, 0.5), pct(&ms, 0.9), *ms.last().unwrap())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map_or(100, |s| s.parse().expect("TENANTS"));
    let k: usize = args.get(1).map_or(20, |s| s.parse().expect("CLI_MOUNTS"));
    let idle_secs: u64 = args.get(2).map_or(60, |s| s.parse().expect("IDLE_SECS"));
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    assert!(idle_secs > 0, "IDLE_SECS: mounts must rest for step 4");
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if setrlimit(Resource::RLIMIT_NOFILE, 1 << 20, 1 << 20).is_err() {
        // Without CAP_SYS_RESOURCE the hard limit stays: it bounds the mounts.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        println!("open-files limit stays at {hard} (no CAP_SYS_RESOURCE to raise it)");
    }
    assert!(k <= n && k > 0 && n > 0);

    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-idle-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");
    let root = tmp.path().to_path_buf();
    let data = root.join("data");
    let mut b = Bench {
        bin: tenantfs_bin(),
        socket: data.join("tenantfs.sock"),
        cfg: root.join("tenantfs.toml"),
        data,
        daemon: None,
        mounted: Vec::new(),
        _tmp: tmp,
    };
    // The shipped defaults, except a budget small enough not to matter.
    fs::write(
        &b.cfg,
        format!("[cache]\nbudget = \"256M\"\n[store]\nclose_idle_after_secs = {idle_secs}\n"),
    )
    .unwrap();
    b.ok(&["init"]);
    let t = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("t{i:04}")).collect();
    for name in &names {
        b.ok(&["tenant", "create", name]);
    }
    println!(
        "created {n} tenants in {:.1} s; work dir {}",
        t.elapsed().as_secs_f64(),
        root.display()
    );
    let mps: Vec<PathBuf> = names
        .iter()
        .map(|name| {
            let mp = root.join("mnt").join(name);
            fs::create_dir_all(&mp).unwrap();
            mp
        })
        .collect();

    let daemon = b
        .cli(&["daemon"])
        .env("TENANTFS_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(root.join("daemon.log")).unwrap())
        .spawn()
        .expect("start daemon");
    b.daemon = Some(daemon);
    let start = Instant::now();
    while Client::new(&b.socket).stats().is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "daemon not up");
        sleep(Duration::from_millis(20));
    }
    let pid = b.pid();
    let tenants_dir = b.data.join("tenants");
    sleep(SETTLE);
    let s0 = sample(&b, &tenants_dir);

    // 2. N mounts through the socket.
    let mut mount_ms = Vec::with_capacity(n);
    for (name, mp) in names.iter().zip(&mps) {
        let t = Instant::now();
        b.request(&Request::Mount {
            tenant: name.clone(),
            mountpoint: mp.to_string_lossy().into_owned(),
            options: String::new(),
        });
        mount_ms.push(t.elapsed().as_secs_f64() * 1e3);
        b.mounted.push(mp.clone());
    }
    sleep(SETTLE);
    let s1 = sample(&b, &tenants_dir);

    // 3. Each tenant used once, then idle.
    let page = vec![0x5au8; 4096];
    let mut back = vec![0u8; 4096];
    for mp in &mps {
        let f = fs::File::create(mp.join("touched")).unwrap();
        f.write_all_at(&page, 0).unwrap();
        f.sync_all().unwrap();
        fs::File::open(mp.join("touched"))
            .unwrap()
            .read_exact_at(&mut back, 0)
            .unwrap();
        assert_eq!(back, page);
    }
    let s2_now = sample(&b, &tenants_dir);
    sleep(SETTLE);
    let s2 = sample(&b, &tenants_dir);

    // 4. Every mount dormant, then each woken by a read.
    let start = Instant::now();
    let dormant = |b: &Bench| match b.request(&Request::Stats) {
        Reply::Stats(s) => s.mounts.iter().filter(|m| m.dormant).count(),
        other => panic!("stats answered {other:?}"),
    };
    while dormant(&b) < n {
        assert!(
            start.elapsed() < Duration::from_secs(idle_secs + 120),
            "{} of {n} mounts dormant after {} s",
            dormant(&b),
            start.elapsed().as_secs()
        );
        sleep(Duration::from_secs(1));
    }
    sleep(SETTLE);
    let s_dormant = sample(&b, &tenants_dir);
    let mut wake_ms = Vec::with_capacity(n);
    for mp in &mps {
        let t = Instant::now();
        fs::File::open(mp.join("touched"))
            .unwrap()
            .read_exact_at(&mut back, 0)
            .unwrap();
        wake_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(back, page);
    }
    let s_woken = sample(&b, &tenants_dir);

    // 5. Caches given back, as under memory pressure.
    b.request(&Request::CacheRelease {
        bytes: u64::MAX / 2,
    });
    sleep(SETTLE);
    let s3 = sample(&b, &tenants_dir);

    // 6. N unmounts through the socket.
    let mut umount_ms = Vec::with_capacity(n);
    for mp in &mps {
        let t = Instant::now();
        b.request(&Request::Umount {
            mountpoint: mp.to_string_lossy().into_owned(),
        });
        umount_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    b.mounted.clear();
    sleep(SETTLE);
    let s4 = sample(&b, &tenants_dir);

    // CLI: K mounts/unmounts and K no-op CLI requests, interleaved.
    let (mut cli_mount, mut cli_umount, mut cli_noop) = (vec![], vec![], vec![]);
    let helper = std::path::Path::new("/sbin/mount.tenantfs").exists();
    let mut helper_mount = vec![];
    for (name, mp) in names.iter().zip(&mps).take(k) {
        let mps = mp.to_str().unwrap();
        let t = Instant::now();
        b.ok(&["stats"]);
        cli_noop.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        b.ok(&["mount", name, mps]);
        cli_mount.push(t.elapsed().as_secs_f64() * 1e3);
        b.mounted.push(mp.clone());
        let t = Instant::now();
        b.ok(&["umount", mps]);
        cli_umount.push(t.elapsed().as_secs_f64() * 1e3);
        b.mounted.clear();
        // mount(8) through the installed helper, when there is one.
        if helper {
            let opts = format!("data_dir={},config={}", b.data.display(), b.cfg.display());
            let t = Instant::now();
            let out = Command::new("mount")
                .args(["-t", "tenantfs", name, mps, "-o", &opts])
                .env("TENANTFS", &b.bin)
                .output()
                .expect("mount(8)");
            helper_mount.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(
                out.status.success(),
                "mount -t tenantfs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            b.mounted.push(mp.clone());
            b.ok(&["umount", mps]);
            b.mounted.clear();
        }
    }

    let per =
        |a: Rss, z: Rss, f: fn(Rss) -> u64| (f(z) as f64 - f(a) as f64) / n as f64 / KIB as f64;
    let per_n = |a: usize, z: usize| (z as f64 - a as f64) / n as f64;
    println!();
    println!("Daemon (pid {pid}) and disk, {n} tenants:");
    println!();
    println!(
        "| step | VmRSS MiB | RssAnon MiB | threads | open files | tenants' disk MiB | cache used \
         MiB | per mounted tenant vs step 1: KiB RSS / anon, threads, files | disk per tenant \
         KiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let rows = [
        ("1. daemon up, nothing mounted", &s0),
        ("2. all mounted, untouched", &s1),
        (
            "3. each used once (4 KiB written, fsynced, read), at once",
            &s2_now,
        ),
        ("3. the same, idle for the settle time", &s2),
        ("4. all dormant (stores closed while idle)", &s_dormant),
        ("4. each woken by a read of its file", &s_woken),
        ("5. after `cache release`", &s3),
        ("6. all unmounted", &s4),
    ];
    for (i, (what, s)) in rows.iter().enumerate() {
        println!(
            "| {what} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} | {} | {:.0} |",
            s.rss.total as f64 / MIB as f64,
            s.rss.anon as f64 / MIB as f64,
            count(&s.threads),
            s.files,
            s.disk as f64 / MIB as f64,
            s.cache_used as f64 / MIB as f64,
            if i == 0 {
                "-".to_owned()
            } else {
                format!(
                    "{:.0} / {:.0}, {:.1}, {:.1}",
                    per(s0.rss, s.rss, |r| r.total),
                    per(s0.rss, s.rss, |r| r.anon),
                    per_n(count(&s0.threads), count(&s.threads)),
                    per_n(s0.files, s.files)
                )
            },
            s.disk as f64 / n as f64 / KIB as f64
        );
    }
    println!();
    println!(
        "Threads with {n} mounts (by name): {}",
        s2.threads
            .iter()
            .map(|(name, c)| format!("{name} x{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    println!("Mount and unmount times, ms:");
    println!();
    println!("| operation | count | p50 | p90 | max | p50 / CLI floor |");
    println!("|---|---:|---:|---:|---:|---:|");
    let floor = summary(cli_noop.clone()).0;
    for (what, ms) in [
        ("mount through the socket (daemon's work)", mount_ms),
        (
            "first read of a dormant mount (open + read: the store opens)",
            wake_ms,
        ),
        ("umount through the socket (flush + close)", umount_ms),
        (
            "`tenantfs stats` (CLI floor: process start + one request)",
            cli_noop,
        ),
        ("`tenantfs mount` (CLI)", cli_mount),
        ("`tenantfs umount` (CLI)", cli_umount),
        (
            "`mount -t tenantfs` (mount(8) + /sbin/mount.tenantfs + CLI)",
            helper_mount,
        ),
    ] {
        let count = ms.len();
        if count == 0 {
            println!("| {what} | 0 (no /sbin/mount.tenantfs: `make install`) | | | | |");
            continue;
        }
        let (p50, p90, max) = summary(ms);
        println!(
            "| {what} | {count} | {p50:.1} | {p90:.1} | {max:.1} | {:.2}x |",
            p50 / floor
        );
    }
}
