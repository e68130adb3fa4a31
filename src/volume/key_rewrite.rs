//! A tenant's store written again under its writing key (`tenant rotate-key --rewrite`).
//!
//! Why: a rotation seals the files written from then on under a new key, and the files
//! written before keep theirs; a tenant whose old key may have leaked wants none of its data
//! readable under that key any more. The rewrite moves the live chunks of every extent file
//! sealed under another key into the open one (as a collection moves chunks: each swapped
//! under its inode's lock only if no write changed it meanwhile, so it runs beside the
//! tenant's own writes) and lets go of those files, then has RocksDB write every table and
//! blob file again. What a snapshot or a fork shares keeps its old key in their files: the
//! tenant's store only stops naming them, and its ring keeps the older keys (a restore of a
//! snapshot reads them).

use std::path::PathBuf;

use super::extent_gc::{chunks_in, live_bytes, move_chunks};
use super::{Result, Volume};
use crate::store::StoreError;

/// What a rewrite did, and what is left under other keys.
#[derive(Clone, Debug, Default)]
pub struct KeyRewrite {
    /// Bytes of bulk data moved out of extent files sealed under other keys.
    pub moved_bytes: u64,
    /// Extent files the store let go of (their space comes back unless another store links
    /// them).
    pub extent_files: u64,
    /// Files of the store still sealed under another key (none, once it has done its work).
    pub left: Vec<PathBuf>,
}

impl Volume {
    /// Writes every file of the store sealed under a key other than the ring's writing key
    /// again, under it (see the module's doc). Call after a rotation (`tenants::rotate_key`),
    /// which starts the WAL, MANIFEST and extent file under the new key, and before it
    /// [`Self::check_room_for_rewrite`] (this checks again).
    pub fn rewrite_under_writing_key(&self) -> Result<KeyRewrite> {
        self.check_room_for_rewrite()?;
        let tenant = self.tenant();
        let db = tenant.db();
        let files = db.extent_files();
        let (_, writing) = tenant.keys().ids();
        let mut done = KeyRewrite::default();
        // Pooled files (kept to be written again) are files the store holds too: given up,
        // a collection takes them with the others.
        files.empty_pool();
        let horizon = files.horizon();
        let old = files.sealed_under_others(horizon, writing)?;
        if !old.is_empty() {
            let started = std::time::Instant::now();
            done.moved_bytes = move_chunks(tenant, &self.inodes, &chunks_in(db, &old)?)?;
            db.background().report(2 * done.moved_bytes, started);
            // Crash tests stop a process here: chunks moved, the values that name their new
            // spans in the memtable only.
            fail::fail_point!("rewrite-moved");
        }
        done.extent_files = self.collect_before(horizon)?;
        db.rewrite_files()?;
        // (What is left is judged by the writing key now: after a rotation meanwhile, a
        // fork's, the files under the key this rewrite began with count as left.)
        let (_, writing) = tenant.keys().ids();
        done.left = self.files_left(writing)?;
        let extents = db.path().join("extents");
        if done.left.iter().any(|p| p.starts_with(&extents)) {
            // The volume's own collection pooled a file the moves emptied, meanwhile.
            files.empty_pool();
            done.extent_files += self.collect_before(horizon)?;
            done.left = self.files_left(writing)?;
        }
        Ok(done)
    }

    /// Refuses a rewrite (nothing changed) when the store's filesystem has less room than
    /// the store takes: a compaction of every file writes it all once more before the old
    /// files go. Callers check before they rotate, so that a refusal leaves the key as well.
    pub fn check_room_for_rewrite(&self) -> Result<()> {
        let db = self.tenant().db();
        let store_bytes = crate::fs_util::tree_bytes(db.path());
        let (free, _) = db.disk_space()?;
        if free >= store_bytes {
            return Ok(());
        }
        Err(StoreError::NoSpace {
            tenant: self.tenant().info().name.clone(),
            detail: format!(
                "rewriting its files under a new key needs about {store_bytes} bytes free on \
                 {} (what its store takes), and {free} are; nothing was changed",
                db.path().display()
            ),
        }
        .into())
    }

    /// Deletes the closed extent files before `horizon` that no value names, as a collection
    /// does: the names are taken first, then made durable (a flush), then the files go, so
    /// that no value a crash brings back names a deleted file. The files deleted.
    fn collect_before(&self, horizon: u64) -> Result<u64> {
        let db = self.tenant().db();
        let live = live_bytes(db)?;
        db.flush()?;
        Ok(db.extent_files().collect(horizon, &live, false)?.files)
    }

    /// The store's files still sealed under a key other than `writing`. RocksDB deletes the
    /// files a compaction replaced once nothing reads them (an iterator, a checkpoint
    /// running): those are waited for, up to 2 s.
    fn files_left(&self, writing: crate::crypto::KeyId) -> Result<Vec<PathBuf>> {
        let db = self.tenant().db();
        let name = &self.tenant().info().name;
        for _ in 1..20 {
            let left = crate::store::files_under_other_keys(db.path(), writing)
                .map_err(|e| StoreError::io(name, db.path(), e))?;
            if left.is_empty() {
                return Ok(left);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(crate::store::files_under_other_keys(db.path(), writing)
            .map_err(|e| StoreError::io(name, db.path(), e))?)
    }
}

#[cfg(test)]
mod tests;
