//! Warming the small files created next to one that was read from the disk.
//!
//! Why: a walker that reads small files in an order of its own gets no help from a listing
//! (`fuse::listing_prefetch`) or from read-ahead within a file: `git checkout` reads each blob
//! from its loose object, by path, so by hash, all over `.git/objects`, and each object's first
//! read waits for the disk. But files created one after another get consecutive inode numbers
//! and lie side by side in the store (adjacent keys in the inode and extent families, adjacent
//! bytes in SST, blob and extent files), as the files of a directory copied or unpacked
//! together do. One multi-get of an inode's neighbours brings them in with a few merged
//! reads, where the walker would pay one disk read each.
//!
//! What: a read from the start of a file of at most [`SMALL`] bytes that went to the disk
//! (the cache counted a miss on the reading thread) warms, in the background, the group of
//! [`GROUP`] inode numbers around it: their inode records (which serve the walker's next
//! stats too), then up to [`GROUP_BYTES`] of its regular files of at most `SMALL` bytes. The
//! last [`REMEMBERED`] groups warmed are not warmed again: a cold read there is the warming
//! racing the reader, or a file the group's budget left out. Reads served from RAM cost one
//! counter read; nothing is warmed for them.

use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::Mutex;

use super::error::Result;
use super::readahead::FIRST_WINDOW;
use super::Volume;

/// Files up to this size are warmed whole (the store's first read-ahead window).
pub(crate) const SMALL: u64 = FIRST_WINDOW;
/// Inode numbers per group (aligned runs).
const GROUP: u64 = 64;
/// Bytes of file data one group's warming reads at most.
const GROUP_BYTES: u64 = 2 << 20;
/// Groups remembered as warmed.
const REMEMBERED: usize = 4096;

/// The groups of one volume warmed lately.
#[derive(Default)]
pub(crate) struct Neighbours {
    warmed: Mutex<Warmed>,
}

#[derive(Default)]
struct Warmed {
    /// Oldest first.
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl Neighbours {
    /// A read from the start of the small file `ino` went to the disk: unless its group was
    /// warmed lately, `fetch` is given the group's inode numbers to warm. The group counts as
    /// warmed if `fetch` says it queued the work (a full queue leaves it for the next miss).
    fn cold_read(&self, ino: u64, fetch: impl FnOnce(Range<u64>) -> bool) {
        let group = ino / GROUP;
        let mut w = self.warmed.lock().unwrap_or_else(|p| p.into_inner());
        if w.set.contains(&group) || !fetch(group * GROUP..(group + 1) * GROUP) {
            return;
        }
        w.set.insert(group);
        w.order.push_back(group);
        if w.order.len() > REMEMBERED {
            let old = w.order.pop_front().expect("a group to forget");
            w.set.remove(&old);
        }
    }
}

impl Volume {
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_into(ino, offset, size, &mut out)?;
        Ok(out)
    }

    /// [`Self::read`] into `out` (replacing what it held), so that a caller can reuse one
    /// buffer: its pages stay mapped from one read to the next.
    pub fn read_into(&self, ino: u64, offset: u64, size: u32, out: &mut Vec<u8>) -> Result<()> {
        let misses = crate::cache::thread_misses();
        self.read_stored(ino, offset, size, out)?;
        let missed = crate::cache::thread_misses() != misses;
        if missed {
            // The next read will likely wait on the disk as well.
            crate::store::note_foreground_io();
        }
        if offset == 0 && missed {
            // The file's record is in the cache now: its size costs no disk read.
            if self.getattr(ino).is_ok_and(|a| a.size <= SMALL) {
                self.neighbours.cold_read(ino, |inos| {
                    self.readahead.fetch_inodes(
                        &self.tenant,
                        inos,
                        (SMALL, GROUP_BYTES),
                        self.block_size,
                        self.chunk_blocks,
                    )
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The group `cold_read` asks for, if any (`queued`: what the fetch answers).
    fn asks(n: &Neighbours, ino: u64, queued: bool) -> Option<Range<u64>> {
        let mut asked = None;
        n.cold_read(ino, |inos| {
            asked = Some(inos);
            queued
        });
        asked
    }

    #[test]
    fn a_group_is_warmed_once_while_remembered() {
        let n = Neighbours::default();
        assert_eq!(
            asks(&n, 130, true),
            Some(128..192),
            "the aligned group around it"
        );
        assert_eq!(asks(&n, 128, true), None, "the same group: warmed already");
        assert_eq!(asks(&n, 191, true), None);
        assert_eq!(
            asks(&n, 200, false),
            Some(192..256),
            "the next group, not queued"
        );
        assert_eq!(asks(&n, 192, true), Some(192..256), "so asked for again");
        assert_eq!(asks(&n, 5, true), Some(0..64));
        for g in 10..10 + REMEMBERED as u64 {
            assert!(asks(&n, g * GROUP, true).is_some());
        }
        assert_eq!(
            asks(&n, 130, true),
            Some(128..192),
            "forgotten: warmed again"
        );
        assert_eq!(
            asks(&n, 20 * GROUP, true),
            None,
            "a recent group is still remembered"
        );
    }
}
