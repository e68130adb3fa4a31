//! Files unlinked while open: the kernel's last forget frees them (`forget`, `purge`), and
//! those left when the last session ended without one are freed when the volume opens
//! (`purge_orphans`). Their keys go in point deletes when few, one range tombstone otherwise.

use super::codec::*;
use super::{usage, Result, Volume, VolumeError};
use crate::store::Family;

impl Volume {
    /// The kernel no longer references `ino`: if it has no links left, free it now.
    pub fn forget(&self, ino: u64) -> Result<()> {
        let _g = self.inodes.lock(ino);
        if self.db().get(Family::Meta, &orphan_key(ino))?.is_none() {
            return Ok(());
        }
        match self.load(ino) {
            Ok((attr, _)) if attr.nlink > 0 => Ok(()), // re-linked meanwhile
            Ok(_) | Err(VolumeError::NotFound) => self.purge(ino),
            Err(e) => Err(e),
        }
    }

    /// Deletes the keys in `[start, end)` of `family` in batch `b`: point deletes when there
    /// are few (the common case: small files, no xattrs), one range tombstone otherwise. Range
    /// tombstones are cheap to write but every later read in their range pays for them, so
    /// thousands of small files created and removed must not leave thousands of them behind.
    pub(super) fn delete_keys(
        &self,
        b: &mut crate::store::Batch<'_>,
        family: Family,
        start: &[u8],
        end: &[u8],
    ) -> Result<()> {
        self.delete_keys_where(b, family, start, end, |_| true)
    }

    /// [`Self::delete_keys`] of the keys `which` picks (the range tombstone, when there are
    /// many, takes all: callers put back what must stay later in the same batch).
    pub(super) fn delete_keys_where(
        &self,
        b: &mut crate::store::Batch<'_>,
        family: Family,
        start: &[u8],
        end: &[u8],
        which: impl Fn(&[u8]) -> bool,
    ) -> Result<()> {
        const POINT_DELETES_MAX: usize = 256;
        let mut keys = Vec::new();
        self.db().keys(family, start, end, |k| {
            if which(k) {
                keys.push(k.to_vec());
            }
            keys.len() <= POINT_DELETES_MAX
        })?;
        if keys.len() > POINT_DELETES_MAX {
            b.delete_range(family, start, end);
        } else {
            for k in keys {
                b.delete(family, &k);
            }
        }
        Ok(())
    }

    fn purge(&self, ino: u64) -> Result<()> {
        // What it takes is given back once it is gone (nothing, if its record is).
        let freed = match self.load(ino) {
            Ok((attr, _)) => Some(usage::charged_bytes(&attr, self.block_size)),
            Err(VolumeError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let mut b = self.db().batch();
        b.delete(Family::Inodes, &ino_key(ino));
        let records = std::sync::Arc::clone(&self.records);
        b.when_written(move || records.removed(ino));
        self.delete_keys(
            &mut b,
            Family::Extents,
            &extent_key(ino, 0),
            &extent_key(ino + 1, 0),
        )?;
        self.delete_keys(
            &mut b,
            Family::Meta,
            &xattr_prefix(ino),
            &xattr_prefix(ino + 1),
        )?;
        b.delete(Family::Meta, &orphan_key(ino));
        self.db().write(b)?;
        if let Some(bytes) = freed {
            self.counts.release(bytes, 1);
        }
        Ok(())
    }

    /// Frees every orphan: at open no process can still have one open.
    pub(super) fn purge_orphans(&self) -> Result<()> {
        for ino in self.orphans()? {
            self.purge(ino)?;
        }
        Ok(())
    }

    /// The files unlinked while open that are not freed yet (the kernel's forget frees them).
    pub fn orphans(&self) -> Result<Vec<u64>> {
        let mut orphans = Vec::new();
        self.db().range(Family::Meta, b"O", b"P", |k, _| {
            if k.len() == 9 {
                orphans.push(u64::from_be_bytes(k[1..9].try_into().unwrap()));
            }
            true
        })?;
        Ok(orphans)
    }
}
