//! A store's checkpoint: the store as it was at one instant, in a directory of its own, that
//! shares the store's immutable files instead of copying them.
//!
//! Why: snapshots, restores and forks of a tenant cost what the tenant writes afterwards, not
//! what it holds. RocksDB's checkpoint hard-links the table, blob and options files (they are
//! never changed once written) and copies the MANIFEST and CURRENT; tenantfs links the
//! closed extent files itself (RocksDB knows nothing of them), and never leaves a WAL linked:
//! RocksDB truncates the last WAL when it opens a store, which would change the other side's.
//! Shared files stay shared: nothing in a store writes a file with a second link again
//! (`extents`: the pool, the moves of a collection).
//!
//! How ([`create`]): with extent collection held off, RocksDB's checkpoint into a staging
//! directory: while the store's WALs hold at most [`WAL_COPY_LIMIT`], they are copied (a
//! copy is replayed when the checkpoint opens) rather than the memtables flushed, which
//! would write, sync and install table files first (a flush took 60-70% of a checkpoint's
//! 15-35 ms here); past it, or when a write that skipped the WAL (bulk data:
//! `TenantDb::write_unlogged`) is in a memtable, the memtables are flushed and the
//! checkpoint holds their table files. Then, under the open extent file's lock, that file is closed (and every file
//! closed in the background waited for), so that every file the checkpoint's values can name
//! is closed and synced, and those are linked; each linked WAL is replaced by a copy; the
//! directories are synced and the staging directory renamed to the target. A failure
//! removes the staging directory; a crash before the rename leaves it (and RocksDB's
//! `.tmp`), which the next attempt removes.
//!
//! The checkpoint is exact for writes acknowledged before the call; a writer running during
//! it may leave its write in or out (a caller that needs one instant holds writes off).

use std::path::{Path, PathBuf};

use super::{ExtentFiles, StoreError};

/// WAL bytes a checkpoint copies rather than flush the memtables (each copy is the
/// checkpoint's own: it counts against its size, which snapshots keep under 256 KiB).
const WAL_COPY_LIMIT: u64 = 128 << 10;

/// Writes a checkpoint of `db` (tenant `tenant`'s store, its extent files `extents`) into
/// `target`, which must not exist yet and must be on the store's filesystem (links do not
/// cross filesystems: RocksDB would copy every file instead).
pub(super) fn create(
    db: &rocksdb::DB,
    tenant: &str,
    extents: &ExtentFiles,
    target: &Path,
    flush: bool,
) -> Result<(), StoreError> {
    // One checkpoint of the store at a time, and no collection until its files are linked.
    let _no_collection = extents.hold_collection();
    stage_into(tenant, target, "a checkpoint", |staging| {
        // RocksDB builds its part in `STAGING.tmp`, which an attempt that ended early left.
        remove_if_there(&tmp_of(staging)).map_err(io_error(tenant, &tmp_of(staging)))?;
        let staged = stage(db, tenant, extents, staging, flush);
        if staged.is_err() {
            let _ = std::fs::remove_dir_all(tmp_of(staging));
        }
        staged?;
        fail::fail_point!("checkpoint-staged");
        Ok(())
    })
}

/// Writes a copy of the checkpoint at `source` (a directory [`create`] made, never opened as
/// a store) into `target`, which must not exist yet, on the same filesystem: its table, blob,
/// options and extent files linked (none of them is ever written again), everything else
/// (MANIFEST, CURRENT, IDENTITY, WALs: a store opened there writes them) copied. Staged and
/// renamed into place as [`create`] is; `source` is only read.
pub(super) fn copy(tenant: &str, source: &Path, target: &Path) -> Result<(), StoreError> {
    stage_into(tenant, target, "a store", |staging| {
        copy_dir(source, staging, true).map_err(|(path, e)| io_error(tenant, &path)(e))?;
        fail::fail_point!("checkpoint-copy-staged");
        Ok(())
    })
}

/// Builds a store directory at `target` (which must not hold `what` yet) through `build`,
/// which fills the staging directory it is given: what an earlier attempt left there is
/// removed first, what a failed one leaves is removed after, and a whole one is renamed into
/// place and the rename synced.
fn stage_into(
    tenant: &str,
    target: &Path,
    what: &str,
    build: impl FnOnce(&Path) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let io = |path: &Path| io_error(tenant, path);
    if target.exists() {
        return Err(StoreError::io(
            tenant,
            target,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{what} is there already; delete it or choose another name"),
            ),
        ));
    }
    let staging = staging_of(target);
    remove_if_there(&staging).map_err(io(&staging))?;
    let built = build(&staging);
    if built.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    built?;
    std::fs::rename(&staging, target).map_err(io(target))?;
    let parent = target.parent().unwrap_or(Path::new("."));
    sync_dir(parent).map_err(io(parent))
}

