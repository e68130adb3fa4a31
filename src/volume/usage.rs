//! What the tenant's files take, charged against its quota before anything is written.
//!
//! Bytes are what `du` inside the mount counts: each regular file's size rounded up to whole
//! blocks (a file's `st_blocks` says the same), charged when a write, truncate or fallocate
//! moves its end and released when the file is freed (at its last close, as a local
//! filesystem frees it). Inodes are every inode record, the root included. An operation takes
//! its [`Charge`] before it writes: one that would pass the quota fails with EDQUOT having
//! changed nothing, and one that fails later gives its charge back when the charge drops.
//!
//! The counts live in memory while the volume is open. Closing stores them with a mark that
//! they are whole; the volume's first write clears the mark (a logged write just before it:
//! `TenantDb::put_before_first_write`, so a mount that writes nothing writes nothing), so a
//! volume that was not closed (kill -9, a crash) is counted again from its inode records at
//! the next open, and the counts are exact either way. [`Volume::check_usage`] recounts on
//! demand.
//!
//! A volume of a serving host also grows within the host's reserve (`space`): growth past
//! the floor fails with ENOSPC as growth past the quota fails with EDQUOT.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::codec::USAGE_KEY;
use super::{Attr, FileKind, Result, Volume, VolumeError};
use crate::quota::{Quota, Usage};
use crate::space::{AtFloor, HostSpace};
use crate::store::Family;

/// The stored counts' layout version.
const USAGE_VERSION: u8 = 1;
const CLOSED: u8 = 1;
const OPEN: u8 = 0;
/// No limit, as an atomic holds it.
const UNLIMITED: u64 = u64::MAX;

/// A volume's counts and quota, and the host's space it grows into.
pub(super) struct Counts {
    /// Shared with the host's space, which tells the tenants that hold the most apart.
    bytes: Arc<AtomicU64>,
    inodes: AtomicU64,
    quota_bytes: AtomicU64,
    quota_inodes: AtomicU64,
    space: OnceLock<Arc<HostSpace>>,
    /// Counted again since open (the stored counts are out of date).
    recounted: AtomicBool,
}

/// Bytes a file of `attr`'s kind and size is charged.
pub(super) fn charged_bytes(attr: &Attr, block_size: u64) -> u64 {
    match attr.kind {
        FileKind::File => attr.size.div_ceil(block_size) * block_size,
        _ => 0,
    }
}

fn limit(n: Option<NonZeroU64>) -> u64 {
    n.map_or(UNLIMITED, NonZeroU64::get)
}

fn unlimit(n: u64) -> Option<NonZeroU64> {
    (n != UNLIMITED).then(|| NonZeroU64::new(n)).flatten()
}

/// Adds `n` to `counter` unless that passes `cap`; adding nothing always succeeds.
fn add_within(counter: &AtomicU64, n: u64, cap: u64) -> bool {
    n == 0
        || counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(n).filter(|&sum| sum <= cap)
            })
            .is_ok()
}

impl Counts {
    pub(super) fn new(quota: Quota) -> Self {
        let counts = Counts {
            bytes: Arc::new(AtomicU64::new(0)),
            inodes: AtomicU64::new(0),
            quota_bytes: AtomicU64::new(UNLIMITED),
            quota_inodes: AtomicU64::new(UNLIMITED),
            space: OnceLock::new(),
            recounted: AtomicBool::new(false),
        };
        counts.set_quota(quota);
        counts
    }

    pub(super) fn set_quota(&self, quota: Quota) {
        self.quota_bytes
            .store(limit(quota.bytes), Ordering::Release);
        self.quota_inodes
            .store(limit(quota.inodes), Ordering::Release);
    }

    pub(super) fn quota(&self) -> Quota {
        Quota {
            bytes: unlimit(self.quota_bytes.load(Ordering::Acquire)),
            inodes: unlimit(self.quota_inodes.load(Ordering::Acquire)),
        }
    }

    pub(super) fn usage(&self) -> Usage {
        Usage {
            bytes: self.bytes.load(Ordering::Acquire),
            inodes: self.inodes.load(Ordering::Acquire),
        }
    }

