//! The slab allocator and the block cache against the kernel's own accounting: freed or
//! released memory leaves the process's RSS at once, and many threads allocating, reading,
//! evicting and releasing never mix up their bytes.

use std::time::{Duration, Instant};

use std::sync::Arc;

use tenantfs::cache::{BlockCache, RocksBlockCache, SlabAllocator, SlabBox};
use tenantfs::store::{DirectIo, Encryption, Family, OpenMode, StoreHost, TenantDb};

/// RSS is per process: tests in this file run one at a time so none disturbs another's reading.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rss_bytes() -> u64 {
    tenantfs::cache::process_rss_bytes().unwrap()
}

#[test]
fn freeing_half_of_one_gib_drops_rss_by_half_a_gib() {
    // RSS is the process's: measured in a process of its own, no other test beside it.
    crate::alone_in_a_process!("freeing_half_of_one_gib_drops_rss_by_half_a_gib");
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let a = SlabAllocator::new();
    let block = 64 << 10;
    let mut boxes: Vec<SlabBox> = (0..(1usize << 30) / block)
        .map(|i| {
            let mut b = a.alloc(block).unwrap();
            b.fill(i as u8 | 1); // touch every page
            b
        })
        .collect();
    let full = rss_bytes();
    assert!(full >= 1 << 30, "RSS {full} after filling 1 GiB");
    // Free every other block: the freed slots are spread over every slab, so only per-slot
    // release (not unmapping whole slabs) can give this memory back.
    let t = Instant::now();
    let mut i = 0;
    boxes.retain(|_| {
        i += 1;
        i % 2 == 0
    });
    let freed = 512u64 << 20;
    let dropped = full.saturating_sub(rss_bytes());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "release took {:?}",
        t.elapsed()
    );
    assert!(
        dropped * 100 >= freed * 95,
        "RSS fell by {} MiB after freeing 512 MiB",
        dropped >> 20
    );
    assert_eq!(a.stats().live_bytes, freed);
    // What is left is intact.
    for (j, b) in boxes.iter().enumerate() {
        let want = (2 * j + 1) as u8 | 1;
        assert!(b.iter().all(|&x| x == want), "block {j} damaged");
    }
    drop(boxes);
    assert_eq!(a.stats().mapped_bytes, 0);
}

#[test]
fn block_cache_release_drops_rss() {
    // RSS is the process's: measured in a process of its own, no other test beside it.
    crate::alone_in_a_process!("block_cache_release_drops_rss");
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Fill the block cache to 1 GiB of 64 KiB blocks, release 512 MiB: RSS must fall by at
    // least 95% of that within 1 s, and the blocks left must be intact.
    let block = 64usize << 10;
    let cache = BlockCache::builder(1 << 30).build();
    let n = (1usize << 30) / block;
    let fill = |i: usize, slot: &mut [u8]| {
        slot.fill(i as u8);
        slot[..8].copy_from_slice(&(i as u64).to_le_bytes());
    };
    let mut hashes = Vec::with_capacity(n);
    let mut data = vec![0u8; block];
    for i in 0..n {
        // Keyed by content, as the real cache is; filled in place.
        fill(i, &mut data);
        let h = *blake3::hash(&data).as_bytes();
        cache.insert_with(h, block, |slot| fill(i, slot)).unwrap();
        hashes.push(h);
    }
    let used = cache.stats().used_bytes;
    assert!(used > 1000 << 20, "cache holds only {} MiB", used >> 20);
    let full = rss_bytes();
    let t = Instant::now();
    let released = cache.release(512 << 20).unwrap();
    let dropped = full.saturating_sub(rss_bytes());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "release took {:?}",
        t.elapsed()
    );
    assert!(released >= 512 << 20, "allocator released {released}");
    assert!(
        dropped * 100 >= (512u64 << 20) * 95,
        "RSS fell by {} MiB after releasing 512 MiB",
        dropped >> 20
    );
    let mut hits = 0;
    for h in &hashes {
        if let Some(b) = cache.get(h) {
            assert_eq!(blake3::hash(&b).as_bytes(), h, "cached block damaged");
            hits += 1;
        }
    }
    assert!(
        hits > 0 && hits < hashes.len(),
        "{hits} of {} left",
        hashes.len()
    );
}

