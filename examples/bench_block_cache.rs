//! The host block cache (slab-backed values) against foyer's in-memory cache holding Vec<u8>
//! (malloc-backed values), same eviction (S3-FIFO), same shards, in one run:
//!   1. hit latency: get + drop of the handle, p50/p99 per operation, timer cost subtracted;
//!   2. memory given back: fill 512 MiB, empty the cache, how far RSS falls;
//!   3. minor page faults per inserted block.
//!
//! usage: cargo run --release --example bench_block_cache [-- HIT_OPS]

use std::hint::black_box;
use std::time::Instant;

use foyer::{Cache, CacheBuilder, S3FifoConfig};
use nix::sys::resource::{getrusage, UsageWho};
use tenantfs::cache::{BlockCache, BlockHash};

const BLOCK: usize = 4096;

fn rss() -> i64 {
    tenantfs::cache::process_rss_bytes().unwrap() as i64
}

fn minor_faults() -> i64 {
    getrusage(UsageWho::RUSAGE_SELF)
        .unwrap()
        .minor_page_faults()
}

fn key(i: u64) -> BlockHash {
    *blake3::hash(&i.to_le_bytes()).as_bytes()
}

fn percentiles(mut ns: Vec<u64>, timer: u64) -> (f64, f64) {
    ns.sort_unstable();
    let at = |p: f64| ns[((ns.len() - 1) as f64 * p) as usize].saturating_sub(timer) as f64;
    (at(0.5), at(0.99))
}

/// Ops per timing sample: one get is near the clock's resolution, so each sample times a
/// batch and reports its mean per op (p99 is then over batch means).
const BATCH: usize = 32;

/// Per-op latency of `op` (batch means) over `ops` calls on keys spread below `n`.
fn time_hits(ops: usize, n: u64, mut op: impl FnMut(&BlockHash)) -> Vec<u64> {
    let keys: Vec<BlockHash> = (0..4096u64).map(|i| key(i * 7919 % n)).collect();
    let mut out = Vec::with_capacity(ops / BATCH);
    for i in 0..ops / BATCH {
        let t = Instant::now();
        for j in 0..BATCH {
            op(&keys[(i * BATCH + j) % keys.len()]);
        }
        out.push(t.elapsed().as_nanos() as u64 / BATCH as u64);
    }
    out
}

fn foyer_cache(budget: usize) -> Cache<BlockHash, Vec<u8>> {
    CacheBuilder::new(budget)
        .with_shards(8)
        .with_eviction_config(S3FifoConfig::default())
        .with_weighter(|_: &BlockHash, v: &Vec<u8>| v.len())
        .build()
}

fn main() {
    let ops: usize = std::env::args()
        .nth(1)
        .map_or(2_000_000, |s| s.parse().unwrap());
    let n = (64usize << 20) / BLOCK; // 64 MiB of blocks: all hits
    let data = vec![0x5au8; BLOCK];

    // 1. Hit latency.
    let ours = BlockCache::builder(128 << 20).build();
    let theirs = foyer_cache(128 << 20);
    for i in 0..n as u64 {
        ours.insert(key(i), &data).unwrap();
        theirs.insert(key(i), data.clone());
    }
    let timer = {
        let ns = time_hits(ops, n as u64, |k| {
            black_box(k);
        });
        percentiles(ns, 0).0 as u64
    };
    // Interleave rounds, alternating which goes first, so machine noise hits both alike.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..4 {
        for ours_now in [round % 2 == 0, round % 2 == 1] {
            if ours_now {
                a.extend(time_hits(ops / 4, n as u64, |k| {
                    black_box(ours.get(k).expect("hit"));
                }));
            } else {
                b.extend(time_hits(ops / 4, n as u64, |k| {
                    black_box(theirs.get(k).expect("hit"));
                }));
            }
        }
    }
    let (a50, a99) = percentiles(a, timer);
    let (b50, b99) = percentiles(b, timer);
    println!(
        "hit latency, {ops} gets of 4 KiB blocks (64 MiB cached), timer cost {timer} ns subtracted"
    );
    println!("| cache | p50 ns | p99 ns |");
    println!("|---|---:|---:|");
    println!("| tenantfs BlockCache (slab values) | {a50:.0} | {a99:.0} |");
    println!("| foyer Cache<_, Vec<u8>> | {b50:.0} | {b99:.0} |");
    println!("| **tenantfs / foyer (p50)** | **{:.2}** | |", a50 / b50);
    drop(ours);
    drop(theirs);

    // 2 and 3. Memory back, faults per block: 512 MiB of blocks, then empty the cache.
    let fill = (512usize << 20) / BLOCK;
    println!();
    println!("fill 512 MiB of 4 KiB blocks, then empty the cache");
    println!("| cache | RSS after fill MiB | RSS fall when emptied MiB | fall / filled | minor faults per block |");
    println!("|---|---:|---:|---:|---:|");
    {
        let ours = BlockCache::builder(1 << 30).build();
        let (r0, f0) = (rss(), minor_faults());
        for i in 0..fill as u64 {
            ours.insert(key(i), &data).unwrap();
        }
        let (r1, f1) = (rss(), minor_faults());
        ours.set_budget(0).unwrap();
        let r2 = rss();
        println!(
            "| tenantfs BlockCache (slab values) | {} | {} | {:.2} | {:.2} |",
            (r1 - r0) >> 20,
            (r1 - r2) >> 20,
            (r1 - r2) as f64 / (512 << 20) as f64,
            (f1 - f0) as f64 / fill as f64
        );
    }
    {
        let theirs = foyer_cache(1 << 30);
        let (r0, f0) = (rss(), minor_faults());
        for i in 0..fill as u64 {
            theirs.insert(key(i), data.clone());
        }
        let (r1, f1) = (rss(), minor_faults());
        theirs.resize(0).unwrap();
        let r2 = rss();
        println!(
            "| foyer Cache<_, Vec<u8>> (glibc malloc) | {} | {} | {:.2} | {:.2} |",
            (r1 - r0) >> 20,
            (r1 - r2) >> 20,
            (r1 - r2) as f64 / (512 << 20) as f64,
            (f1 - f0) as f64 / fill as f64
        );
    }
}
