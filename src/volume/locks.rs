//! Striped per-inode locks.
//!
//! Read-modify-write of one inode's attributes or one of its partial blocks must not interleave
//! with another such change. A fixed table of mutexes indexed by inode number gives that without
//! a global lock on the data path; operations that touch several inodes take their stripes in
//! ascending order (deduplicated), so they cannot deadlock with each other.

use std::sync::{Mutex, MutexGuard};

const STRIPES: usize = 64;

pub(crate) struct InodeLocks {
    stripes: Vec<Mutex<()>>,
}

impl InodeLocks {
    pub(crate) fn new() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn stripe(ino: u64) -> usize {
        (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % STRIPES
    }

    /// Locks the stripe of one inode.
    pub(crate) fn lock(&self, ino: u64) -> MutexGuard<'_, ()> {
        self.stripes[Self::stripe(ino)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Locks the stripes of several inodes in a deadlock-free order.
    pub(crate) fn lock_many(&self, inos: &[u64]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = inos.iter().map(|&i| Self::stripe(i)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.stripes[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_many_dedups_shared_stripes() {
        let l = InodeLocks::new();
        // Same inode twice and inodes sharing a stripe must not self-deadlock.
        let same: Vec<u64> = (1..1000)
            .filter(|&i| InodeLocks::stripe(i) == InodeLocks::stripe(1))
            .take(2)
            .collect();
        let g = l.lock_many(&[1, 1, same[1], 2]);
        assert!(g.len() <= 2);
    }
}
