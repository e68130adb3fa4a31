//! The slab allocator against the kernel's own accounting: freed memory leaves the process's
//! RSS at once, and many threads allocating and freeing never mix up their bytes.

use std::time::{Duration, Instant};

use tenantfs::cache::{SlabAllocator, SlabBox};

/// The process's resident set size, from /proc/self/smaps_rollup.
fn rss_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let kib: u64 = text
        .lines()
        .find(|l| l.starts_with("Rss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    kib * 1024
}

#[test]
fn freeing_half_of_one_gib_drops_rss_by_half_a_gib() {
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
fn concurrent_alloc_free_keeps_every_byte() {
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
