//! The slab allocator's invariants: slots distinct, zeroed, aligned; classes minimal; freed
//! pages leave RSS; empty slabs unmapped; free by address finds exactly live allocations.

use super::*;

#[test]
fn classes() {
    assert_eq!(class_of(1), Some(0));
    assert_eq!(class_size(class_of(64).unwrap()), 64);
    assert_eq!(class_size(class_of(65).unwrap()), 128);
    assert_eq!(class_size(class_of(4096).unwrap()), 4096);
    assert_eq!(class_size(class_of(1 << 20).unwrap()), 1 << 20);
    assert_eq!(class_of((1 << 20) + 1), None);
    assert_eq!(class_size(class_of(4097).unwrap()), 8192);
    assert_eq!(class_size(class_of(8193).unwrap()), 12288);
    assert_eq!(class_size(class_of(16385).unwrap()), 20480);
    assert_eq!(class_size(class_of(17000).unwrap()), 20480);
    assert_eq!(class_size(class_of(600 << 10).unwrap()), 640 << 10);
    assert_eq!(class_size(CLASSES - 1), 1 << 20);
}

#[test]
fn every_size_gets_the_smallest_class_that_fits() {
    let sizes: Vec<usize> = (0..CLASSES).map(class_size).collect();
    assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
    assert!(sizes.iter().all(|&s| s < PAGE || s.is_multiple_of(PAGE)));
    assert!(sizes.iter().all(|&s| s >= PAGE || s.is_power_of_two()));
    let mut size = 1;
    while size <= MAX_CLASS {
        let c = class_of(size).unwrap();
        assert!(class_size(c) >= size, "{size}");
        assert!(c == 0 || class_size(c - 1) < size, "{size}");
        size += if size < 20000 { 1 } else { 97 };
    }
}

#[test]
fn addressed_allocations_free_by_pointer() {
    let slabs = SlabAllocator::new();
    let a = AddressedSlabs::new(slabs.clone());
    let ptrs: Vec<_> = [100usize, 4200, 70000, 3 << 20]
        .iter()
        .map(|&n| (a.allocate(n).unwrap(), n))
        .collect();
    assert_eq!(a.live_allocations(), 4);
    assert_eq!(
        slabs.stats().live_bytes,
        ptrs.iter()
            .map(|&(_, n)| usable_size(n) as u64)
            .sum::<u64>()
    );
    assert!(!a.deallocate(std::ptr::dangling_mut::<u8>()));
    for (p, _) in ptrs {
        assert!(a.deallocate(p.as_ptr()));
        assert!(!a.deallocate(p.as_ptr()), "freed twice");
    }
    assert_eq!(slabs.stats().live_bytes, 0);
    assert_eq!(slabs.stats().mapped_bytes, 0);
    assert_eq!(slabs.stats().resident_bytes, 0);
}

#[test]
fn slots_are_distinct_zeroed_and_aligned() {
    let a = SlabAllocator::new();
    for len in [1usize, 100, 4096, 5000, 65536, 3 << 20] {
        let mut boxes: Vec<SlabBox> = (0..20).map(|_| a.alloc(len).unwrap()).collect();
        for (i, b) in boxes.iter_mut().enumerate() {
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0), "not zeroed");
            assert_eq!(b.as_ptr() as usize % b.footprint().min(PAGE), 0);
            b.fill(i as u8);
        }
        for (i, b) in boxes.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8), "slots overlap");
        }
    }
    assert_eq!(a.stats().live_bytes, 0);
    assert_eq!(a.stats().mapped_bytes, 0, "empty slabs must be unmapped");
}

#[test]
fn reused_small_slots_are_zeroed() {
    let a = SlabAllocator::new();
    let keep = a.alloc(100).unwrap(); // keeps the slab mapped
    let mut b = a.alloc(100).unwrap();
    b.fill(0xff);
    drop(b);
    let c = a.alloc(100).unwrap();
    assert!(c.iter().all(|&x| x == 0));
    drop((keep, c));
}

/// `make asan` only: free slots are poisoned, live ones are not (past `len` is).
#[cfg(feature = "asan")]
#[test]
fn free_slots_are_poisoned_for_asan() {
    let a = SlabAllocator::new();
    let keep = a.alloc(4096).unwrap(); // keeps the slab mapped
    let b = a.alloc(4000).unwrap();
    let p = b.as_ptr();
    assert!(!asan::is_poisoned(p));
    assert!(!asan::is_poisoned(p.wrapping_add(3999)));
    assert!(
        asan::is_poisoned(p.wrapping_add(4000)),
        "past the allocation"
    );
    drop(b);
    assert!(asan::is_poisoned(p), "a free slot is not poisoned");
    drop(keep);
}

#[test]
fn a_pool_of_free_page_slots_stays_resident_until_trimmed() {
    let a = SlabAllocator::new();
    a.set_pool_limit(8 * 65536);
    let keep = a.alloc(65536).unwrap();
    let mut boxes: Vec<_> = (0..10).map(|_| a.alloc(65536).unwrap()).collect();
    for b in &mut boxes {
        b.fill(0xab);
    }
    let before = a.stats();
    drop(boxes);
    let after = a.stats();
    // 8 slots fit the pool, 2 went back to the kernel.
    assert_eq!(after.pooled_bytes, 8 * 65536);
    assert_eq!(after.released_bytes - before.released_bytes, 2 * 65536);
    assert_eq!(after.live_bytes, 65536);
    assert_eq!(after.resident_bytes, 9 * 65536);
    // Reuse comes from the pool, zeroed.
    let again: Vec<_> = (0..8).map(|_| a.alloc(65000).unwrap()).collect();
    assert!(
        again.iter().all(|b| b.iter().all(|&x| x == 0)),
        "a pooled slot was not cleared"
    );
    let s = a.stats();
    assert_eq!((s.pool_hits, s.pooled_bytes), (8, 0));
    drop(again);
    assert_eq!(a.stats().pooled_bytes, 8 * 65536);
    a.trim_pool();
    let s = a.stats();
    assert_eq!(
        (s.pooled_bytes, s.live_bytes, s.resident_bytes),
        (0, 65536, 65536)
    );
    drop(keep);
    assert_eq!(a.stats().pooled_bytes, 65536, "the last slot is pooled too");
    a.trim_pool();
    assert_eq!(a.stats().mapped_bytes, 0, "trimmed slots let the slab go");
    // A lower limit trims at once; sub-page slots never pool.
    a.set_pool_limit(1 << 20);
    let small: Vec<_> = (0..4).map(|_| a.alloc(100).unwrap()).collect();
    let page = a.alloc(4096).unwrap();
    drop((small, page));
    assert_eq!(a.stats().pooled_bytes, 4096);
    a.set_pool_limit(0);
    assert_eq!(a.stats().pooled_bytes, 0);
    assert_eq!(a.stats().mapped_bytes, 0);
}

#[test]
fn page_slots_are_released_at_once() {
    let a = SlabAllocator::new();
    let keep = a.alloc(65536).unwrap();
    let boxes: Vec<_> = (0..10).map(|_| a.alloc(65536).unwrap()).collect();
    let before = a.stats();
    drop(boxes);
    let after = a.stats();
    assert_eq!(after.released_bytes - before.released_bytes, 10 * 65536);
    assert_eq!(after.live_bytes, 65536);
    assert_eq!(after.mapped_bytes, SLAB_SIZE as u64);
    drop(keep);
}