#[test]
fn block_cache_concurrent_readers_writers_and_releases() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cache = std::sync::Arc::new(BlockCache::builder(8 << 20).build());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                let mut x = (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let id = x % 4000;
                    let len = [512usize, 4096, 16384][(id % 3) as usize];
                    let data: Vec<u8> = (0..len).map(|j| (id as usize * 7 + j) as u8).collect();
                    let h = *blake3::hash(&data).as_bytes();
                    match cache.get(&h) {
                        Some(b) => assert_eq!(blake3::hash(&b).as_bytes(), &h, "wrong block"),
                        None => {
                            let b = cache.insert(h, &data).unwrap();
                            assert_eq!(&*b, &data[..]);
                        }
                    }
                    if x % 997 == 0 {
                        cache.release(1 << 20).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = cache.stats();
    assert!(s.hits > 0 && s.evictions > 0, "{s:?}");
    cache.set_budget(0).unwrap();
    assert_eq!(cache.stats().live_bytes, 0, "evicted blocks kept memory");
}

#[test]
fn concurrent_alloc_free_keeps_every_byte() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let a = SlabAllocator::new();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut held: Vec<(u8, SlabBox)> = Vec::new();
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if held.len() < 64 && x % 3 != 0 {
                        let len = [24, 200, 4096, 9000, 70_000][(x >> 8) as usize % 5];
                        let mut b = a.alloc(len).unwrap();
                        assert!(b.iter().all(|&v| v == 0), "fresh slot not zeroed");
                        let tag = (x >> 16) as u8;
                        b.fill(tag);
                        held.push((tag, b));
                    } else if !held.is_empty() {
                        let (tag, b) = held.swap_remove((x >> 20) as usize % held.len());
                        assert!(b.iter().all(|&v| v == tag), "slot changed under its owner");
                    }
                }
                for (tag, b) in held {
                    assert!(b.iter().all(|&v| v == tag));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.stats().live_bytes, 0);
    assert_eq!(a.stats().mapped_bytes, 0, "empty slabs left mapped");
}

