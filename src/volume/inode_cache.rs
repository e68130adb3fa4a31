//! The inode records a volume read or wrote last, decoded, so that the run of requests a
//! program makes on one file (a lookup, then open, fstat, read, write, fstat again: git
//! checkout and tar make about a dozen per file) reads its record from the store once, not
//! at every request (a RocksDB point lookup: memtables, then each level's filter and index).
//!
//! The store stays the truth, and the cache only follows it: a record changes in the cache
//! when the batch that changes it in the store has been written (`Batch::when_written`, run
//! while the writer still holds the inode's lock, so in the order of the writes), and a
//! record read from the store goes into the cache only if no write of that shard's records
//! came between the read and the insert (a generation count per shard): a reader that missed
//! can never put back a record older than one written meanwhile. A write that fails changes
//! nothing, here as in the store. It is small and bounded (first in, first out per shard):
//! the requests on one file come together, and an idle mount should not hold memory.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::types::Attr;

/// Shards (by inode number), each with its own lock.
const SHARDS: usize = 8;
/// Records per shard: 256 in all, about 50 KiB a mounted volume (a git checkout's requests
/// found the same records with 1,024: getattr 0.2 us either way).
const PER_SHARD: usize = 32;

/// A decoded inode record: attributes and a symlink's target (empty for others).
pub(crate) type Record = (Attr, Vec<u8>);

#[derive(Default)]
pub(crate) struct InodeCache {
    shards: [Mutex<Shard>; SHARDS],
}

#[derive(Default)]
struct Shard {
    /// Changes with every record written or removed in this shard.
    generation: u64,
    /// Inode -> (when it went in, its record).
    records: HashMap<u64, (u64, Record)>,
    /// Inodes in the order they went in; an entry whose stamp no longer matches its record
    /// is a leftover of an earlier insert and evicts nothing.
    order: VecDeque<(u64, u64)>,
    stamp: u64,
}

/// What [`InodeCache::generation`] returned: pass it back to [`InodeCache::fill`].
#[derive(Clone, Copy)]
pub(crate) struct Generation(u64);

