//! Pack I/O engines side by side: `PreadIo` (pread/pwrite) and `UringIo` (io_uring on a
//! dedicated thread), on real pack files opened with O_DIRECT, so every read reaches the device.
//!
//! Three paths, each run by both engines in every round (the order alternates between rounds):
//! - import: 1 MiB aligned slot writes appended to a new pack, fsync at the end: MB/s;
//! - miss: single random 4 KiB slot reads from a 1 GiB pack: p50/p99 latency;
//! - prefetch: `read_slots` of 32 consecutive 4 KiB slots at random places: blocks/s and
//!   per-batch p50 (plus, for reference, the same 128 KiB as one pread into one buffer).
//!
//! ```sh
//! cargo run --release --example bench_pack_io -- [--dir /var/tmp] [--rounds 3]
//!     [--import-mib 512] [--misses 4000] [--batches 600]
//! ```

mod common;
use common::median;

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use tenantfs::base::{Pack, PackIo, PreadIo, UringIo};
use tenantfs::cache::{SlabAllocator, SlabBox};

const BS: u32 = 4096;
const READ_PACK_SLOTS: u32 = 1 << 18; // 1 GiB of 4 KiB slots
const CHUNK: usize = 1 << 20;
const BATCH: u32 = 32;

struct Args {
    dir: String,
    rounds: usize,
    import_mib: usize,
    misses: usize,
    batches: usize,
}

fn args() -> Args {
    let mut a = Args {
        dir: "/var/tmp".into(),
        rounds: 3,
        import_mib: 512,
        misses: 4000,
        batches: 600,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--dir" => a.dir = v,
            "--rounds" => a.rounds = v.parse().expect("--rounds N"),
            "--import-mib" => a.import_mib = v.parse().expect("--import-mib N"),
            "--misses" => a.misses = v.parse().expect("--misses N"),
            "--batches" => a.batches = v.parse().expect("--batches N"),
            _ => panic!("unknown option {k}"),
        }
    }
    a
}

/// xorshift64*: reproducible offsets without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() % n as u64) as u32
    }
}

fn buf(slabs: &SlabAllocator, len: usize) -> SlabBox {
    slabs.alloc(len).expect("aligned buffer")
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// (a) import: `mib` 1 MiB writes appended to a new pack, then fsync. MB/s.
fn import(io: &dyn PackIo, dir: &Path, id: u32, mib: usize, slabs: &SlabAllocator) -> f64 {
    let pack = Pack::create(dir, id, BS, slabs).expect("create pack");
    let mut data = buf(slabs, CHUNK);
    let mut rng = Rng(id as u64 * 7919 + 1);
    for w in data.chunks_mut(8) {
        w.copy_from_slice(&rng.next().to_le_bytes());
    }
    let per = (CHUNK / BS as usize) as u32;
    let t = Instant::now();
    for i in 0..mib as u32 {
        pack.write_slots(io, i * per, &data).expect("write");
    }
    pack.sync().expect("fsync");
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_file(pack.path()).expect("remove import pack");
    (mib * CHUNK) as f64 / 1e6 / secs
}

/// (b) single misses: one random slot per read. (p50, p99) in µs.
fn misses(io: &dyn PackIo, pack: &Pack, n: usize, seed: u64, slabs: &SlabAllocator) -> (f64, f64) {
    let mut b = buf(slabs, BS as usize);
    let mut rng = Rng(seed);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let slot = rng.below(READ_PACK_SLOTS);
        let t = Instant::now();
        pack.read_slot(io, slot, &mut b).expect("read");
        if i >= 100 {
            lat.push(t.elapsed());
        }
    }
    (us(pct(&mut lat, 0.5)), us(pct(&mut lat, 0.99)))
}

/// (c) prefetch: `BATCH` consecutive slots per `read_slots`. (blocks/s, per-batch p50 µs).
fn prefetch(
    io: &dyn PackIo,
    pack: &Pack,
    n: usize,
    seed: u64,
    slabs: &SlabAllocator,
) -> (f64, f64) {
    let mut bufs: Vec<SlabBox> = (0..BATCH).map(|_| buf(slabs, BS as usize)).collect();
    let mut rng = Rng(seed);
    let mut lat = Vec::with_capacity(n);
    let mut total = Duration::ZERO;
    for i in 0..n + 20 {
        let first = rng.below(READ_PACK_SLOTS - BATCH);
        let mut reads: Vec<(u32, &mut [u8])> = bufs
            .iter_mut()
            .zip(first..)
            .map(|(b, s)| (s, &mut b[..]))
            .collect();
        let t = Instant::now();
        pack.read_slots(io, &mut reads).expect("read_slots");
        let d = t.elapsed();
        if i >= 20 {
            lat.push(d);
            total += d;
        }
    }
    let blocks = (n as u32 * BATCH) as f64 / total.as_secs_f64();
    (blocks, us(pct(&mut lat, 0.5)))
}

/// Reference for (c): the same 32 slots as one 128 KiB pread into one buffer.
fn prefetch_one_read(pack: &Pack, n: usize, seed: u64, slabs: &SlabAllocator) -> (f64, f64) {
    let mut b = buf(slabs, (BATCH * BS) as usize);
    let mut rng = Rng(seed);
    let mut lat = Vec::with_capacity(n);
    let mut total = Duration::ZERO;
    for i in 0..n + 20 {
        let first = rng.below(READ_PACK_SLOTS - BATCH);
        let t = Instant::now();
        // write_slots' offset rule: header + slot * block size; read it as one span.
        pack.read_slot(&PreadIo, first, &mut b[..])
            .expect("read 128 KiB");
        let d = t.elapsed();
        if i >= 20 {
            lat.push(d);
            total += d;
        }
    }
    let blocks = (n as u32 * BATCH) as f64 / total.as_secs_f64();
    (blocks, us(pct(&mut lat, 0.5)))
}

