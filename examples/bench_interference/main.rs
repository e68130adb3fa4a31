//! Tenant interference: a fio "tenant" doing buffered 4k random reads over a page-cache-warm
//! working set on the host disk, beside a busy tenantfs daemon, both in ONE memory-capped
//! cgroup (v1 or v2). Four runs per repetition:
//!   1. baseline: the fio tenant alone in the cgroup (daemon stopped);
//!   2. CPU neighbour: a busy loop on the other CPU, in the cgroup, touching no memory and
//!      doing no I/O: what any busy neighbour costs the fio tenant on this machine;
//!   3. memcpy control: a process on the other CPU, in the cgroup, as busy as that CPU is
//!      under the O_DIRECT daemon and its load generator and holding the daemon's resident
//!      memory, copying within it, doing no I/O (the daemon's RSS and its CPU's busy share
//!      are measured in a calibration run first): what a neighbour as busy and as big as the
//!      daemon costs without doing I/O;
//!   4. buffered: the daemon with `[store] direct_io = "off"` serving a tenant whose data set
//!      is larger than its cache, under a random-read load generator;
//!   5. O_DIRECT: the same with `direct_io = "auto"`. Its drop beyond the memcpy control is
//!      the part tenantfs is responsible for (target: at most 2%, pooled median).
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
//! With IO_MAX (cgroup v2 only, for example `riops=2000`), the cgroup's `io.max` on the disk
//! of the work dir is set to it: the daemon's disk I/O, which the fio tenant's page-cache hits
//! do not do, is what it limits. Each run reports the cgroup's disk reads (v2's `io.stat`).
//!
//! usage: cargo build --release --bins --examples
//!        cargo run --release --example bench_interference [-- SECONDS REPEATS [IO_MAX]]
//!        cargo run --release --example bench_interference -- vm [SECONDS REPEATS [IO_MAX]]
//! The first needs root, fio, taskset, fincore, /dev/fuse and a memory cgroup (v1 or v2); the
//! second runs the first under cgroup v2 in the VM harness (`vm.rs`), which `make test` sets up.

mod cgroup;
#[path = "../common/mod.rs"]
mod common;
mod harness;
mod procs;
mod vm;

