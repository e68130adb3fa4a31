//! Tenant interference: a fio "tenant" doing buffered 4k random reads over a page-cache-warm
//! working set on the host disk, beside a busy tenantfs daemon, both in ONE memory-capped
//! cgroup (v1 or v2). Four runs per repetition:
//!   1. baseline: the fio tenant alone in the cgroup (daemon stopped);
//!   2. CPU neighbour: a busy loop on the other CPU, in the cgroup, touching no memory and
//!      doing no I/O: what any busy neighbour costs the fio tenant on this machine;
//!   3. buffered: the daemon with `[store] direct_io = "off"` serving a tenant whose data set
//!      is larger than its cache, under a random-read load generator;
//!   4. O_DIRECT: the same with `direct_io = "auto"`.
//!
//! It prints the fio tenant's IOPS, p99 completion latency and % drop against the baseline
//! and against the CPU neighbour of the same repetition, the cgroup's memory at the end of
//! each run, how much of the fio working set was still in the page cache, how busy the other
//! CPU was, the load generator's IOPS and the daemon's governor decisions; then the medians
//! over the repetitions.
//!
//! CPU: the fio tenant is pinned to CPU 0, the daemon and its load generator (or the busy
//! loop) to CPU 1. The fio tenant is CPU-bound (page-cache hits), so on a VM whose vCPUs
//! share a physical core it loses IOPS to anything that keeps the other vCPU busy; the CPU
//! neighbour run measures that floor, and the drop beyond it is what tenantfs's memory and
//! I/O cost the tenant.
//!
//! usage: cargo build --release --bins --examples
//!        cargo run --release --example bench_interference [-- SECONDS REPEATS]
//! Needs root, fio, taskset, fincore, /dev/fuse and a memory cgroup (v1 or v2).

mod common;
use common::{median, tenantfs_bin};

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

const MIB: u64 = 1 << 20;
/// The cgroup's memory limit.
const LIMIT_MIB: u64 = 1024;
/// The fio tenant's working set (a file on the host disk, warm in the page cache).
const WS_MIB: u64 = 512;
/// The tenantfs tenant's data set: larger than the daemon's cache, larger than the limit.
const DATA_MIB: u64 = 1792;
/// The daemon's cache budget.
const CACHE: &str = "128M";
/// The load generator runs this long before the fio tenant starts.
const RAMP_SECS: u64 = 5;
const TENANT_CPU: &str = "0";
const DAEMON_CPU: &str = "1";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Baseline,
    CpuNeighbour,
    Buffered,
    Direct,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Baseline => "baseline (fio tenant alone)",
            Kind::CpuNeighbour => "CPU neighbour (busy loop, no I/O)",
            Kind::Buffered => "tenantfs buffered (direct_io=off)",
            Kind::Direct => "tenantfs O_DIRECT (direct_io=auto)",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Memory cgroup, v1 or v2.

#[derive(Clone, Copy, PartialEq, Debug)]
enum CgVersion {
    V1,
    V2,
}

struct Cgroup {
    version: CgVersion,
    dir: PathBuf,
}