#[derive(Default)]
struct Samples {
    import_mbs: Vec<f64>,
    miss_p50: Vec<f64>,
    miss_p99: Vec<f64>,
    pf_blocks: Vec<f64>,
    pf_p50: Vec<f64>,
}

fn main() {
    let a = args();
    let tmp = tempfile::tempdir_in(&a.dir).expect("temp dir");
    let dir = tmp.path();
    let slabs = SlabAllocator::new();

    let probe = dir.join("o_direct_probe");
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    println!(
        "dir {} (O_DIRECT {})",
        dir.display(),
        if direct { "yes" } else { "NO: buffered" }
    );

    let uring = UringIo::new().expect("io_uring unavailable");
    let engines: [(&str, &dyn PackIo); 2] = [("pread", &PreadIo), ("uring", &uring)];

    // The read pack: 1 GiB of slots. O_DIRECT bypasses the page cache, so every read goes to
    // the device whatever the pack's size; random places keep device-side caches cold.
    let t = Instant::now();
    let read_pack = Pack::create(dir, 1, BS, &slabs).expect("create read pack");
    {
        let mut data = buf(&slabs, CHUNK);
        let mut rng = Rng(42);
        for w in data.chunks_mut(8) {
            w.copy_from_slice(&rng.next().to_le_bytes());
        }
        let per = (CHUNK / BS as usize) as u32;
        for i in 0..READ_PACK_SLOTS / per {
            read_pack
                .write_slots(&PreadIo, i * per, &data)
                .expect("fill");
        }
        read_pack.sync().expect("fsync");
    }
    println!(
        "read pack: {} slots of {BS} B written in {:.1} s",
        READ_PACK_SLOTS,
        t.elapsed().as_secs_f64()
    );

    let mut s: [Samples; 2] = Default::default();
    let mut one_read = Vec::new();
    for round in 0..a.rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let seed = |e: usize, k: u64| (round as u64 * 1000 + e as u64 * 100 + k) | 1;
        for &e in &order {
            let (name, io) = engines[e];
            let mbs = import(io, dir, 100 + (round * 2 + e) as u32, a.import_mib, &slabs);
            println!("round {round} {name:5} import   {mbs:8.1} MB/s");
            s[e].import_mbs.push(mbs);
        }
        for &e in &order {
            let (name, io) = engines[e];
            let (p50, p99) = misses(io, &read_pack, a.misses, seed(e, 1), &slabs);
            println!("round {round} {name:5} miss     p50 {p50:7.1} us  p99 {p99:7.1} us");
            s[e].miss_p50.push(p50);
            s[e].miss_p99.push(p99);
        }
        for &e in &order {
            let (name, io) = engines[e];
            let (blocks, p50) = prefetch(io, &read_pack, a.batches, seed(e, 2), &slabs);
            println!(
                "round {round} {name:5} prefetch {blocks:8.0} blocks/s  batch p50 {p50:7.1} us"
            );
            s[e].pf_blocks.push(blocks);
            s[e].pf_p50.push(p50);
        }
        let r = prefetch_one_read(&read_pack, a.batches, seed(2, 3), &slabs);
        println!(
            "round {round} pread 1x128K    {:8.0} blocks/s  batch p50 {:7.1} us",
            r.0, r.1
        );
        one_read.push(r);
    }
    drop(uring);

    let m = |v: &Vec<f64>| median(v.clone());
    type Get = fn(&Samples) -> &Vec<f64>;
    let rows: [(&str, Get, &str); 5] = [
        (
            "import 1 MiB writes + fsync (MB/s)",
            |s| &s.import_mbs,
            "higher",
        ),
        ("single 4 KiB miss p50 (us)", |s| &s.miss_p50, "lower"),
        ("single 4 KiB miss p99 (us)", |s| &s.miss_p99, "lower"),
        ("prefetch 32x4 KiB (blocks/s)", |s| &s.pf_blocks, "higher"),
        ("prefetch 32x4 KiB batch p50 (us)", |s| &s.pf_p50, "lower"),
    ];
    println!();
    println!(
        "median of {} rounds, block size {BS}, import {} MiB per engine per round",
        a.rounds, a.import_mib
    );
    println!(
        "| {:<36} | {:>10} | {:>10} | {:>11} | better |",
        "path (metric)", "pread", "uring", "uring/pread"
    );
    println!("|{:-<38}|{:-<12}|{:-<12}|{:-<13}|--------|", "", "", "", "");
    for (label, get, better) in rows {
        let (p, u) = (m(get(&s[0])), m(get(&s[1])));
        println!(
            "| {label:<36} | {p:>10.1} | {u:>10.1} | {:>11.2} | {better} |",
            u / p
        );
    }
    let ob = median(one_read.iter().map(|r| r.0).collect());
    let ol = median(one_read.iter().map(|r| r.1).collect());
    println!(
        "reference: the 32 slots as one 128 KiB pread: {ob:.0} blocks/s, batch p50 {ol:.1} us"
    );
}
