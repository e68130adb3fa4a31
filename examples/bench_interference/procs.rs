//! Processes of a run: commands in the cgroup pinned to a CPU, CPU times, the page cache,
//! fio and its results.

use super::*;

/// `prog args` inside the cgroup, pinned to `cpus`: the shell puts itself in the cgroup, then
/// execs taskset, which execs the program.
pub(super) fn in_cgroup(cg: &Cgroup, cpus: &str, prog: &Path, args: &[&str]) -> Command {
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

pub(super) fn run_ok(cmd: &mut Command, what: &str) -> String {
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

pub(super) fn is_mounted(mp: &Path) -> bool {
    let mp = mp.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&*mp))
}

/// Jiffies of one CPU from /proc/stat: (busy = user+nice+system+irq+softirq, steal, total).
#[derive(Clone, Copy)]
pub(super) struct CpuTimes {
    pub(super) busy: u64,
    pub(super) steal: u64,
    pub(super) total: u64,
}

impl CpuTimes {
    pub(super) fn now(cpu: &str) -> CpuTimes {
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
    pub(super) fn pct_until(self, end: CpuTimes) -> (f64, f64) {
        let t = end.total.saturating_sub(self.total).max(1) as f64;
        (
            100.0 * end.busy.saturating_sub(self.busy) as f64 / t,
            100.0 * end.steal.saturating_sub(self.steal) as f64 / t,
        )
    }
}

pub(super) fn drop_caches() {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches (needs root)");
}

/// Bytes of `file` in the page cache.
pub(super) fn resident(file: &Path) -> u64 {
    let out = run_ok(
        Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(file),
        "fincore",
    );
    out.trim().parse().unwrap_or(0)
}

pub(super) fn fio_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // fio may print notes before the JSON object.
    let start = text.find('{').unwrap_or(0);
    serde_json::from_str(&text[start..])
        .unwrap_or_else(|e| panic!("fio json {}: {e}\n{text}", path.display()))
}

pub(super) struct FioResult {
    pub(super) iops: f64,
    /// usr + sys CPU of the job, % of wall time (about 100 when it had its CPU to itself).
    pub(super) cpu_pct: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
}

pub(super) fn fio_read_result(v: &Value) -> FioResult {
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

/// The memcpy control's body (`bench_interference memcpy BYTES BUSY_PCT`): holds `bytes`
/// (every page touched) and copies 1 MiB at a time from one half to the other, busy for
/// `busy_pct` of every 10 ms period, doing no I/O. Never returns; the harness kills it.
pub(super) fn memcpy_control(bytes: u64, busy_pct: f64) -> ! {
    const CHUNK: usize = 1 << 20;
    let size = (bytes as usize).max(4 * CHUNK);
    let busy = busy_pct.clamp(0.0, 100.0) / 100.0;
    let period = Duration::from_millis(10);
    let mut buf = vec![0u8; size];
    for page in buf.chunks_mut(4096) {
        page[0] = 1;
    }
    let half = size / 2;
    let mut off = 0usize;
    loop {
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < period.as_secs_f64() * busy {
            let a = off % (half - CHUNK);
            buf.copy_within(a..a + CHUNK, half + a);
            std::hint::black_box(&mut buf);
            off += CHUNK;
        }
        if let Some(rest) = period.checked_sub(t0.elapsed()) {
            sleep(rest);
        }
    }
}