impl Cgroup {
    fn create(limit: u64) -> Cgroup {
        let name = format!("tenantfs-interference-{}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2_controllers = v2_root.join("cgroup.controllers");
        let v2 = fs::read_to_string(&v2_controllers)
            .map(|s| s.split_whitespace().any(|c| c == "memory"))
            .unwrap_or(false);
        let (version, dir) = if v2 {
            // The memory controller must be enabled for the root's children.
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            (CgVersion::V2, v2_root.join(&name))
        } else {
            let v1 = Path::new("/sys/fs/cgroup/memory");
            assert!(
                v1.join("memory.limit_in_bytes").exists(),
                "no memory cgroup: neither v2 (/sys/fs/cgroup/cgroup.controllers with memory) \
                 nor v1 (/sys/fs/cgroup/memory)"
            );
            (CgVersion::V1, v1.join(&name))
        };
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cg = Cgroup { version, dir };
        match version {
            CgVersion::V1 => cg.write("memory.limit_in_bytes", &limit.to_string()),
            CgVersion::V2 => {
                cg.write("memory.max", &limit.to_string());
                let _ = fs::write(cg.dir.join("memory.swap.max"), "0");
            }
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        let p = self.dir.join(file);
        fs::write(&p, value).unwrap_or_else(|e| panic!("write {value} to {}: {e}", p.display()));
    }

    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    fn read_u64(&self, file: &str) -> u64 {
        self.read(file).trim().parse().unwrap_or(0)
    }

    fn stat(&self, key: &str) -> u64 {
        self.read("memory.stat")
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
            })
            .unwrap_or(0)
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Resets the peak counters, where the kernel allows it.
    fn reset_peak(&self) {
        match self.version {
            CgVersion::V1 => {
                let _ = fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
            }
            CgVersion::V2 => {
                let _ = fs::write(self.dir.join("memory.peak"), "0");
            }
        }
    }

    fn sample(&self) -> MemSample {
        match self.version {
            CgVersion::V1 => MemSample {
                usage: self.read_u64("memory.usage_in_bytes"),
                peak: self.read_u64("memory.max_usage_in_bytes"),
                cache: self.stat("total_cache"),
                rss: self.stat("total_rss"),
                limit_hits: self.read_u64("memory.failcnt"),
            },
            CgVersion::V2 => MemSample {
                usage: self.read_u64("memory.current"),
                peak: self.read_u64("memory.peak"),
                cache: self.stat("file"),
                rss: self.stat("anon"),
                limit_hits: self
                    .read("memory.events")
                    .lines()
                    .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
                    .unwrap_or(0),
            },
        }
    }

    fn remove(&self) {
        for _ in 0..50 {
            let pids: Vec<i32> = self
                .read("cgroup.procs")
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            // Only processes this harness started are in the cgroup it created.
            for pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            sleep(Duration::from_millis(100));
        }
        eprintln!("warning: could not remove cgroup {}", self.dir.display());
    }
}

#[derive(Clone, Copy, Default)]
struct MemSample {
    usage: u64,
    peak: u64,
    /// v1 total_cache, v2 file.
    cache: u64,
    /// v1 total_rss, v2 anon.
    rss: u64,
    /// v1 memory.failcnt, v2 memory.events "max" (cumulative; the runs report the delta
    /// from the warm working set to the end of the fio tenant).
    limit_hits: u64,
}

// ---------------------------------------------------------------------------------------
// Processes.

/// `prog args` inside the cgroup, pinned to `cpus`: the shell puts itself in the cgroup, then
/// execs taskset, which execs the program.
fn in_cgroup(cg: &Cgroup, cpus: &str, prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"p=$1; c=$2; shift 2; echo $$ > "$p" && exec taskset -c "$c" "$@""#)
        .arg("sh")
        .arg(cg.procs())
        .arg(cpus)
        .arg(prog)
        .args(args);
    c
}

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn is_mounted(mp: &Path) -> bool {
    let mp = mp.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&*mp))
}

/// Jiffies of one CPU from /proc/stat: (busy = user+nice+system+irq+softirq, steal, total).
#[derive(Clone, Copy)]
struct CpuTimes {
    busy: u64,
    steal: u64,
    total: u64,
}

impl CpuTimes {
    fn now(cpu: &str) -> CpuTimes {
        let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
        let name = format!("cpu{cpu}");
        let v: Vec<u64> = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&*name))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let f = |i: usize| v.get(i).copied().unwrap_or(0);
        CpuTimes {
            busy: f(0) + f(1) + f(2) + f(5) + f(6),
            steal: f(7),
            total: (0..8).map(f).sum(),
        }
    }

    /// (busy %, steal %) between `self` and the later sample `end`.
    fn pct_until(self, end: CpuTimes) -> (f64, f64) {
        let t = end.total.saturating_sub(self.total).max(1) as f64;
        (
            100.0 * end.busy.saturating_sub(self.busy) as f64 / t,
            100.0 * end.steal.saturating_sub(self.steal) as f64 / t,
        )
    }
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches (needs root)");
}

/// Bytes of `file` in the page cache.
fn resident(file: &Path) -> u64 {
    let out = run_ok(
        Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(file),
        "fincore",
    );
    out.trim().parse().unwrap_or(0)
}