/// Incompressible bytes determined by `i` (so a read is checked without keeping a copy).
fn value_of(i: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&i.to_le_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

fn key_of(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

/// A tenant store (plaintext: encryption is not what these tests measure) whose host uses
/// `cache`, filled with `count` values of `len` bytes and flushed to SSTs.
fn filled_store(cache: &RocksBlockCache, count: u64, len: usize) -> (tempfile::TempDir, TenantDb) {
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-cache-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let host = StoreHost::builder()
        .block_cache(cache.clone())
        .direct_io(DirectIo::Auto)
        .build();
    let db = TenantDb::open(
        &host,
        "cachetest",
        &tmp.path().join("db"),
        Encryption::PlaintextForBenchmarks,
        OpenMode::Create,
    )
    .unwrap();
    for chunk in (0..count).collect::<Vec<_>>().chunks(64) {
        let mut b = db.batch();
        for &i in chunk {
            b.put(Family::Extents, &key_of(i), &value_of(i, len));
        }
        db.write(b).unwrap();
    }
    db.flush().unwrap();
    (tmp, db)
}

/// A compaction rewrites the keys it merges into new SST files, whose blocks have new cache
/// keys: the store puts them into the cache as it writes them, so keys read before a
/// compaction are still hits after it (a `git checkout` reads its objects while the compactions
/// its own writes cause rewrite their keys).
#[test]
fn keys_read_before_a_compaction_are_still_cached_after_it() {
    const KEYS: u64 = 20_000;
    let slabs = SlabAllocator::new();
    let cache = RocksBlockCache::new(256 << 20, &slabs);
    let (_tmp, db) = filled_store(&cache, KEYS, 100);
    let read_all = || {
        for i in 0..KEYS {
            let v = db.get(Family::Extents, &key_of(i)).unwrap().unwrap();
            assert_eq!(&v[..], &value_of(i, 100)[..], "key {i}");
        }
    };
    read_all();
    db.compact().unwrap();
    let misses = cache.stats().misses;
    read_all();
    let missed = cache.stats().misses - misses;
    // About 600 data blocks hold these keys: all of them would miss once without it.
    assert!(missed < 10, "{missed} lookups missed after the compaction");
}

#[test]
fn rocksdb_block_cache_release_drops_rss() {
    // RSS is the process's: measured in a process of its own, no other test beside it.
    crate::alone_in_a_process!("rocksdb_block_cache_release_drops_rss");
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The RocksDB block cache on slab memory: fill it to 1 GiB with blocks read from SSTs
    // (O_DIRECT, so no page cache is involved), release 512 MiB: RSS falls by at least 95% of
    // that within 1 s, and every read afterwards is still right.
    let slabs = SlabAllocator::new();
    let cache = RocksBlockCache::new(1200 << 20, &slabs);
    let len = 16 << 10;
    let count = (1000u64 << 20) / len as u64;
    let (_tmp, db) = filled_store(&cache, count, len);
    assert!(db.direct_io(), "the test needs O_DIRECT under /var/tmp");
    for i in 0..count {
        assert_eq!(
            db.get(Family::Extents, &key_of(i)).unwrap().unwrap(),
            value_of(i, len)
        );
    }
    // Every value cached, each 16 KiB blob value in a 16 KiB slot (not a 20 KiB one, as the
    // SST blocks that held values before format 2 took).
    let used = cache.usage() as u64;
    assert!(used >= 1000 << 20, "cache holds only {} MiB", used >> 20);
    assert!(
        used <= 1040 << 20,
        "{} MiB charged for 1000 MiB",
        used >> 20
    );
    let full = rss_bytes();
    let released_before = slabs.stats().released_bytes;
    let t = Instant::now();
    let evicted = cache.release(512 << 20) as u64;
    let dropped = full.saturating_sub(rss_bytes());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "release took {:?}",
        t.elapsed()
    );
    assert!(evicted >= 512 << 20, "evicted {evicted}");
    assert!(slabs.stats().released_bytes - released_before >= 500 << 20);
    assert!(
        dropped * 100 >= (512u64 << 20) * 95,
        "RSS fell by {} MiB after releasing 512 MiB",
        dropped >> 20
    );
    assert_eq!(cache.capacity(), 1200 << 20, "release keeps the capacity");
    let s = cache.stats();
    assert!(s.hits > 0 && s.misses >= count && s.evictions > 0, "{s:?}");
    for i in (0..count).step_by(7) {
        assert_eq!(
            db.get(Family::Extents, &key_of(i)).unwrap().unwrap(),
            value_of(i, len)
        );
    }
}

#[test]
fn rocksdb_and_block_cache_concurrent_reads_evictions_and_releases() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Both caches on one slab allocator: readers of a RocksDB store, inserters/readers of the
    // block cache, and a thread shrinking, releasing and regrowing both, all at once. No read
    // may ever return bytes that are not the value's (each is recomputed from its key).
    let slabs = SlabAllocator::new();
    let rocks = RocksBlockCache::new(16 << 20, &slabs);
    let blocks = Arc::new(BlockCache::builder(8 << 20).slabs(slabs.clone()).build());
    let len = 4000;
    let count = 20_000u64;
    let (_tmp, db) = filled_store(&rocks, count, len);
    let db = Arc::new(db);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let db = db.clone();
        threads.push(std::thread::spawn(move || {
            let mut x = (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for _ in 0..15_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = x % count;
                let got = db.get(Family::Extents, &key_of(i)).unwrap().unwrap();
                assert!(
                    got == value_of(i, len),
                    "store read {i} returned wrong bytes"
                );
            }
        }));
    }
    for t in 0..2u64 {
        let blocks = blocks.clone();
        threads.push(std::thread::spawn(move || {
            let mut x = (t + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let data = value_of(x % 3000, [700usize, 4096, 5000][(x % 3) as usize]);
                let h = *blake3::hash(&data).as_bytes();
                match blocks.get(&h) {
                    Some(b) => assert_eq!(blake3::hash(&b).as_bytes(), &h, "wrong block"),
                    None => assert_eq!(&*blocks.insert(h, &data).unwrap(), &data[..]),
                }
            }
        }));
    }
    {
        let (rocks, blocks, stop) = (rocks.clone(), blocks.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match round % 4 {
                    0 => {
                        rocks.release(4 << 20);
                        blocks.release(2 << 20).unwrap();
                    }
                    1 => rocks.set_capacity(2 << 20),
                    2 => blocks.set_budget(1 << 20).unwrap(),
                    _ => {
                        rocks.set_capacity(16 << 20);
                        blocks.set_budget(8 << 20).unwrap();
                    }
                }
                round += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        }));
    }
    let releaser = threads.pop().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    releaser.join().unwrap();
    let (r, b) = (rocks.stats(), blocks.stats());
    assert!(r.hits > 0 && r.evictions > 0, "{r:?}");
    assert!(b.hits > 0 && b.evictions > 0, "{b:?}");
    // Everything evicted gave its slot back: emptied, the two caches hold no slab memory.
    blocks.set_budget(0).unwrap();
    drop(db);
    rocks.set_capacity(0);
    assert_eq!(rocks.usage(), 0);
    assert_eq!(
        rocks.slab_allocations(),
        0,
        "blocks leaked after the store closed"
    );
    assert_eq!(slabs.stats().live_bytes, 0);
}
