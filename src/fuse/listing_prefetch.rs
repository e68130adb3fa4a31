//! Warming the small files of a directory listing once its files are being read in order.
//!
//! Why: `tar c`, `cp -a` and `rsync` list a directory, then read its files one after another,
//! each from its start. Each small file's first read waits for its own disk read (the
//! store's read-ahead starts within a file, and a file of a few KiB is over before it helps),
//! so reading a tree cold is one synchronous disk read per file. The files of a directory
//! written together lie together in the store's files, so one multi-get of the next files'
//! blocks brings them in with few, merged disk reads, ahead of the reader.
//!
//! Walkers go through a listing in one of two orders: as listed (`tar`, `rsync`), or by inode
//! number (`cp`, and every gnulib walker that sorts a directory's entries by inode to read
//! them faster from a disk). Each read of a listed file tells which: the file after the last
//! one read in the listing, or the file after it by inode number. The first read of a listing
//! warms ahead in both orders; later reads follow the order the walker showed.
//!
//! What: each READDIRPLUS reply records the regular files of at most [`SMALL`] bytes it
//! carried. When one of them is read from offset 0, the next [`AHEAD`] small files after it,
//! in the walker's order, are warmed in the background (`Volume::warm_files`), unless an
//! earlier read already asked for them; a reader still more than half of that ahead of the
//! last file asked for asks for nothing, so warming goes in batches. A listing nobody reads
//! from (`ls -l`, `du`, `find`) costs no disk read. Only positions are kept: the last
//! [`LISTINGS`] listings, each up to [`MAX_FILES`] files.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Files up to this size are warmed whole (the size the volume warms a file whole at).
pub(crate) const SMALL: u64 = crate::volume::SMALL_FILE;
/// Files warmed ahead of the one being read.
const AHEAD: usize = 32;
/// Listings remembered (one per directory being walked, several for a parallel walk).
const LISTINGS: usize = 8;
/// Files remembered per listing.
const MAX_FILES: usize = 4096;

/// The orders a walker reads a listing's files in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// As the listing gave them.
    Listed,
    /// By inode number.
    Inode,
}

/// One listing's small files and which of them were asked for.
struct Listing {
    /// The open directory handle it came from (a reply from offset 0 starts it again).
    dir: u64,
    /// `(ino, size)` in listing order; the other vectors are indexed by position here.
    files: Vec<(u64, u64)>,
    /// Positions in `files` by inode number (rebuilt at a read after a new reply).
    by_inode: Vec<usize>,
    /// Each file's place in `by_inode`.
    rank: Vec<usize>,
    /// Files read or warmed already.
    asked: Vec<bool>,
    /// The file read last.
    last: Option<usize>,
    /// The order the walker showed (none before its second read).
    order: Option<Order>,
}

impl Listing {
    fn new(dir: u64) -> Self {
        Self {
            dir,
            files: Vec::new(),
            by_inode: Vec::new(),
            rank: Vec::new(),
            asked: Vec::new(),
            last: None,
            order: None,
        }
    }

    /// The position in `files` of the `n`th file in `order`.
    fn nth(&self, order: Order, n: usize) -> usize {
        match order {
            Order::Listed => n,
            Order::Inode => self.by_inode[n],
        }
    }

    /// Where the file at `i` comes in `order`.
    fn place(&self, order: Order, i: usize) -> usize {
        match order {
            Order::Listed => i,
            Order::Inode => self.rank[i],
        }
    }

    fn sort_by_inode(&mut self) {
        if self.by_inode.len() == self.files.len() {
            return;
        }
        let mut by_inode: Vec<usize> = (0..self.files.len()).collect();
        by_inode.sort_unstable_by_key(|&i| self.files[i].0);
        self.rank = vec![0; by_inode.len()];
        for (r, &i) in by_inode.iter().enumerate() {
            self.rank[i] = r;
        }
        self.by_inode = by_inode;
    }

    /// The file at `i` is read from its start: the files to warm now.
    fn reading(&mut self, i: usize) -> Vec<(u64, u64)> {
        self.sort_by_inode();
        if let Some(last) = self.last {
            if i == last + 1 {
                self.order = Some(Order::Listed);
            } else if self.rank[i] == self.rank[last] + 1 {
                self.order = Some(Order::Inode);
            }
        }
        self.last = Some(i);
        self.asked[i] = true;
        let orders = match self.order {
            Some(order) => vec![order],
            None => vec![Order::Listed, Order::Inode],
        };
        let mut warm = Vec::new();
        for order in orders {
            let next = self.place(order, i) + 1;
            let end = |ahead: usize| (next + ahead).min(self.files.len());
            // Ask once the reader is within half a batch of the files not asked for yet.
            if (next..end(AHEAD / 2)).all(|n| self.asked[self.nth(order, n)]) {
                continue;
            }
            for n in next..end(AHEAD) {
                let j = self.nth(order, n);
                if !self.asked[j] {
                    self.asked[j] = true;
                    warm.push(self.files[j]);
                }
            }
        }
        warm
    }
}

/// The recent listings of one mount.
#[derive(Default)]
pub(crate) struct ListingPrefetch {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Oldest first.
    listings: VecDeque<Listing>,
    /// Where a file sits: (its listing's directory handle, its index there).
    at: HashMap<u64, (u64, usize)>,
}

