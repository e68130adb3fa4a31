//! The host's disk space kept back from tenants' growth: the reserve (`[store] reserve`).
//!
//! Every tenant store of a data dir shares one filesystem. Without a reserve, one tenant that
//! fills it stops every store on it: RocksDB needs room to flush and to write a delete, so
//! even a delete fails once the disk is full. With one, a write or create that would take the
//! host's free space below the reserve fails with ENOSPC in the volume, before RocksDB sees
//! a full disk; what is kept back is there for deletes, overwrites and the stores' own
//! flushes and compactions.
//!
//! The floor is the tenant's alone: below the reserve, the tenant that holds the most of the
//! host's open tenants' bytes gets ENOSPC, while the others go on growing into the first half
//! of the reserve; below half of it, every tenant's growth is refused. Free space is sampled
//! with statvfs at most every [`SAMPLE_EVERY`], and what is granted in between is taken off
//! the sample, so a burst of writes cannot pass the floor between two samples.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Deserializer};

use crate::units::ByteSize;

/// How old a free-space sample may be.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// What a new inode is taken to cost the disk, for the floor.
const INODE_BYTES: u64 = 4096;

/// How much of the data dir's filesystem to keep back: bytes, or a percentage of its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    Bytes(u64),
    Percent(u8),
}

impl Default for Reserve {
    /// ext4's own default for root: 5%.
    fn default() -> Self {
        Reserve::Percent(5)
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "invalid reserve {0:?}: write a size (2G, 512M, 0 for none) or a percentage of the \
     filesystem from 0% to 50%"
)]
pub struct ReserveError(String);

impl FromStr for Reserve {
    type Err = ReserveError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ReserveError(s.to_owned());
        match s.trim().strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 50 => Ok(Reserve::Percent(p)),
                _ => Err(err()),
            },
            None => s
                .parse::<ByteSize>()
                .map(|b| Reserve::Bytes(b.0))
                .map_err(|_| err()),
        }
    }
}

impl fmt::Display for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reserve::Bytes(b) => write!(f, "{}", ByteSize(*b)),
            Reserve::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl<'de> Deserialize<'de> for Reserve {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::units::number_or_text(d)
    }
}

impl Reserve {
    /// The bytes it keeps back on a filesystem of `total` bytes.
    pub fn bytes_of(self, total: u64) -> u64 {
        match self {
            Reserve::Bytes(b) => b,
            Reserve::Percent(p) => total / 100 * u64::from(p),
        }
    }
}

/// Why growth was refused: the host's free space is at its floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtFloor {
    pub free: u64,
    pub reserve: u64,
}

/// The data dir's filesystem, its reserve, and the bytes each open tenant holds.
pub struct HostSpace {
    dir: PathBuf,
    reserve: Reserve,
    sample: Mutex<Option<Sample>>,
    holders: Mutex<Vec<Weak<AtomicU64>>>,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    free: u64,
    total: u64,
}

impl HostSpace {
    /// The space of the filesystem holding `dir`, keeping `reserve` back.
    pub fn new(dir: &Path, reserve: Reserve) -> Arc<Self> {
        Arc::new(HostSpace {
            dir: dir.to_owned(),
            reserve,
            sample: Mutex::new(None),
            holders: Mutex::new(Vec::new()),
        })
    }

    pub fn reserve(&self) -> Reserve {
        self.reserve
    }

    /// Counts `bytes` (an open tenant's, kept current by its volume) among the holders.
    pub fn hold(&self, bytes: &Arc<AtomicU64>) {
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        holders.retain(|h| h.strong_count() > 0);
        holders.push(Arc::downgrade(bytes));
    }