/// Removes directory `dir` and what it holds, if it is there.
fn remove_if_there(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether a store file named `name` is never written again once it has its name: table,
/// blob and options files (RocksDB writes each once) and extent files (`extents` never
/// writes one with a second link). `in_extents`: it is in the store's `extents` directory.
fn immutable(name: &str, in_extents: bool) -> bool {
    in_extents || name.ends_with(".sst") || name.ends_with(".blob") || name.starts_with("OPTIONS-")
}

/// [`copy`]'s work, into `to` (created), synced; an error names the path it is about.
fn copy_dir(from: &Path, to: &Path, top: bool) -> Result<(), (PathBuf, std::io::Error)> {
    let at = |path: &Path| {
        let path = path.to_owned();
        move |e| (path, e)
    };
    std::fs::create_dir(to).map_err(at(to))?;
    for entry in std::fs::read_dir(from).map_err(at(from))? {
        let entry = entry.map_err(at(from))?;
        let (path, name) = (entry.path(), entry.file_name());
        let dest = to.join(&name);
        let name = name.to_string_lossy();
        if entry.file_type().map_err(at(&path))?.is_dir() {
            if top && name == "extents" {
                copy_dir(&path, &dest, false)?;
            }
            continue;
        }
        let linked = match immutable(&name, !top) {
            true => std::fs::hard_link(&path, &dest),
            false => Err(std::io::ErrorKind::Unsupported.into()),
        };
        // A file at the filesystem's most links (65,000 on ext4: a base's template under as
        // many tenants, snapshots and forks) is copied instead.
        if linked
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EMLINK))
        {
            std::fs::copy(&path, &dest).map_err(at(&dest))?;
            std::fs::File::open(&dest)
                .and_then(|f| f.sync_all())
                .map_err(at(&dest))?;
        } else if immutable(&name, !top) {
            linked.map_err(at(&dest))?;
        } else if !(name == "LOCK" || name.starts_with("LOG")) {
            std::fs::copy(&path, &dest).map_err(at(&dest))?;
            std::fs::File::open(&dest)
                .and_then(|f| f.sync_all())
                .map_err(at(&dest))?;
        }
    }
    sync_dir(to).map_err(at(to))
}

/// RocksDB's checkpoint into `staging`, the extent files linked, the WALs unshared, synced.
fn stage(
    db: &rocksdb::DB,
    tenant: &str,
    extents: &ExtentFiles,
    staging: &Path,
    flush: bool,
) -> Result<(), StoreError> {
    let io = |path: &Path| io_error(tenant, path);
    let checkpoint = rocksdb::checkpoint::Checkpoint::new(db)
        .map_err(|e| StoreError::from_rocksdb(tenant, "checkpoint", e))?;
    checkpoint
        .create_checkpoint_with_log_size(staging, if flush { 0 } else { WAL_COPY_LIMIT })
        .map_err(|e| StoreError::from_rocksdb(tenant, "checkpoint", e))?;
    drop(checkpoint);
    fail::fail_point!("checkpoint-rocksdb-done");
    let dir = staging.join("extents");
    if extents.link_closed_into(&dir)? > 0 {
        sync_dir(&dir).map_err(io(&dir))?;
    }
    unshare_wals(staging).map_err(io(staging))?;
    sync_dir(staging).map_err(io(staging))
}

/// Where a checkpoint into `target` is built.
fn staging_of(target: &Path) -> PathBuf {
    with_suffix(target, ".staging")
}

/// Where RocksDB builds its part of a checkpoint into `staging`.
fn tmp_of(staging: &Path) -> PathBuf {
    with_suffix(staging, ".tmp")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    path.with_file_name(name)
}

/// Replaces each WAL in `dir` that is linked elsewhere by a copy of its bytes (still the
/// same ciphertext under the same file key, which its header holds).
fn unshare_wals(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "log") || std::fs::metadata(&path)?.nlink() < 2 {
            continue;
        }
        let copy = path.with_extension("log.copy");
        std::fs::copy(&path, &copy)?;
        std::fs::File::open(&copy)?.sync_all()?;
        std::fs::rename(&copy, &path)?;
    }
    Ok(())
}

/// Turns an I/O error on `path` into the store's error.
fn io_error<'a>(tenant: &'a str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    let path = path.to_owned();
    move |e| StoreError::io(tenant, &path, e)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_directory_is_a_sibling_of_the_target() {
        assert_eq!(
            staging_of(Path::new("/d/snapshots/s1")),
            PathBuf::from("/d/snapshots/s1.staging")
        );
    }

    #[test]
    fn a_linked_wal_is_replaced_by_a_copy_and_others_are_left() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let (dir, other) = (tmp.path().join("cp"), tmp.path().join("src"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("000007.log"), b"wal bytes").unwrap();
        std::fs::hard_link(other.join("000007.log"), dir.join("000007.log")).unwrap();
        std::fs::write(other.join("000009.sst"), b"table").unwrap();
        std::fs::hard_link(other.join("000009.sst"), dir.join("000009.sst")).unwrap();
        unshare_wals(&dir).unwrap();
        let nlink = |p: PathBuf| std::fs::metadata(p).unwrap().nlink();
        assert_eq!(nlink(dir.join("000007.log")), 1);
        assert_eq!(nlink(other.join("000007.log")), 1);
        assert_eq!(std::fs::read(dir.join("000007.log")).unwrap(), b"wal bytes");
        assert_eq!(
            nlink(dir.join("000009.sst")),
            2,
            "a table file stays shared"
        );
        assert!(!dir.join("000007.log.copy").exists());
    }
}