impl InodeCache {
    fn shard(&self, ino: u64) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[(ino % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, ino: u64) -> Option<Record> {
        self.shard(ino).records.get(&ino).map(|(_, r)| r.clone())
    }

    /// To take before reading `ino`'s record from the store.
    pub(crate) fn generation(&self, ino: u64) -> Generation {
        Generation(self.shard(ino).generation)
    }

    /// Puts a record read from the store, unless a record of its shard was written since
    /// `before` (it may be older than that write).
    pub(crate) fn fill(&self, ino: u64, before: Generation, record: Record) {
        let mut s = self.shard(ino);
        if s.generation == before.0 {
            s.insert(ino, record);
        }
    }

    /// `ino`'s record as a write just stored it.
    pub(crate) fn written(&self, ino: u64, record: Record) {
        let mut s = self.shard(ino);
        s.generation += 1;
        s.insert(ino, record);
    }

    /// `ino`'s record was deleted from the store.
    pub(crate) fn removed(&self, ino: u64) {
        let mut s = self.shard(ino);
        s.generation += 1;
        s.records.remove(&ino);
    }
}

impl Shard {
    fn insert(&mut self, ino: u64, record: Record) {
        self.stamp += 1;
        self.records.insert(ino, (self.stamp, record));
        self.order.push_back((ino, self.stamp));
        if self.order.len() > 2 * PER_SHARD {
            // Rewrites and removals leave entries behind: keep the live ones.
            let records = &self.records;
            self.order
                .retain(|(i, stamp)| records.get(i).is_some_and(|(s, _)| s == stamp));
        }
        while self.records.len() > PER_SHARD {
            let Some((old, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.records.get(&old).is_some_and(|(s, _)| *s == stamp) {
                self.records.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::FileKind;

    fn rec(ino: u64, size: u64) -> Record {
        let attr = Attr {
            size,
            ..Attr::for_tests(ino, FileKind::File)
        };
        (attr, Vec::new())
    }

    fn size(c: &InodeCache, ino: u64) -> Option<u64> {
        c.get(ino).map(|(a, _)| a.size)
    }

    #[test]
    fn a_read_that_raced_a_write_does_not_put_back_the_old_record() {
        let c = InodeCache::default();
        // A reader misses, takes the generation, reads size 1 from the store...
        let before = c.generation(5);
        // ...a writer stores size 2 meanwhile...
        c.written(5, rec(5, 2));
        // ...and the reader's older record does not replace it.
        c.fill(5, before, rec(5, 1));
        assert_eq!(size(&c, 5), Some(2));
        // The same for a write to another inode of the shard (the count is per shard).
        c.removed(5);
        let before = c.generation(5);
        c.written(5 + SHARDS as u64, rec(5 + SHARDS as u64, 9));
        c.fill(5, before, rec(5, 1));
        assert_eq!(size(&c, 5), None);
        // With no write between, the record read goes in.
        let before = c.generation(5);
        c.fill(5, before, rec(5, 3));
        assert_eq!(size(&c, 5), Some(3));
        // A removed record is gone, and a read from before the removal stays out.
        let before = c.generation(5);
        c.removed(5);
        c.fill(5, before, rec(5, 3));
        assert_eq!(size(&c, 5), None);
    }

    /// Readers that miss and fill race writers of the same records on a real volume: once
    /// they stop, what `getattr` answers from the cache is what the store holds.
    #[test]
    fn cached_records_match_the_store_after_racing_reads_and_writes() {
        use crate::store::Family;
        use crate::volume::codec::{decode_attr, ino_key};
        use crate::volume::{Owner, SetAttr, ROOT_INO};
        let store = crate::volume::testing::TestStore::new();
        let v = store.open();
        let owner = Owner { uid: 0, gid: 0 };
        // More files than the cache holds, so that readers keep missing and filling.
        let inos: Vec<u64> = (0..2 * SHARDS * PER_SHARD)
            .map(|i| {
                let name = format!("f{i}");
                v.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, owner, 0)
                    .unwrap()
                    .ino
            })
            .collect();
        std::thread::scope(|s| {
            for w in 0..2u64 {
                let (v, inos) = (&v, &inos);
                s.spawn(move || {
                    for round in 0..3u64 {
                        for &ino in inos.iter().skip(w as usize).step_by(2) {
                            let set = SetAttr {
                                size: Some(round * 10 + w),
                                ..SetAttr::default()
                            };
                            v.setattr(ino, &set).unwrap();
                        }
                    }
                });
            }
            for r in 0..3 {
                let (v, inos) = (&v, &inos);
                s.spawn(move || {
                    for _ in 0..3 {
                        for &ino in inos.iter().skip(r).step_by(3) {
                            v.getattr(ino).unwrap();
                        }
                    }
                });
            }
        });
        for (i, &ino) in inos.iter().enumerate() {
            let raw = v.db().get(Family::Inodes, &ino_key(ino)).unwrap().unwrap();
            let (stored, _) = decode_attr(ino, &raw).unwrap();
            let answered = v.getattr(ino).unwrap();
            assert_eq!((answered.size, answered.ctime), (stored.size, stored.ctime));
            // Its writer's last round.
            assert_eq!(stored.size, 20 + (i % 2) as u64);
        }
    }

    #[test]
    fn it_holds_a_bounded_number_of_records_the_newest_first() {
        let c = InodeCache::default();
        let n = (SHARDS * PER_SHARD * 3) as u64;
        for ino in 0..n {
            c.written(ino, rec(ino, ino));
            // Rewriting a record many times leaves one entry, and evicts no other.
            c.written(3, rec(3, 3));
        }
        let held = (0..n).filter(|&i| c.get(i).is_some()).count();
        assert!(held <= SHARDS * PER_SHARD, "{held}");
        assert!(held >= SHARDS * PER_SHARD - SHARDS, "{held}");
        assert_eq!(size(&c, n - 1), Some(n - 1), "the newest is held");
        assert_eq!(size(&c, 0), None, "the oldest went first");
        assert_eq!(size(&c, 3), Some(3), "one written last is held");
        for s in &c.shards {
            assert!(s.lock().unwrap().order.len() <= 2 * PER_SHARD);
        }
    }
}