    /// Whether the tenant whose bytes are `held` (as given to [`Self::hold`]) may grow by
    /// `bytes` and `inodes`; takes the growth off the free-space sample if so.
    pub fn admit(&self, held: &Arc<AtomicU64>, bytes: u64, inodes: u64) -> Result<(), AtFloor> {
        if self.reserve == Reserve::Bytes(0) {
            return Ok(());
        }
        let growth = bytes.saturating_add(inodes.saturating_mul(INODE_BYTES));
        let mut guard = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let sample = match *guard {
            Some(s) if now.duration_since(s.at) < SAMPLE_EVERY => s,
            _ => match nix::sys::statvfs::statvfs(&self.dir) {
                Ok(st) => {
                    let frag = st.fragment_size();
                    Sample {
                        at: now,
                        free: st.blocks_available() * frag,
                        total: st.blocks() * frag,
                    }
                }
                // Unknown free space refuses nothing: the store reports a full disk itself.
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "statvfs failed");
                    return Ok(());
                }
            },
        };
        let reserve = self.reserve.bytes_of(sample.total);
        let left = sample.free.saturating_sub(growth);
        let admitted = left >= reserve || (left >= reserve / 2 && !self.holds_most(held));
        *guard = Some(if admitted {
            Sample {
                free: left,
                ..sample
            }
        } else {
            sample
        });
        if admitted {
            Ok(())
        } else {
            Err(AtFloor {
                free: sample.free,
                reserve,
            })
        }
    }

    /// Whether the tenant whose bytes are `held` holds more than every other open one.
    fn holds_most(&self, held: &Arc<AtomicU64>) -> bool {
        let mine = held.load(Ordering::Acquire);
        let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        !holders
            .iter()
            .filter(|h| !std::ptr::eq(h.as_ptr(), Arc::as_ptr(held)))
            .filter_map(Weak::upgrade)
            .any(|other| other.load(Ordering::Acquire) >= mine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_a_size_or_a_percentage() {
        assert_eq!("2G".parse::<Reserve>().unwrap(), Reserve::Bytes(2 << 30));
        assert_eq!("0".parse::<Reserve>().unwrap(), Reserve::Bytes(0));
        assert_eq!(" 5% ".parse::<Reserve>().unwrap(), Reserve::Percent(5));
        for bad in ["", "-1G", "51%", "x%", "lots"] {
            let e = bad.parse::<Reserve>().unwrap_err().to_string();
            assert!(e.contains("invalid reserve"), "{bad}: {e}");
        }
        assert_eq!(Reserve::Percent(5).bytes_of(1000 << 20), 50 << 20);
        assert_eq!(Reserve::Bytes(7).to_string(), "7");
        assert_eq!(Reserve::Percent(5).to_string(), "5%");
    }

    /// Below the reserve only the largest holder is refused; below half of it, everyone.
    #[test]
    fn the_floor_stops_the_largest_tenant_first() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let st = nix::sys::statvfs::statvfs(dir.path()).unwrap();
        let free = st.blocks_available() * st.fragment_size();
        assert!(
            free > 4 << 30,
            "this test needs 4 GiB free in /var/tmp, not {free}"
        );
        // A reserve just below what is free now: 1 GiB of growth crosses it (this test is
        // meant for a filesystem with a few GiB free; the sample makes it exact).
        let space = HostSpace::new(dir.path(), Reserve::Bytes(free.saturating_sub(1 << 30)));
        let big = Arc::new(AtomicU64::new(10 << 30));
        let small = Arc::new(AtomicU64::new(1 << 20));
        space.hold(&big);
        space.hold(&small);
        // Fresh samples for each check: nothing is granted for real.
        let fresh = || *space.sample.lock().unwrap() = None;
        assert!(space.admit(&big, 512 << 20, 0).is_ok());
        fresh();
        let refused = space.admit(&big, 2 << 30, 0).unwrap_err();
        assert!(refused.free + (1 << 30) >= refused.reserve, "{refused:?}");
        fresh();
        assert!(
            space.admit(&small, 2 << 30, 0).is_ok(),
            "the small one is stopped"
        );
        fresh();
        let half = free.saturating_sub(1 << 30) / 2;
        assert!(space.admit(&small, free - half + (64 << 20), 0).is_err());
        // Inodes count too.
        fresh();
        assert!(space.admit(&big, 0, (2 << 30) / INODE_BYTES).is_err());
        // Granted growth is taken off the sample until the next one.
        fresh();
        assert!(space.admit(&big, 768 << 20, 0).is_ok());
        assert!(space.admit(&big, 512 << 20, 0).is_err());
        // Once the big one is gone, the small one holds the most.
        drop(big);
        fresh();
        assert!(space.admit(&small, 2 << 30, 0).is_err());
        // No reserve: nothing is ever refused.
        let none = HostSpace::new(dir.path(), Reserve::Bytes(0));
        assert!(none.admit(&small, u64::MAX / 2, 0).is_ok());
    }
}
