//! Three caches of 4 KiB blocks, same keys, same budget, in one run:
//!   - tenantfs `BlockCache`: foyer S3-FIFO, values in slab slots;
//!   - RocksDB's LRU cache on the same slab allocator (`cache::RocksBlockCache`, raw entries);
//!   - foyer's in-memory cache holding `Vec<u8>` (S3-FIFO, 8 shards, glibc malloc): the default
//!     allocator.
//!
//! Measured:
//!   1. hit latency: lookup + release of the handle, p50/p99 per operation (batch means), timer
//!      cost subtracted, rounds interleaved with a rotating order;
//!   2. memory given back: fill 512 MiB of blocks, empty the cache (budget 0), how far RSS falls;
//!   3. minor page faults per inserted block while filling an empty cache;
//!   4. minor page faults per inserted block in a cache churning at a steady budget (the host
//!      cache, whose slab allocator keeps a pool of freed slots resident), and how much of its
//!      memory `release` gives back, in how long.
//!
//! usage: cargo run --release --example bench_block_cache [-- HIT_OPS]

use std::hint::black_box;
use std::time::Instant;

use foyer_memory::{Cache, CacheBuilder, S3FifoConfig};
use nix::sys::resource::{getrusage, UsageWho};
use tenantfs::cache::RocksBlockCache;
use tenantfs::cache::{BlockCache, BlockHash, HostCache, SlabAllocator};

const BLOCK: usize = 4096;
/// Hit test: 64 MiB of blocks under a 256 MiB budget. RocksDB's raw entries carry an 8-byte
/// length header, so each 4 KiB block takes an 8 KiB slot and is charged 8 KiB plus metadata:
/// a 128 MiB budget would evict part of the 64 MiB there. 256 MiB keeps every lookup a hit in
/// all three caches.
const HIT_DATA: usize = 64 << 20;
const HIT_BUDGET: usize = 256 << 20;
/// Fill test: 512 MiB of blocks under a 2 GiB budget (same reason: no cache evicts while filling).
const FILL_DATA: usize = 512 << 20;
const FILL_BUDGET: usize = 2 << 30;