use cgroup::*;
use common::{median, tenantfs_bin};
use harness::*;
use procs::*;

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
    Memcpy,
    Buffered,
    Direct,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Baseline => "baseline (fio tenant alone)",
            Kind::CpuNeighbour => "CPU neighbour (busy loop, no I/O)",
            Kind::Memcpy => "memcpy control (daemon's RSS and CPU, no I/O)",
            Kind::Buffered => "tenantfs buffered (direct_io=off)",
            Kind::Direct => "tenantfs O_DIRECT (direct_io=auto)",
        }
    }
}

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
    /// Disk reads the cgroup sent during the fio tenant's run (v2 only).
    disk_reads: u64,
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
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("memcpy") {
        let arg = |i: usize, what: &str| -> f64 {
            args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
                panic!("usage: bench_interference memcpy BYTES BUSY_PCT ({what})")
            })
        };
        memcpy_control(arg(1, "BYTES") as u64, arg(2, "BUSY_PCT"));
    }
    let in_vm = args.first().map(String::as_str) == Some("vm");
    if in_vm {
        args.remove(0);
    }
    let secs: u64 = args
        .first()
        .map(|s| s.parse().expect("SECONDS"))
        .unwrap_or(10);
    let reps: usize = args
        .get(1)
        .map(|s| s.parse().expect("REPEATS"))
        .unwrap_or(5);
    let io_max = args.get(2).map(String::as_str);
    if in_vm {
        vm::run(secs, reps, io_max);
        return;
    }
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
    if let Some(limit) = io_max {
        println!("io.max: {}", h.cg.limit_io(&work, limit));
    }
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

    // Calibration for the memcpy control: the O_DIRECT daemon under the load generator, its
    // resident memory and its CPU's busy share while it serves.
    let (daemon_rss, daemon_cpu_pct) = {
        drop_caches();
        h.start_daemon("auto");
        let lg_out = work.join("loadgen-calibration.json");
        h.start_loadgen(RAMP_SECS + secs, &lg_out);
        sleep(Duration::from_secs(RAMP_SECS));
        let c1 = CpuTimes::now(DAEMON_CPU);
        sleep(Duration::from_secs(secs));
        let (busy, _) = c1.pct_until(CpuTimes::now(DAEMON_CPU));
        let rss = h.daemon_rss();
        h.wait_loadgen();
        h.stop_daemon();
        (rss, busy)
    };
    println!(
        "calibration: the O_DIRECT daemon held {} MiB resident; CPU {DAEMON_CPU} was {:.0}% busy",
        daemon_rss / MIB,
        daemon_cpu_pct
    );

    let mut rows = Vec::new();
    for rep in 1..=reps {
        // Baseline first; the others rotate so no kind always follows another.
        let mut others = [
            Kind::CpuNeighbour,
            Kind::Memcpy,
            Kind::Buffered,
            Kind::Direct,
        ];
        let n = others.len();
        others.rotate_left((rep - 1) % n);
        for kind in std::iter::once(Kind::Baseline).chain(others) {
            println!("rep {rep}: {} ...", kind.label());
            let mode = match kind {
                Kind::Baseline | Kind::CpuNeighbour | Kind::Memcpy => None,
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
            let reads_before = h.cg.disk_reads();
            let lg_out = work.join(format!("loadgen-{rep}-{kind:?}.json"));
            if mode.is_some() {
                h.start_loadgen(RAMP_SECS + secs + 2, &lg_out);
                sleep(Duration::from_secs(RAMP_SECS));
            } else if kind == Kind::CpuNeighbour {
                h.start_cpu_neighbour();
                sleep(Duration::from_secs(1));
            } else if kind == Kind::Memcpy {
                h.start_memcpy_neighbour(daemon_rss, daemon_cpu_pct);
                // Its buffer allocated and touched first.
                sleep(Duration::from_secs(3));
            }
            let (c0, c1) = (CpuTimes::now(TENANT_CPU), CpuTimes::now(DAEMON_CPU));
            let tenant = h.fio_tenant(secs, &work.join(format!("tenant-{rep}-{kind:?}.json")));
            let (_, steal_pct) = c0.pct_until(CpuTimes::now(TENANT_CPU));
            let (other_cpu_busy_pct, _) = c1.pct_until(CpuTimes::now(DAEMON_CPU));
            let disk_reads = h.cg.disk_reads() - reads_before;
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
                 load generator {:.0} IOPS, cgroup disk reads {}; {}; {}",
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
                disk_reads,
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
                disk_reads,
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
         drop vs CPU neighbour | drop vs memcpy control | p99 vs baseline | fio CPU % (CPU {TENANT_CPU} steal %) | CPU {DAEMON_CPU} busy % | \
         ws in page cache start -> end MiB | cgroup usage / peak MiB | cache / rss MiB | limit hits | \
         load generator IOPS |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.rep == r.rep && b.kind == Kind::Baseline)
            .expect("baseline");
        let vs_cpu = match r.kind {
            Kind::Baseline | Kind::CpuNeighbour => "-".to_string(),
            _ => format!("{:.1}%", drop_vs(r, Kind::CpuNeighbour)),
        };
        let vs_memcpy = match r.kind {
            Kind::Buffered | Kind::Direct => format!("{:.1}%", drop_vs(r, Kind::Memcpy)),
            _ => "-".to_string(),
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {:.2}x | {:.0} ({:.1}) | {:.0} | {} -> {} | {} / {} | {} / {} | {} | {} |",
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
            vs_memcpy,
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
        "| run | fio tenant IOPS | IOPS drop vs baseline | drop vs CPU neighbour | drop vs memcpy \
         control | p99 us | CPU {DAEMON_CPU} busy % | limit hits | cgroup disk reads |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for kind in [
        Kind::Baseline,
        Kind::CpuNeighbour,
        Kind::Memcpy,
        Kind::Buffered,
        Kind::Direct,
    ] {
        let of: Vec<&Row> = rows.iter().filter(|r| r.kind == kind).collect();
        let med = |f: &dyn Fn(&Row) -> f64| median(of.iter().map(|r| f(r)).collect());
        let pct = |f: &dyn Fn(&Row) -> f64| format!("{:.1}%", med(f));
        println!(
            "| {} | {:.0} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} |",
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
            if matches!(kind, Kind::Buffered | Kind::Direct) {
                pct(&|r| drop_vs(r, Kind::Memcpy))
            } else {
                "-".into()
            },
            med(&|r| r.tenant.p99_us),
            med(&|r| r.other_cpu_busy_pct),
            med(&|r| r.mem.limit_hits as f64),
            med(&|r| r.disk_reads as f64),
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
