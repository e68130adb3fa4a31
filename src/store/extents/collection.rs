//! Which extent files a store keeps and which it lets go: the pool of unnamed files written
//! again as the next ones, the collection of files no value names, and the files a
//! checkpoint links. A file another store links too (a snapshot's, a fork's) is shared:
//! never pooled, never written again, only this store's name of it goes.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{file_number, ExtentFileStats, ExtentFiles, POOL_FILES};
use crate::store::StoreError;

impl ExtentFiles {
    /// A pooled file to write the next file into, if one is unshared: one linked since it
    /// was pooled (it should not be: a snapshot links the files the store names) is let go.
    pub(super) fn reusable(&self) -> Option<PathBuf> {
        while let Some(number) = self.pool().pop() {
            let path = self.path(number);
            match std::fs::metadata(&path) {
                Ok(m) if m.nlink() == 1 => return Some(path),
                Ok(_) => {
                    tracing::warn!(tenant = %self.tenant, file = %path.display(),
                                   "a pooled extent file is linked elsewhere: not written again");
                    let _ = std::fs::remove_file(&path);
                }
                Err(_) => {}
            }
        }
        None
    }

    pub(super) fn pool(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds off reads (the write side of [`Self::read_guard`]) without queueing them: a
    /// waiting writer of a `RwLock` makes new readers wait too, so while reads hold the
    /// lock (a read-ahead job holds it for its whole lookup and disk read, and runs below
    /// requests) this looks again every millisecond, and waits in the queue only after a
    /// second of reads that never let go.
    fn no_reads(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            match self.deleting.try_write() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if std::time::Instant::now() >= deadline {
                        return self.deleting.write().unwrap_or_else(|p| p.into_inner());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
    }

    /// Holds collections off until dropped (a checkpoint's, from before RocksDB's part until
    /// its extent files are linked).
    pub(crate) fn hold_collection(&self) -> std::sync::MutexGuard<'_, ()> {
        self.collecting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the open file (waiting for every file closed in the background, and failing
    /// if one could not be synced) and links every closed file that is not pooled into
    /// `dir`: all of them under the open file's lock, so no pooled file is taken as the next
    /// one meanwhile (it is renamed when reused). The caller holds collections off. Returns
    /// the files linked.
    pub(crate) fn link_closed_into(&self, dir: &Path) -> Result<usize, StoreError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        self.close_open(&mut open)?;
        let horizon = self.next_number.load(Ordering::Relaxed);
        let pool = self.pool().clone();
        let mut linked = 0;
        for f in list(&self.tenant, &self.dir)? {
            if f.number >= horizon || pool.contains(&f.number) {
                continue;
            }
            if linked == 0 {
                std::fs::create_dir(dir).map_err(|e| StoreError::io(&self.tenant, dir, e))?;
            }
            let to = dir.join(self.name_of(f.number));
            std::fs::hard_link(self.path(f.number), &to)
                .map_err(|e| StoreError::io(&self.tenant, &to, e))?;
            linked += 1;
        }
        Ok(linked)
    }

    /// The first file a collection must leave alone: the open file, or the next one. Taken
    /// before the owner looks for live spans: files before it take no new spans (appends go to
    /// the open file only), so one no span named then stays unnamed.
    pub(crate) fn horizon(&self) -> u64 {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.as_ref()
            .map_or_else(|| self.next_number.load(Ordering::Relaxed), |o| o.number)
    }

    /// Stops keeping the pooled files: a collection can take them (writes have stopped
    /// rolling files over, the pool's reason).
    pub(crate) fn empty_pool(&self) {
        self.pool().clear();
    }

    /// The files before `horizon` that are not pooled: number and size on disk.
    pub(crate) fn closed_before(&self, horizon: u64) -> Result<Vec<Listed>, StoreError> {
        let pool = self.pool().clone();
        let mut files = list(&self.tenant, &self.dir)?;
        files.retain(|f| f.number < horizon && !pool.contains(&f.number));
        Ok(files)
    }

    /// The files before `horizon` whose headers name a key other than `writing` (or no key:
    /// a file from before keyrings): what a rewrite under the writing key moves out of.
    pub(crate) fn sealed_under_others(
        &self,
        horizon: u64,
        writing: crate::crypto::KeyId,
    ) -> Result<std::collections::HashSet<u64>, StoreError> {
        let mut out = std::collections::HashSet::new();
        for f in self.closed_before(horizon)? {
            let path = self.path(f.number);
            match crate::store::file_key_id(&path) {
                Ok(Some(id)) if id == writing => {}
                Ok(_) => {
                    out.insert(f.number);
                }
                // Collected since the listing, or shorter than a header (a file a crash cut
                // short as it was made: no span names it).
                Err(_) if !path.exists() => {}
                Err(detail) => {
                    tracing::warn!(tenant = %self.tenant, file = %path.display(), %detail,
                                   "an extent file without a readable header is left as it is");
                }
            }
        }
        Ok(out)
    }

    /// The bytes of the files before `horizon` that `live` does not name and that are not
    /// pooled (what a collection would take).
    pub(crate) fn unnamed_before(
        &self,
        horizon: u64,
        live: &HashMap<u64, u64>,
    ) -> Result<u64, StoreError> {
        Ok(self
            .closed_before(horizon)?
            .iter()
            .filter(|f| !live.contains_key(&f.number))
            .map(|f| f.bytes)
            .sum())
    }

    /// Deletes (or, when `pool`, pools up to [`POOL_FILES`], to be written again) every
    /// extent file before `horizon` ([`Self::horizon`], taken before `live`) that `live` (the
    /// live bytes per file named by a reference, as the owner found them) does not name. The
    /// owner has made that state durable first, so that no reference to a taken file comes
    /// back after a crash. A file another store links too ([`Listed::shared`]) is never
    /// pooled: only this store's name of it goes. Returns the files taken and the bytes given
    /// back to the disk (a shared file's none).
    pub(crate) fn collect(
        &self,
        horizon: u64,
        live: &HashMap<u64, u64>,
        pool: bool,
    ) -> Result<ExtentFileStats, StoreError> {
        let _one = self.hold_collection();
        // A file still being closed in the background is not pooled or deleted under its
        // closer (which trims it at the end).
        drop(self.retired_wait());
        let _no_reads = self.no_reads();
        let mut gone = ExtentFileStats::default();
        for Listed {
            number,
            bytes,
            shared,
        } in list(&self.tenant, &self.dir)?
        {
            if number >= horizon || live.contains_key(&number) || self.pool().contains(&number) {
                continue;
            }
            self.readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&number);
            if pool && !shared {
                let mut pool = self.pool();
                if pool.len() < POOL_FILES {
                    pool.push(number);
                    gone.files += 1;
                    gone.bytes += bytes;
                    continue;
                }
            }
            let path = self.path(number);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    // A shared file's bytes stay on the disk for the other store.
                    gone.files += 1;
                    gone.bytes += if shared { 0 } else { bytes };
                    fail::fail_point!("extent-file-deleted");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&self.tenant, &path, e)),
            }
        }
        Ok(gone)
    }

    /// The paths of the pooled files (tests).
    #[cfg(test)]
    pub(crate) fn pooled(&self) -> Vec<PathBuf> {
        self.pool().iter().map(|&n| self.path(n)).collect()
    }
}

/// The extent files in `dir`: number and size on disk.
/// An extent file found in a store's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    pub number: u64,
    pub bytes: u64,
    /// Another store (a snapshot, a fork) links the file too: it is never written again
    /// (pooled) or emptied by moves, which would free nothing and copy what it holds.
    pub shared: bool,
}

pub(super) fn list(tenant: &str, dir: &Path) -> Result<Vec<Listed>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io(tenant, dir, e)),
    };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        if let Some(number) = entry.file_name().to_str().and_then(file_number) {
            let meta = entry.metadata().ok();
            files.push(Listed {
                number,
                bytes: meta.as_ref().map_or(0, |m| m.len()),
                shared: meta.is_some_and(|m| m.nlink() > 1),
            });
        }
    }
    Ok(files)
}