fn fio_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // fio may print notes before the JSON object.
    let start = text.find('{').unwrap_or(0);
    serde_json::from_str(&text[start..])
        .unwrap_or_else(|e| panic!("fio json {}: {e}\n{text}", path.display()))
}

struct FioResult {
    iops: f64,
    /// usr + sys CPU of the job, % of wall time (about 100 when it had its CPU to itself).
    cpu_pct: f64,
    p50_us: f64,
    p99_us: f64,
}

fn fio_read_result(v: &Value) -> FioResult {
    let read = &v["jobs"][0]["read"];
    let pct = |p: &str| read["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    FioResult {
        iops: read["iops"].as_f64().unwrap_or(0.0),
        cpu_pct: v["jobs"][0]["usr_cpu"].as_f64().unwrap_or(0.0)
            + v["jobs"][0]["sys_cpu"].as_f64().unwrap_or(0.0),
        p50_us: pct("50.000000"),
        p99_us: pct("99.000000"),
    }
}

// ---------------------------------------------------------------------------------------
// The harness: owns everything it starts; Drop cleans up (also on panic).

struct Harness {
    bin: PathBuf,
    cg: Cgroup,
    data: PathBuf,
    cfg: PathBuf,
    mp: PathBuf,
    ws: PathBuf,
    work: PathBuf,
    daemon: Option<Child>,
    loadgen: Option<Child>,
    neighbour: Option<Child>,
    // Dropped last: the work dir.
    _tmp: tempfile::TempDir,
}