    fn set(&self, usage: Usage) {
        self.bytes.store(usage.bytes, Ordering::Release);
        self.inodes.store(usage.inodes, Ordering::Release);
    }

    /// Grows into `space` from now on, within its reserve.
    pub(super) fn grow_into(&self, space: Arc<HostSpace>) {
        space.hold(&self.bytes);
        let _ = self.space.set(space);
    }

    /// Takes `bytes` and `inodes` within the quota and the host's reserve, or fails (EDQUOT,
    /// ENOSPC) taking nothing.
    pub(super) fn charge(&self, bytes: u64, inodes: u64) -> Result<Charge<'_>> {
        let quota_bytes = self.quota_bytes.load(Ordering::Acquire);
        if !add_within(&self.bytes, bytes, quota_bytes) {
            return Err(VolumeError::OverQuota {
                what: "bytes",
                quota: quota_bytes,
            });
        }
        let quota_inodes = self.quota_inodes.load(Ordering::Acquire);
        if !add_within(&self.inodes, inodes, quota_inodes) {
            self.release(bytes, 0);
            return Err(VolumeError::OverQuota {
                what: "inodes",
                quota: quota_inodes,
            });
        }
        let charge = Charge {
            counts: self,
            bytes,
            inodes,
        };
        if let (Some(space), true) = (self.space.get(), bytes > 0 || inodes > 0) {
            // Dropping the charge gives it back.
            space
                .admit(&self.bytes, bytes, inodes)
                .map_err(|AtFloor { free, reserve }| VolumeError::HostFull { free, reserve })?;
        }
        Ok(charge)
    }

    /// Gives back what a freed file or a shrinking write took.
    pub(super) fn release(&self, bytes: u64, inodes: u64) {
        let sub = |c: &AtomicU64, n: u64| {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_sub(n))
            });
        };
        sub(&self.bytes, bytes);
        sub(&self.inodes, inodes);
    }
}

/// What an operation took from the quota; given back when dropped unless [`Charge::keep`]
/// says the operation's changes were written.
#[must_use]
pub(super) struct Charge<'a> {
    counts: &'a Counts,
    bytes: u64,
    inodes: u64,
}

impl Charge<'_> {
    /// The operation's changes are written: what it took stays taken.
    pub(super) fn keep(mut self) {
        self.bytes = 0;
        self.inodes = 0;
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.counts.release(self.bytes, self.inodes);
    }
}

fn encode(usage: Usage, state: u8) -> [u8; 18] {
    let mut v = [0u8; 18];
    v[0] = USAGE_VERSION;
    v[1] = state;
    v[2..10].copy_from_slice(&usage.bytes.to_be_bytes());
    v[10..18].copy_from_slice(&usage.inodes.to_be_bytes());
    v
}

/// The stored counts, if the volume was closed after they were stored.
fn decode_closed(v: &[u8]) -> Option<Usage> {
    if v.len() != 18 || v[0] != USAGE_VERSION || v[1] != CLOSED {
        return None;
    }
    Some(Usage {
        bytes: u64::from_be_bytes(v[2..10].try_into().ok()?),
        inodes: u64::from_be_bytes(v[10..18].try_into().ok()?),
    })
}

