//! A restore: a copy of a snapshot's store put in the place of the tenant's, in steps that a
//! crash leaves finished or undone (see [`replace_store`]).

use std::fs;
use std::path::Path;

use super::*;

/// Puts a copy of the store checkpoint at `checkpoint` (a snapshot's) in place of tenant
/// `name`'s store, with `device_size` (the snapshot's) in its record. The caller holds the
/// tenant's lock (`_closed`, from [`lock_closed`]). A crash on the way leaves the tenant as
/// it was or as restored: the next holder of its lock finishes or undoes it.
pub(crate) fn replace_store(
    root: &Path,
    name: &str,
    _closed: &TenantLock,
    checkpoint: &Path,
    device_size: Option<u64>,
) -> Result<(), TenantError> {
    let dir = tenant_dir(root, name)?;
    let _keys = crate::data_dir::hold_records(root)?;
    let mut record = read_record(&dir, name)?;
    record.device_size = device_size;
    let (copy, replaced) = (dir.join(RESTORING_DB), dir.join(REPLACED_DB));
    TenantDb::copy_checkpoint(name, checkpoint, &copy)?;
    let json = serde_json::to_vec_pretty(&record).expect("record serialises");
    let record_path = dir.join(RESTORING_RECORD);
    write_atomic(&record_path, &json, 0o600).map_err(io_err(&record_path))?;
    fail::fail_point!("restore-staged");
    let db = dir.join(DB);
    fs::rename(&db, &replaced).map_err(io_err(&db))?;
    sync_dir(&dir).map_err(io_err(&dir))?;
    fail::fail_point!("restore-swapping");
    finish_restore(name, &dir)?;
    Ok(())
}

/// Finishes a restore of the tenant in `dir` that renamed its store away, or undoes one that
/// did not get so far (see [`replace_store`]). The caller holds the tenant's lock.
pub(super) fn finish_restore(name: &str, dir: &Path) -> Result<(), TenantError> {
    let (db, copy, replaced) = (dir.join(DB), dir.join(RESTORING_DB), dir.join(REPLACED_DB));
    let record = dir.join(RESTORING_RECORD);
    if !replaced.exists() {
        // Nothing was changed: the copy (or its staging directory) and the record go.
        for path in [copy.clone(), dir.join(format!("{RESTORING_DB}.staging"))] {
            match fs::remove_dir_all(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&path)(e)),
                _ => {}
            }
        }
        match fs::remove_file(&record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&record)(e)),
            _ => {}
        }
        return Ok(());
    }
    if !db.exists() {
        fs::rename(&copy, &db).map_err(io_err(&copy))?;
    }
    if record.exists() {
        fs::rename(&record, dir.join(RECORD)).map_err(io_err(&record))?;
    }
    sync_dir(dir).map_err(io_err(dir))?;
    fs::remove_dir_all(&replaced).map_err(io_err(&replaced))?;
    tracing::info!(tenant = name, "restore finished");
    Ok(())
}
