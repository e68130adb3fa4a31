//! Warming the small files of a directory listing once its files are being read in order.
//!
//! Why: `tar c`, `cp -a` and `rsync` list a directory, then read its files one after another,
//! each from its start. Each small file's first read waits for its own disk read (the
//! store's read-ahead starts within a file, and a file of a few KiB is over before it helps),
//! so reading a tree cold is one synchronous disk read per file. The files of a directory
//! written together lie together in the store's files, so one multi-get of the next files'
//! blocks brings them in with few, merged disk reads, ahead of the reader.
//!
//! What: each READDIRPLUS reply records, in listing order, the regular files of at most
//! [`SMALL`] bytes it carried. When one of them is read from offset 0, the next
//! [`AHEAD`] small files after it in its listing are warmed in the background
//! (`Volume::warm_files`), unless an earlier read already asked for them. A
//! listing nobody reads from (`ls -l`, `du`, `find`) costs no disk read. Only positions are
//! kept: the last [`LISTINGS`] listings, each up to [`MAX_FILES`] files.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Files up to this size are warmed whole (the store's first read-ahead window).
pub(crate) const SMALL: u64 = 128 << 10;
/// Files warmed ahead of the one being read.
const AHEAD: usize = 32;
/// Listings remembered (one per directory being walked, several for a parallel walk).
const LISTINGS: usize = 8;
/// Files remembered per listing.
const MAX_FILES: usize = 4096;

/// One listing's small files, in order, and how far warming has gone.
struct Listing {
    /// The open directory handle it came from (a reply from offset 0 starts it again).
    dir: u64,
    files: Vec<(u64, u64)>,
    /// Files before this index were warmed or asked for.
    warmed: usize,
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
                inner.listings.push_back(Listing {
                    dir,
                    files: Vec::new(),
                    warmed: 0,
                });
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
        }
    }

    /// A read of `ino` from offset 0: the files to warm now, `(ino, size)` in listing order
    /// (empty unless `ino` was listed and the files after it are not asked for yet).
    pub(crate) fn reading(&self, ino: u64) -> Vec<(u64, u64)> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *g;
        let Some(&(dir, i)) = inner.at.get(&ino) else {
            return Vec::new();
        };
        let Some(listing) = inner.listings.iter_mut().find(|l| l.dir == dir) else {
            return Vec::new();
        };
        // Warm the next AHEAD files once the reader is within half of them of the edge.
        if listing.warmed > i + AHEAD / 2 {
            return Vec::new();
        }
        let from = listing.warmed.max(i + 1);
        let to = (i + 1 + AHEAD).min(listing.files.len());
        listing.warmed = to.max(listing.warmed);
        listing.files.get(from..to).unwrap_or_default().to_vec()
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
}