const NAMES: [&str; 3] = [
    "tenantfs BlockCache (foyer S3-FIFO, slab values)",
    "RocksDB LRU cache (slab values)",
    "foyer Cache<_, Vec<u8>> (glibc malloc)",
];

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
    let n = HIT_DATA / BLOCK; // all hits
    let data = vec![0x5au8; BLOCK];

    // 1. Hit latency.
    let ours = BlockCache::builder(HIT_BUDGET).build();
    let rocks = RocksBlockCache::new(HIT_BUDGET, &SlabAllocator::new());
    let theirs = foyer_cache(HIT_BUDGET);
    for i in 0..n as u64 {
        ours.insert(key(i), &data).unwrap();
        assert!(rocks.insert_raw(&key(i), &data));
        theirs.insert(key(i), data.clone());
    }
    let timer = {
        let ns = time_hits(ops, n as u64, |k| {
            black_box(k);
        });
        percentiles(ns, 0).0 as u64
    };
    // Interleave rounds, rotating which cache goes first (each goes first, second and third
    // twice), so machine noise hits all alike.
    const ROUNDS: usize = 6;
    let mut samples: [Vec<u64>; 3] = Default::default();
    for round in 0..ROUNDS {
        for slot in 0..3 {
            let which = (round + slot) % 3;
            let ns = match which {
                0 => time_hits(ops / ROUNDS, n as u64, |k| {
                    black_box(ours.get(k).expect("hit"));
                }),
                1 => time_hits(ops / ROUNDS, n as u64, |k| {
                    black_box(rocks.with_raw(k, |b| black_box(b.as_ptr())).expect("hit"));
                }),
                _ => time_hits(ops / ROUNDS, n as u64, |k| {
                    black_box(theirs.get(k).expect("hit"));
                }),
            };
            samples[which].extend(ns);
        }
    }
    let [(o50, o99), (r50, r99), (f50, f99)] = samples.map(|s| percentiles(s, timer));
    let s = (ours.stats(), rocks.stats());
    assert_eq!(s.0.misses + s.1.misses, 0, "a hit test that missed: {s:?}");
    println!(
        "hit latency: {ops} lookups per cache of 4 KiB blocks ({} MiB cached, {} MiB budget), \
         batches of {BATCH}, {ROUNDS} rotating rounds, timer cost {timer} ns subtracted",
        HIT_DATA >> 20,
        HIT_BUDGET >> 20
    );
    println!("| cache | hit p50 ns | hit p99 ns |");
    println!("|---|---:|---:|");
    println!("| {} | {o50:.0} | {o99:.0} |", NAMES[0]);
    println!("| {} | {r50:.0} | {r99:.0} |", NAMES[1]);
    println!("| {} | {f50:.0} | {f99:.0} |", NAMES[2]);
    println!(
        "| **BlockCache / foyer** | **{:.2}** | **{:.2}** |",
        o50 / f50,
        o99 / f99
    );
    println!(
        "| **BlockCache / RocksDB LRU** | **{:.2}** | **{:.2}** |",
        o50 / r50,
        o99 / r99
    );
    drop(ours);
    drop(rocks);
    drop(theirs);

    // 2 and 3. Memory back, faults per block: 512 MiB of blocks, then empty the cache. The
    // malloc-backed cache goes last: memory glibc keeps after it empties would otherwise be
    // reused by (and hidden from) a later cache's fill.
    let fill = FILL_DATA / BLOCK;
    println!();
    println!(
        "fill {} MiB of 4 KiB blocks ({} MiB budget), then empty the cache (budget 0); \
         in this order",
        FILL_DATA >> 20,
        FILL_BUDGET >> 20
    );
    println!(
        "| cache | RSS after fill MiB | RSS fall when emptied MiB | fall / data filled | \
         fall / RSS grown | minor faults per block |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let report = |name: &str, (r0, f0): (i64, i64), (r1, f1): (i64, i64), r2: i64| {
        println!(
            "| {name} | {} | {} | {:.2} | {:.2} | {:.2} |",
            (r1 - r0) >> 20,
            (r1 - r2) >> 20,
            (r1 - r2) as f64 / FILL_DATA as f64,
            (r1 - r2) as f64 / (r1 - r0) as f64,
            (f1 - f0) as f64 / fill as f64
        );
    };
    {
        let ours = BlockCache::builder(FILL_BUDGET).build();
        let before = (rss(), minor_faults());
        for i in 0..fill as u64 {
            ours.insert(key(i), &data).unwrap();
        }
        let filled = (rss(), minor_faults());
        assert_eq!(ours.stats().evictions, 0);
        ours.set_budget(0).unwrap();
        report(NAMES[0], before, filled, rss());
    }
    {
        let rocks = RocksBlockCache::new(FILL_BUDGET, &SlabAllocator::new());
        let before = (rss(), minor_faults());
        for i in 0..fill as u64 {
            assert!(rocks.insert_raw(&key(i), &data));
        }
        let filled = (rss(), minor_faults());
        assert_eq!(rocks.stats().evictions, 0);
        rocks.set_capacity(0);
        report(NAMES[1], before, filled, rss());
    }
    {
        let theirs = foyer_cache(FILL_BUDGET);
        let before = (rss(), minor_faults());
        for i in 0..fill as u64 {
            theirs.insert(key(i), data.clone());
        }
        let filled = (rss(), minor_faults());
        theirs.resize(0).unwrap();
        report(NAMES[2], before, filled, rss());
    }

    steady_budget_churn(&data);
}

/// Part 4: a full cache at a steady budget, where every insert evicts one block. Without the pool each
/// insert faulted a fresh page in (its slot's pages were given back at the eviction).
fn steady_budget_churn(data: &[u8]) {
    const BUDGET: u64 = 256 << 20;
    const CHURN: u64 = 256 * 1024; // 1 GiB of inserts through a 256 MiB cache
    println!();
    println!(
        "host cache at a steady {} MiB budget: fill it, then insert {} MiB more \
         (each insert evicts); then `release` everything",
        BUDGET >> 20,
        (CHURN * BLOCK as u64) >> 20
    );
    println!(
        "| cache | minor faults per insert (churn) | pool hits per insert | released / \
         resident before | release time ms |"
    );
    println!("|---|---:|---:|---:|---:|");
    for name in [NAMES[1], NAMES[0]] {
        let host = HostCache::new(BUDGET);
        let insert = |i: u64| {
            if name == NAMES[1] {
                assert!(host.rocksdb().insert_raw(&key(i), data));
            } else {
                host.blocks().insert(key(i), data).unwrap();
                host.block_inserted();
            }
        };
        let fill = 2 * BUDGET / BLOCK as u64;
        for i in 0..fill {
            insert(i);
        }
        let (f0, h0) = (minor_faults(), host.stats().pool_hits);
        for i in fill..fill + CHURN {
            insert(i);
        }
        let (f1, h1) = (minor_faults(), host.stats().pool_hits);
        let resident = host.stats().resident_bytes;
        let t = Instant::now();
        let released = host.release(u64::MAX);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "| {name} | {:.3} | {:.2} | {:.3} | {ms:.0} |",
            (f1 - f0) as f64 / CHURN as f64,
            (h1 - h0) as f64 / CHURN as f64,
            released as f64 / resident as f64
        );
    }
}
