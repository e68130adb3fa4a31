//! Which entries the cache missed lately, to tell a part read that should bring its whole
//! entry in from one that should not.
//!
//! Why: a random 4 KiB read of a 64 KiB chunk can read and cache the 4 KiB it wants, or the
//! whole chunk. Whole, it warms a working set that fits the cache 16 times faster (the next
//! reads of the chunk hit); pieces, it reads a sixteenth from the disk and leaves the rest of
//! the cache alone when the working set does not fit (the other pieces would be evicted
//! before anyone read them). The criterion between the two is whether a second part of the
//! same entry is missed within a turn of the cache: then caching it whole would have made
//! that miss a hit. This remembers the entries of the last few thousand part misses, in two
//! generations of at most `limit` each (a quarter of the chunks the cache holds): a miss of
//! an entry in either says "read it whole".

use std::collections::HashSet;
use std::sync::Mutex;

/// Bytes of the entries whose misses are remembered (the limit is the cache's capacity in
/// such entries, over four).
const ENTRY_BYTES: usize = 64 << 10;
const MIN_LIMIT: usize = 64;

/// Entries (by a 64-bit hash of their key) missed lately.
#[derive(Default)]
pub struct RecentMisses {
    gens: Mutex<Gens>,
}

#[derive(Default)]
struct Gens {
    current: HashSet<u64>,
    previous: HashSet<u64>,
}

impl RecentMisses {
    /// Records a part miss of the entry under `key`, in a cache of `capacity` bytes; whether
    /// one of it came lately (and then forgets it: the caller reads it whole).
    pub fn missed_again(&self, key: &[u8], capacity: usize) -> bool {
        let h = twox_hash::XxHash3_64::oneshot(key);
        let limit = (capacity / ENTRY_BYTES / 4).max(MIN_LIMIT);
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        if g.current.remove(&h) || g.previous.remove(&h) {
            return true;
        }
        if g.current.len() >= limit {
            let current = std::mem::take(&mut g.current);
            g.previous = current;
        }
        g.current.insert(h);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_miss_within_two_generations_says_whole() {
        let r = RecentMisses::default();
        let cap = 16 * ENTRY_BYTES * 4; // a limit of 16, raised to MIN_LIMIT
        assert!(!r.missed_again(b"a", cap));
        assert!(r.missed_again(b"a", cap), "second miss");
        assert!(!r.missed_again(b"a", cap), "forgotten once answered");
        // Then 2 * MIN_LIMIT others: it has left both generations.
        for i in 0..2 * MIN_LIMIT as u64 {
            assert!(!r.missed_again(&i.to_be_bytes(), cap));
        }
        assert!(!r.missed_again(b"a", cap), "remembered too long");
        // One generation later it is still remembered.
        for i in 1000..1000 + MIN_LIMIT as u64 / 2 {
            r.missed_again(&i.to_be_bytes(), cap);
        }
        assert!(r.missed_again(b"a", cap), "forgotten too soon");
    }
}
