//! Shared pieces of the store benchmarks: building a data set, timing reads, percentiles.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tenantfs::store::{Encryption, Family, OpenMode, StoreHost, TenantDb};

pub mod daemon;

/// Deterministic key of record `i`.
pub fn key(i: u64) -> [u8; 8] {
    // Spread keys so neighbours in `i` are not neighbours on disk.
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_be_bytes()
}

/// A value that compresses about 2:1 with LZ4, like typical file data.
pub fn value(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..len)
        .map(|j| {
            if j % 2 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            } else {
                b'a'
            }
        })
        .collect()
}

/// Small fast PRNG for picking keys.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub fn open(host: &StoreHost, path: &Path, encryption: Encryption, mode: OpenMode) -> TenantDb {
    TenantDb::open(host, "bench", path, encryption, mode).expect("open store")
}

/// Writes `n` records of `len` bytes, then flushes and compacts.
pub fn fill(db: &TenantDb, n: u64, len: usize) {
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        let mut batch = db.batch();
        for j in i..(i + 1000).min(n) {
            batch.put(Family::Extents, &key(j), &value(j, len));
        }
        db.write(batch).unwrap();
        i += 1000;
    }
    db.flush().unwrap();
    db.compact().unwrap();
    eprintln!(
        "  filled {n} x {len} B in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

pub struct Latencies {
    pub ops: u64,
    pub secs: f64,
    pub ns: Vec<u64>,
}

impl Latencies {
    pub fn qps(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    pub fn pct(&mut self, p: f64) -> f64 {
        if self.ns.is_empty() {
            return 0.0;
        }
        self.ns.sort_unstable();
        let idx = ((self.ns.len() - 1) as f64 * p).round() as usize;
        self.ns[idx] as f64 / 1000.0
    }
    pub fn max(&self) -> f64 {
        self.ns.iter().copied().max().unwrap_or(0) as f64 / 1000.0
    }
}

/// Runs `op` repeatedly for `dur`, timing every call.
pub fn timed(dur: Duration, mut op: impl FnMut()) -> Latencies {
    let start = Instant::now();
    let mut ns = Vec::with_capacity(1 << 20);
    while start.elapsed() < dur {
        for _ in 0..64 {
            let t = Instant::now();
            op();
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    Latencies {
        ops: ns.len() as u64,
        secs: start.elapsed().as_secs_f64(),
        ns,
    }
}

/// The `tenantfs` binary next to the running example (target/<profile>/examples/X ->
/// target/<profile>/tenantfs), or `$TENANTFS_BIN` (an A/B against another build).
pub fn tenantfs_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("TENANTFS_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("examples live in target/<profile>/examples")
        .join("tenantfs");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --release --bins --examples` first",
        bin.display()
    );
    bin
}

/// Runs a fio job with `--output-format=json` given; panics with fio's stderr when it
/// fails. The job's numbers for the direction it moved data in (its "write" side if it
/// wrote, else "read").
pub fn fio_side(cmd: &mut std::process::Command, name: &str) -> serde_json::Value {
    let out = cmd.output().expect("fio runs");
    assert!(
        out.status.success(),
        "fio {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).unwrap();
    let job = &json["jobs"][0];
    if job["write"]["io_bytes"].as_u64().unwrap_or(0) > 0 {
        job["write"].clone()
    } else {
        job["read"].clone()
    }
}

/// The median of `v` (the mean of the middle two for an even count; NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Bytes on disk (`st_blocks`) of the files under `dir`: (those with one link: not shared
/// with another directory, all of them).
pub fn own_and_all(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut own, mut all) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            let (o, a) = own_and_all(&e.path());
            own += o;
            all += a;
            continue;
        }
        all += m.blocks() * 512;
        if m.nlink() == 1 {
            own += m.blocks() * 512;
        }
    }
    (own, all)
}