impl Harness {
    fn tenantfs(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.cfg)
            .args(args);
        c
    }

    fn write_config(&self, direct_io: &str) {
        fs::write(
            &self.cfg,
            format!(
                "[store]\nwrite_buffers = \"64M\"\ndirect_io = \"{direct_io}\"\n\n\
                 [cache]\nbudget = \"{CACHE}\"\n\n[pressure]\ngovernor = true\n"
            ),
        )
        .unwrap();
        run_ok(&mut self.tenantfs(&["config", "check"]), "config check");
    }

    /// Starts the daemon in the cgroup (CPU 1) and mounts tenant `t` through it.
    fn start_daemon(&mut self, direct_io: &str) {
        self.write_config(direct_io);
        let log = self.work.join(format!("daemon-{direct_io}.log"));
        let logf = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let data = self.data.to_string_lossy().into_owned();
        let cfg = self.cfg.to_string_lossy().into_owned();
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            &self.bin,
            &["--data-dir", &data, "--config", &cfg, "daemon"],
        )
        .env("TENANTFS_LOG", "info,tenantfs::store=debug")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("start daemon");
        self.daemon = Some(child);
        let start = Instant::now();
        loop {
            if let Some(st) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "daemon exited ({st}):\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let ok = self
                .tenantfs(&["stats"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "daemon not ready after 60 s"
            );
            sleep(Duration::from_millis(100));
        }
        let mp = self.mp.to_string_lossy().into_owned();
        run_ok(&mut self.tenantfs(&["mount", "t", &mp]), "mount");
        assert!(is_mounted(&self.mp), "{mp} not mounted");
    }

    /// What the daemon logged about the tenant store's I/O mode.
    fn store_direct_io(&self, direct_io: &str) -> String {
        let log = fs::read_to_string(self.work.join(format!("daemon-{direct_io}.log")))
            .unwrap_or_default();
        log.lines()
            .rev()
            .find(|l| l.contains("opened tenant store") && l.contains("tenant=t"))
            .or_else(|| {
                log.lines()
                    .rev()
                    .find(|l| l.contains("opened tenant store"))
            })
            .and_then(|l| {
                let i = l.find("direct_io=")?;
                Some(l[i..].split_whitespace().next()?.to_string())
            })
            .unwrap_or_else(|| "direct_io=? (not logged)".into())
    }

    /// The governor's decisions logged by the daemon since byte `from` of its log: counts and
    /// the first shrink's reason.
    fn governor_decisions(&self, direct_io: &str, from: u64) -> String {
        let log = fs::read(self.work.join(format!("daemon-{direct_io}.log"))).unwrap_or_default();
        let text = String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default());
        let shrinks: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("cache budget shrunk"))
            .collect();
        let grows = text
            .lines()
            .filter(|l| l.contains("cache budget grown"))
            .count();
        let first = shrinks
            .first()
            .and_then(|l| {
                Some(
                    l[l.find("reason=")?..]
                        .chars()
                        .take(200)
                        .collect::<String>(),
                )
            })
            .unwrap_or_default();
        format!(
            "governor: {} shrinks, {grows} grows{}{first}",
            shrinks.len(),
            if first.is_empty() { "" } else { "; first " }
        )
    }

    fn log_len(&self, direct_io: &str) -> u64 {
        fs::metadata(self.work.join(format!("daemon-{direct_io}.log"))).map_or(0, |m| m.len())
    }

    fn cache_budget(&self) -> String {
        let out = self.tenantfs(&["cache", "stats", "--json"]).output();
        let Ok(out) = out else { return "?".into() };
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Value = match serde_json::from_str(text.trim()) {
            Ok(v) => v,
            Err(_) => return "?".into(),
        };
        let mib = |k: &str| {
            v[k].as_u64()
                .map(|b| format!("{}", b / MIB))
                .unwrap_or_else(|| "?".into())
        };
        format!(
            "budget {} / ceiling {} MiB, used {} MiB, rss {} MiB",
            mib("budget_bytes"),
            mib("ceiling_bytes"),
            mib("used_bytes"),
            mib("process_rss_bytes")
        )
    }

    fn stop_daemon(&mut self) {
        if is_mounted(&self.mp) {
            let mp = self.mp.to_string_lossy().into_owned();
            let st = self
                .tenantfs(&["umount", &mp])
                .stdout(Stdio::null())
                .status();
            if !matches!(st, Ok(s) if s.success()) {
                eprintln!("warning: tenantfs umount {mp} failed");
            }
        }
        if let Some(mut child) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let start = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(st)) => {
                        if !st.success() {
                            eprintln!("warning: daemon exited with {st}");
                        }
                        break;
                    }
                    Ok(None) if start.elapsed() < Duration::from_secs(30) => {
                        sleep(Duration::from_millis(50))
                    }
                    _ => {
                        eprintln!("warning: daemon did not exit on SIGTERM; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if is_mounted(&self.mp) {
            eprintln!("warning: {} still mounted; umount -l", self.mp.display());
            let _ = Command::new("umount").arg("-l").arg(&self.mp).status();
        }
    }

    /// Warms the fio working set into the page cache from inside the cgroup, so its pages are
    /// charged there.
    fn warm_ws(&self) -> u64 {
        let ws = self.ws.to_string_lossy().into_owned();
        run_ok(
            &mut in_cgroup(
                &self.cg,
                TENANT_CPU,
                Path::new("dd"),
                &[&format!("if={ws}"), "of=/dev/null", "bs=1M"],
            ),
            "warm working set",
        );
        resident(&self.ws)
    }

    fn start_loadgen(&mut self, secs: u64, out: &Path) {
        let file = self.mp.join("data.bin").to_string_lossy().into_owned();
        let out = format!("--output={}", out.display());
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            Path::new("fio"),
            &[
                "--name=loadgen",
                &format!("--filename={file}"),
                "--rw=randread",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=8",
                "--direct=1",
                &format!("--size={DATA_MIB}M"),
                "--time_based",
                &format!("--runtime={secs}"),
                "--output-format=json",
                &out,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start load generator");
        self.loadgen = Some(child);
    }

    /// A busy loop on the daemon's CPU, in the cgroup: CPU use without memory or I/O.
    fn start_cpu_neighbour(&mut self) {
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            Path::new("sh"),
            &["-c", "while :; do :; done"],
        )
        .stdin(Stdio::null())
        .spawn()
        .expect("start busy loop");
        self.neighbour = Some(child);
    }

    fn stop_cpu_neighbour(&mut self) {
        if let Some(mut c) = self.neighbour.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn wait_loadgen(&mut self) {
        if let Some(mut c) = self.loadgen.take() {
            let st = c.wait().expect("wait load generator");
            assert!(st.success(), "load generator failed: {st}");
        }
    }

    fn fio_tenant(&self, secs: u64, out: &Path) -> FioResult {
        let ws = self.ws.to_string_lossy().into_owned();
        run_ok(
            &mut in_cgroup(
                &self.cg,
                TENANT_CPU,
                Path::new("fio"),
                &[
                    "--name=tenant",
                    &format!("--filename={ws}"),
                    "--rw=randread",
                    "--bs=4k",
                    "--ioengine=psync",
                    "--iodepth=1",
                    "--direct=0",
                    // Keep the warm page cache (fio drops the file's pages by default).
                    "--invalidate=0",
                    &format!("--size={WS_MIB}M"),
                    "--time_based",
                    &format!("--runtime={secs}"),
                    "--output-format=json",
                    &format!("--output={}", out.display()),
                ],
            ),
            "fio tenant",
        );
        fio_read_result(&fio_json(out))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(mut c) = self.loadgen.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stop_cpu_neighbour();
        self.stop_daemon();
        self.cg.remove();
    }
}