impl ListingPrefetch {
    /// Records the small regular files `(ino, size)` one READDIRPLUS reply on the directory
    /// handle `dir` carried, after those of its earlier replies (`first_reply`: the reply
    /// from offset 0, which starts the listing again).
    pub(crate) fn listed(&self, dir: u64, first_reply: bool, files: &[(u64, u64)]) {
        if files.is_empty() && !first_reply {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *g;
        let found = inner.listings.iter().position(|l| l.dir == dir);
        let index = match found {
            Some(i) if !first_reply => i,
            other => {
                if let Some(i) = other {
                    let old = inner.listings.remove(i).expect("listing at its index");
                    forget(&mut inner.at, &old);
                }
                if inner.listings.len() >= LISTINGS {
                    let old = inner.listings.pop_front().expect("a listing to drop");
                    forget(&mut inner.at, &old);
                }
                inner.listings.push_back(Listing::new(dir));
                inner.listings.len() - 1
            }
        };
        let listing = &mut inner.listings[index];
        for &(ino, size) in files {
            if listing.files.len() >= MAX_FILES {
                break;
            }
            inner.at.insert(ino, (dir, listing.files.len()));
            listing.files.push((ino, size));
            listing.asked.push(false);
        }
    }

    /// A read of `ino` from offset 0: the files to warm now, `(ino, size)` (empty unless
    /// `ino` was listed and the files after it in the walker's order are not asked for yet).
    pub(crate) fn reading(&self, ino: u64) -> Vec<(u64, u64)> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *g;
        let Some(&(dir, i)) = inner.at.get(&ino) else {
            return Vec::new();
        };
        let Some(listing) = inner.listings.iter_mut().find(|l| l.dir == dir) else {
            return Vec::new();
        };
        listing.reading(i)
    }
}

fn forget(at: &mut HashMap<u64, (u64, usize)>, listing: &Listing) {
    for &(ino, _) in &listing.files {
        if at.get(&ino).is_some_and(|&(d, _)| d == listing.dir) {
            at.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(range: std::ops::Range<u64>) -> Vec<(u64, u64)> {
        range.map(|i| (i, 4096)).collect()
    }

    #[test]
    fn reading_a_listed_file_warms_the_next_ones_once() {
        let p = ListingPrefetch::default();
        p.listed(1, true, &files(100..150));
        p.listed(1, false, &files(150..200));
        let first = p.reading(100);
        assert_eq!(first, files(101..133), "the 32 after the file read");
        assert!(p.reading(101).is_empty(), "already asked for");
        assert!(p.reading(115).is_empty(), "still more than 16 ahead");
        assert_eq!(
            p.reading(117),
            files(133..150),
            "the reader near the edge: up to 32 on"
        );
        assert_eq!(
            p.reading(190),
            files(191..200),
            "a jump ahead: the rest of the listing"
        );
        assert!(p.reading(199).is_empty(), "nothing after the last file");
        // A listing started again replaces its old positions; other listings are kept.
        p.listed(2, true, &files(300..310));
        p.listed(1, true, &files(400..402));
        assert!(p.reading(100).is_empty(), "the old listing is gone");
        assert_eq!(p.reading(400), files(401..402));
        assert_eq!(p.reading(300), files(301..310));
        assert!(p.reading(999).is_empty(), "an unlisted file");
    }

    #[test]
    fn a_walker_in_inode_order_is_warmed_in_inode_order() {
        // Listed by name, numbered in another order: the listing's 100 files carry the inode
        // numbers 1000 + (37 * k) % 100, so inode order jumps about the listing.
        let p = ListingPrefetch::default();
        let listed: Vec<(u64, u64)> = (0..100u64).map(|k| (1000 + (37 * k) % 100, 4096)).collect();
        p.listed(7, true, &listed);
        let inos = |w: &[(u64, u64)]| {
            let mut v: Vec<u64> = w.iter().map(|f| f.0).collect();
            v.sort_unstable();
            v
        };
        // First read (the lowest inode, listed first here too): both orders are warmed.
        let first = p.reading(1000);
        let mut both: Vec<u64> = (1001..1033).collect();
        both.extend(listed[1..33].iter().map(|f| f.0).filter(|i| *i >= 1033));
        both.sort_unstable();
        assert_eq!(
            inos(&first),
            both,
            "the next 32 by inode and the next 32 listed"
        );
        // The walker goes on by inode number: from now on only that order is warmed, in
        // batches, each file once, all of them before the walker gets to them.
        let mut asked: std::collections::HashSet<u64> = inos(&first).into_iter().collect();
        let mut batches = 0;
        for ino in 1001..1100 {
            assert!(asked.contains(&ino), "{ino} warmed before it is read");
            let got = inos(&p.reading(ino));
            assert!(
                got.iter()
                    .all(|i| (ino + 1..=ino + 32).contains(i) && asked.insert(*i)),
                "read {ino}: {got:?} are not the next ones by inode, or asked for twice"
            );
            batches += usize::from(!got.is_empty());
        }
        assert!(
            (3..=6).contains(&batches),
            "{batches} batches of about 16 files"
        );
    }
}