impl Volume {
    /// At open: the counts stored at the last close, or, when that close did not happen, a
    /// count of the inode records. Marks them open in the WAL before any later write.
    pub(super) fn open_usage(&self) -> Result<()> {
        let stored = self.db().get(Family::Meta, USAGE_KEY)?;
        let usage = match stored.as_deref().and_then(decode_closed) {
            Some(usage) => usage,
            None => {
                let started = std::time::Instant::now();
                let usage = self.count_usage()?;
                tracing::info!(
                    tenant = %self.tenant.info().name,
                    bytes = usage.bytes,
                    inodes = usage.inodes,
                    ms = started.elapsed().as_millis() as u64,
                    "usage counted (the volume was not closed)"
                );
                usage
            }
        };
        self.counts.set(usage);
        if stored.as_deref().and_then(decode_closed).is_some() {
            // Not now: a mounted store that is never written stays without a memtable.
            self.db()
                .put_before_first_write(Family::Meta, USAGE_KEY, &encode(usage, OPEN));
        } else {
            self.counts.recounted.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// At close: stores the counts as whole (the caller syncs), unless they are stored so
    /// already (nothing was written, nothing counted again).
    pub(super) fn close_usage(&self) -> Result<()> {
        if !self.db().written_since_open() && !self.counts.recounted.load(Ordering::Acquire) {
            return Ok(());
        }
        let usage = self.counts.usage();
        self.db()
            .put(Family::Meta, USAGE_KEY, &encode(usage, CLOSED))?;
        Ok(())
    }

    /// Counts what the inode records take.
    fn count_usage(&self) -> Result<Usage> {
        let mut usage = Usage::default();
        let mut damaged = None;
        self.db()
            .range(Family::Inodes, &[0u8; 8], &[0xffu8; 9], |k, v| {
                let Some(ino) = k.try_into().ok().map(u64::from_be_bytes) else {
                    return true;
                };
                match super::codec::decode_attr(ino, v) {
                    Some((attr, _)) => {
                        usage.inodes += 1;
                        usage.bytes += charged_bytes(&attr, self.block_size);
                        true
                    }
                    None => {
                        damaged = Some(ino);
                        false
                    }
                }
            })?;
        match damaged {
            Some(ino) => Err(self.damaged(ino)),
            None => Ok(usage),
        }
    }

    /// What the tenant's files take now, as its quota counts it.
    pub fn usage(&self) -> Usage {
        self.counts.usage()
    }

    pub fn quota(&self) -> Quota {
        self.counts.quota()
    }

    /// The bytes the host's space counts this volume to hold (see `space`): kept by a mount
    /// whose store rests, so its tenant still counts among the largest.
    pub fn space_hold(&self) -> Arc<AtomicU64> {
        self.counts.bytes.clone()
    }

    /// Grows within the host's reserve from now on (see `space`).
    pub fn with_space(self, space: Arc<HostSpace>) -> Self {
        self.counts.grow_into(space);
        self
    }

    /// Applies a new quota at once: writes that would pass it fail from now on; what is
    /// already stored stays, and deletes and truncates go through.
    pub fn set_quota(&self, quota: Quota) {
        self.counts.set_quota(quota);
    }

    /// Counts the inode records again and sets the counts to what they say: returns what
    /// the counts were and what they are. Nothing may write meanwhile (the caller has the
    /// volume to itself: `tenant check` on an unmounted tenant).
    pub fn check_usage(&self) -> Result<(Usage, Usage)> {
        let before = self.counts.usage();
        let counted = self.count_usage()?;
        self.counts.set(counted);
        self.counts.recounted.store(true, Ordering::Release);
        Ok((before, counted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_past_the_quota_takes_nothing() {
        let counts = Counts::new(Quota {
            bytes: NonZeroU64::new(8192),
            inodes: NonZeroU64::new(2),
        });
        counts.charge(4096, 1).unwrap().keep();
        let err = counts.charge(8192, 0).err().expect("past the byte quota");
        assert_eq!(err.errno(), libc::EDQUOT);
        let err = counts.charge(0, 2).err().expect("past the inode quota");
        assert_eq!(err.errno(), libc::EDQUOT);
        assert_eq!(
            counts.usage(),
            Usage {
                bytes: 4096,
                inodes: 1
            }
        );
        // A charge dropped unkept (its write failed) is given back.
        drop(counts.charge(4096, 1).unwrap());
        assert_eq!(counts.usage().bytes, 4096);
        // Nothing new is always within the quota, even past it.
        counts.set_quota(Quota {
            bytes: NonZeroU64::new(1),
            inodes: None,
        });
        counts.charge(0, 5).unwrap().keep();
        assert_eq!(counts.usage().inodes, 6);
        counts.release(4096, 6);
        assert_eq!(counts.usage(), Usage::default());
    }

    #[test]
    fn only_counts_stored_at_a_close_are_trusted() {
        let usage = Usage {
            bytes: 1 << 40,
            inodes: 7,
        };
        assert_eq!(decode_closed(&encode(usage, CLOSED)), Some(usage));
        assert_eq!(decode_closed(&encode(usage, OPEN)), None);
        let mut newer = encode(usage, CLOSED);
        newer[0] = USAGE_VERSION + 1;
        assert_eq!(decode_closed(&newer), None);
    }
}