// ---------------------------------------------------------------------------------------

struct Row {
    rep: usize,
    kind: Kind,
    store_io: String,
    ws_warm: u64,
    tenant: FioResult,
    steal_pct: f64,
    /// How busy the daemon's CPU was while the fio tenant ran.
    other_cpu_busy_pct: f64,
    mem: MemSample,
    ws_end: u64,
    loadgen_iops: f64,
    cache: String,
}

fn write_ws(path: &Path, mib: u64) {
    let mut f = fs::File::create(path).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..mib {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&buf).unwrap();
    }
    f.sync_all().unwrap();
}

fn dir_bytes(dir: &Path) -> u64 {
    let out = Command::new("du").arg("-sb").arg(dir).output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: u64 = args
        .first()
        .map(|s| s.parse().expect("SECONDS"))
        .unwrap_or(10);
    let reps: usize = args
        .get(1)
        .map(|s| s.parse().expect("REPEATS"))
        .unwrap_or(5);
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    for tool in ["fio", "taskset", "fincore", "dd", "du"] {
        assert!(
            Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {tool}"))
                .stdout(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false),
            "{tool} not found"
        );
    }

    let bin = tenantfs_bin();
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-interference-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");
    let work = tmp.path().to_path_buf();
    let cg = Cgroup::create(LIMIT_MIB * MIB);
    let mut h = Harness {
        bin,
        cg,
        data: work.join("data"),
        cfg: work.join("tenantfs.toml"),
        mp: work.join("mnt"),
        ws: work.join("ws.dat"),
        work: work.clone(),
        daemon: None,
        loadgen: None,
        neighbour: None,
        _tmp: tmp,
    };
    fs::create_dir(&h.mp).unwrap();
    println!(
        "work dir {} · cgroup {:?} {} limit {} MiB · fio tenant ws {} MiB on CPU {} · tenant data \
         {} MiB, daemon cache {} + load generator on CPU {} · {} s per run (+{} s ramp), {} repeats",
        work.display(),
        h.cg.version,
        h.cg.dir.display(),
        LIMIT_MIB,
        WS_MIB,
        TENANT_CPU,
        DATA_MIB,
        CACHE,
        DAEMON_CPU,
        secs,
        RAMP_SECS,
        reps
    );

    // Set up once: data dir, tenant, working set, the tenant's data file (the store persists
    // across daemon restarts).
    h.write_config("auto");
    run_ok(&mut h.tenantfs(&["init"]), "init");
    run_ok(&mut h.tenantfs(&["tenant", "create", "t"]), "tenant create");
    let t = Instant::now();
    write_ws(&h.ws, WS_MIB);
    println!(
        "wrote {} MiB working set in {:.1} s",
        WS_MIB,
        t.elapsed().as_secs_f64()
    );
    h.start_daemon("auto");
    let t = Instant::now();
    let fill_out = work.join("fill.json");
    run_ok(
        Command::new("fio")
            .arg("--name=fill")
            .arg(format!("--filename={}", h.mp.join("data.bin").display()))
            .args([
                "--rw=write",
                "--bs=1M",
                "--ioengine=psync",
                "--direct=1",
                "--end_fsync=1",
                &format!("--size={DATA_MIB}M"),
                "--output-format=json",
            ])
            .arg(format!("--output={}", fill_out.display())),
        "fill tenant",
    );
    let tenant_dir = h.data.join("tenants").join("t");
    println!(
        "filled {} MiB through the mount in {:.1} s",
        DATA_MIB,
        t.elapsed().as_secs_f64()
    );
    // Let flushes and compactions settle: the store's size unchanged for 5 s.
    let t = Instant::now();
    let mut last = dir_bytes(&tenant_dir);
    let mut stable = Instant::now();
    while stable.elapsed() < Duration::from_secs(5) && t.elapsed() < Duration::from_secs(180) {
        sleep(Duration::from_secs(1));
        let now = dir_bytes(&tenant_dir);
        if now != last {
            last = now;
            stable = Instant::now();
        }
    }
    h.stop_daemon();
    println!(
        "store settled at {} MiB on disk after {:.0} s",
        dir_bytes(&tenant_dir) / MIB,
        t.elapsed().as_secs_f64()
    );

    let mut rows = Vec::new();
    for rep in 1..=reps {
        // Baseline first; the other three rotate so no kind always follows another.
        let mut others = [Kind::CpuNeighbour, Kind::Buffered, Kind::Direct];
        others.rotate_left((rep - 1) % 3);
        for kind in std::iter::once(Kind::Baseline).chain(others) {
            println!("rep {rep}: {} ...", kind.label());
            let mode = match kind {
                Kind::Baseline | Kind::CpuNeighbour => None,
                Kind::Buffered => Some("off"),
                Kind::Direct => Some("auto"),
            };
            let log_from = mode.map_or(0, |m| h.log_len(m));
            // Same start for every run: the daemon starts in an empty cgroup (not one still
            // full of the last buffered run's page cache, where its first allocations would
            // reclaim and its governor would shrink the cache at once), then empty page
            // cache again, then the working set warm and charged to the cgroup.
            if let Some(m) = mode {
                drop_caches();
                h.start_daemon(m);
            }
            drop_caches();
            h.cg.reset_peak();
            let ws_warm = h.warm_ws();
            let hits_before = h.cg.sample().limit_hits;
            let lg_out = work.join(format!("loadgen-{rep}-{kind:?}.json"));
            if mode.is_some() {
                h.start_loadgen(RAMP_SECS + secs + 2, &lg_out);
                sleep(Duration::from_secs(RAMP_SECS));
            } else if kind == Kind::CpuNeighbour {
                h.start_cpu_neighbour();
                sleep(Duration::from_secs(1));
            }
            let (c0, c1) = (CpuTimes::now(TENANT_CPU), CpuTimes::now(DAEMON_CPU));
            let tenant = h.fio_tenant(secs, &work.join(format!("tenant-{rep}-{kind:?}.json")));
            let (_, steal_pct) = c0.pct_until(CpuTimes::now(TENANT_CPU));
            let (other_cpu_busy_pct, _) = c1.pct_until(CpuTimes::now(DAEMON_CPU));
            h.stop_cpu_neighbour();
            let mut mem = h.cg.sample();
            mem.limit_hits -= hits_before.min(mem.limit_hits);
            let ws_end = resident(&h.ws);
            let (store_io, cache, loadgen_iops) = match mode {
                Some(m) => {
                    let cache = format!(
                        "{}; {}",
                        h.cache_budget(),
                        h.governor_decisions(m, log_from)
                    );
                    h.wait_loadgen();
                    let lg = fio_read_result(&fio_json(&lg_out));
                    (h.store_direct_io(m), cache, lg.iops)
                }
                None => ("-".into(), "-".into(), 0.0),
            };
            if mode.is_some() {
                h.stop_daemon();
            }
            println!(
                "  fio tenant {:.0} IOPS, p50 {:.1} us, p99 {:.1} us, cpu {:.0}% (steal {:.1}%), \
                 CPU {DAEMON_CPU} busy {:.0}%; ws resident {} -> {} MiB; \
                 cgroup usage {} MiB (peak {}), cache {} MiB, rss {} MiB, limit hits {}; \
                 load generator {:.0} IOPS; {}; {}",
                tenant.iops,
                tenant.p50_us,
                tenant.p99_us,
                tenant.cpu_pct,
                steal_pct,
                other_cpu_busy_pct,
                ws_warm / MIB,
                ws_end / MIB,
                mem.usage / MIB,
                mem.peak / MIB,
                mem.cache / MIB,
                mem.rss / MIB,
                mem.limit_hits,
                loadgen_iops,
                store_io,
                cache
            );
            rows.push(Row {
                rep,
                kind,
                store_io,
                ws_warm,
                tenant,
                steal_pct,
                other_cpu_busy_pct,
                mem,
                ws_end,
                loadgen_iops,
                cache,
            });
        }
    }

    let iops_of = |rep: usize, kind: Kind| {
        rows.iter()
            .find(|b| b.rep == rep && b.kind == kind)
            .map(|b| b.tenant.iops)
            .expect("every repetition runs every kind")
    };
    // % IOPS lost by `r` against the run of kind `reference` in the same repetition.
    let drop_vs =
        |r: &Row, reference: Kind| (1.0 - r.tenant.iops / iops_of(r.rep, reference)) * 100.0;

    println!();
    println!(
        "| rep | run | store I/O | fio tenant IOPS | p50 us | p99 us | IOPS drop vs baseline | \
         drop vs CPU neighbour | p99 vs baseline | fio CPU % (CPU {TENANT_CPU} steal %) | CPU {DAEMON_CPU} busy % | \
         ws in page cache start -> end MiB | cgroup usage / peak MiB | cache / rss MiB | limit hits | \
         load generator IOPS |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.rep == r.rep && b.kind == Kind::Baseline)
            .expect("baseline");
        let vs_cpu = match r.kind {
            Kind::Baseline | Kind::CpuNeighbour => "-".to_string(),
            _ => format!("{:.1}%", drop_vs(r, Kind::CpuNeighbour)),
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {:.2}x | {:.0} ({:.1}) | {:.0} | {} -> {} | {} / {} | {} / {} | {} | {} |",
            r.rep,
            r.kind.label(),
            r.store_io,
            r.tenant.iops,
            r.tenant.p50_us,
            r.tenant.p99_us,
            if r.kind == Kind::Baseline {
                "-".to_string()
            } else {
                format!("{:.1}%", drop_vs(r, Kind::Baseline))
            },
            vs_cpu,
            r.tenant.p99_us / base.tenant.p99_us,
            r.tenant.cpu_pct,
            r.steal_pct,
            r.other_cpu_busy_pct,
            r.ws_warm / MIB,
            r.ws_end / MIB,
            r.mem.usage / MIB,
            r.mem.peak / MIB,
            r.mem.cache / MIB,
            r.mem.rss / MIB,
            r.mem.limit_hits,
            if r.loadgen_iops > 0.0 {
                format!("{:.0}", r.loadgen_iops)
            } else {
                "-".to_string()
            },
        );
    }

    println!();
    println!("Medians over {reps} repetitions:");
    println!();
    println!(
        "| run | fio tenant IOPS | IOPS drop vs baseline | drop vs CPU neighbour | p99 us | \
         CPU {DAEMON_CPU} busy % | limit hits |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for kind in [
        Kind::Baseline,
        Kind::CpuNeighbour,
        Kind::Buffered,
        Kind::Direct,
    ] {
        let of: Vec<&Row> = rows.iter().filter(|r| r.kind == kind).collect();
        let med = |f: &dyn Fn(&Row) -> f64| median(of.iter().map(|r| f(r)).collect());
        let pct = |f: &dyn Fn(&Row) -> f64| format!("{:.1}%", med(f));
        println!(
            "| {} | {:.0} | {} | {} | {:.1} | {:.0} | {:.0} |",
            kind.label(),
            med(&|r| r.tenant.iops),
            if kind == Kind::Baseline {
                "-".into()
            } else {
                pct(&|r| drop_vs(r, Kind::Baseline))
            },
            if matches!(kind, Kind::Baseline | Kind::CpuNeighbour) {
                "-".into()
            } else {
                pct(&|r| drop_vs(r, Kind::CpuNeighbour))
            },
            med(&|r| r.tenant.p99_us),
            med(&|r| r.other_cpu_busy_pct),
            med(&|r| r.mem.limit_hits as f64),
        );
    }
    println!();
    for r in rows.iter().filter(|r| r.loadgen_iops > 0.0) {
        println!(
            "rep {} {}: daemon cache at end of run: {}",
            r.rep,
            r.kind.label(),
            r.cache
        );
    }
}
