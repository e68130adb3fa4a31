//! A tenant's keys: its ring unwrapped from its record, rotations (a new writing key), the
//! ring a fork starts with, and the shred that destroys them (see ARCHITECTURE.md, "Key
//! hierarchy").

use std::fs;
use std::path::Path;

use super::*;

/// The tenant's keys, unwrapped under the data dir's master key.
pub(super) fn keyring(
    data: &DataDir,
    name: &str,
    dir: &Path,
    record: &TenantRecord,
) -> Result<Keyring, TenantError> {
    let bad = |detail: String| TenantError::BadRecord {
        name: name.to_owned(),
        path: dir.join(RECORD),
        detail,
    };
    let mut keys = Vec::with_capacity(record.keys.len());
    for k in &record.keys {
        let id = KeyId::from_hex(&k.id).ok_or_else(|| bad(format!("key id {:?}", k.id)))?;
        let wrapped = hex::decode(&k.wrapped).map_err(|e| bad(e.to_string()))?;
        let master = data.master_key();
        // During a master key rotation a key has a second seal: the one under the new key.
        let next = match &k.wrapped_next {
            Some(n) => Some(hex::decode(n).map_err(|e| bad(e.to_string()))?),
            None => None,
        };
        let key = master
            .unwrap_tenant_key(name, &wrapped)
            .or_else(|| next.and_then(|n| master.unwrap_tenant_key(name, &n)))
            .ok_or_else(|| TenantError::WrongKey(name.to_owned()))?;
        keys.push((id, key));
    }
    let writing = record
        .writing_key
        .as_deref()
        .and_then(KeyId::from_hex)
        .ok_or_else(|| bad("no writing key".into()))?;
    Keyring::new(keys, writing)
        .ok_or_else(|| bad("its key ids repeat, or lack the writing key".into()))
}

/// Moves tenant `tenant` (open in this process) to a new key: its files written from now on
/// are sealed under it (the store starts new files at once); those written before keep
/// theirs, which stay in its ring. Returns the new key's id.
pub fn rotate_key(data: &DataDir, tenant: &Tenant) -> Result<KeyId, TenantError> {
    rotate_key_lowered(data, tenant, None)
}

/// [`rotate_key`]; the store's MANIFEST limits are `lowered` already, or lowered once the
/// key has moved (so the OPTIONS file RocksDB writes then is under the new key too).
fn rotate_key_lowered(
    data: &DataDir,
    tenant: &Tenant,
    lowered: Option<crate::store::ManifestLimitsLowered>,
) -> Result<KeyId, TenantError> {
    let id = {
        let _one = record_changes();
        let (id, key) = add_key(data, &tenant.info.name)?;
        tenant.keys.rotate_to(id, key);
        id
    };
    let lowered = match lowered {
        Some(l) => l,
        None => tenant.db.lower_manifest_limits()?,
    };
    tenant.db.start_new_files(&id.0, lowered)?;
    Ok(id)
}

/// [`rotate_key`] of tenant `name`, which no process has open: its store starts using the
/// new key when it next opens.
pub fn rotate_key_closed(data: &DataDir, name: &str) -> Result<KeyId, TenantError> {
    tenant_dir(data.root(), name)?;
    let _closed = lock_closed(data.root(), name)?;
    let _one = record_changes();
    Ok(add_key(data, name)?.0)
}

/// A new key in tenant `name`'s record, as its writing key (the record replaced atomically:
/// a crash leaves the old ring or the new one). The caller holds the tenant's lock and
/// [`record_changes`].
fn add_key(data: &DataDir, name: &str) -> Result<(KeyId, TenantKey), TenantError> {
    let _keys = data.hold_keys()?;
    let (id, key) = (KeyId::generate()?, TenantKey::generate()?);
    let wrapped = hex::encode(data.master_key().wrap_tenant_key(name, &key)?);
    rewrite_record_held(data.root(), name, |r| {
        r.keys.push(RecordKey {
            id: id.to_hex(),
            wrapped,
            base: false,
            wrapped_next: None,
        });
        r.writing_key = Some(id.to_hex());
    })?;
    fail::fail_point!("key-added");
    Ok((id, key))
}

/// Creates tenant `new` as a fork of `source` (open in this process): its store is what
/// `stage_db` writes into the directory it is given (a checkpoint of the source's store, or
/// a copy of one of its snapshots), its ring the source's keys (to read the files it
/// shares) and a key of its own that seals everything it writes; it takes the source's block
/// size, base and quota, and `device_size`. The source then moves to a new key
/// ([`rotate_key`]) before the fork appears, so the fork holds no key to anything the source
/// writes after it. A crash leaves no fork (only a hidden staging directory) and the source
/// whole, perhaps on its new key.
pub(crate) fn create_fork(
    data: &DataDir,
    source: &Tenant,
    new: &str,
    device_size: Option<u64>,
    stage_db: impl FnOnce(&Path) -> Result<(), TenantError>,
) -> Result<TenantInfo, TenantError> {
    create_staged(new, data, |staging| {
        // The source's MANIFEST limits lowered for its move to a new key while the store is
        // staged (both mostly wait on the disk).
        let (staged, lowered) = std::thread::scope(|s| {
            let lowering = s.spawn(|| source.db.lower_manifest_limits());
            let staged = stage_db(&staging.join(DB));
            let lowered = lowering
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (staged, lowered)
        });
        staged?;
        let lowered = lowered?;
        fail::fail_point!("fork-staged");
        let name = &source.info.name;
        let from = read_record(&tenant_dir(data.root(), name)?, name)?;
        let mut read = Vec::new();
        source.keys.for_each(|id, key| {
            let base = from.keys.iter().any(|k| k.base && k.id == id.to_hex());
            read.push((id, key.clone(), base));
        });
        let (keys, own_id, _) = ring_for(data, new, &read)?;
        rotate_key_lowered(data, source, Some(lowered))?;
        fail::fail_point!("fork-rotated");
        let like = NewTenant {
            block_size: None,
            base: from.base.as_deref(),
            device_size,
            quota: from.quota,
        };
        Ok(TenantRecord::new(new, from.block_size, keys, own_id, &like))
    })
}

/// The record keys of new tenant `new`: `read` (id, key, whether its base's), the keys of
/// the files it starts with, each wrapped again for it, and a key of its own that seals what
/// it writes; and that key (id and key).
fn ring_for(
    data: &DataDir,
    new: &str,
    read: &[(KeyId, TenantKey, bool)],
) -> Result<(Vec<RecordKey>, KeyId, TenantKey), TenantError> {
    let wrap = |key: &TenantKey| -> Result<String, TenantError> {
        Ok(hex::encode(data.master_key().wrap_tenant_key(new, key)?))
    };
    let mut keys = Vec::with_capacity(read.len() + 1);
    for (id, key, base) in read {
        keys.push(RecordKey {
            id: id.to_hex(),
            wrapped: wrap(key)?,
            base: *base,
            wrapped_next: None,
        });
    }
    let (own_id, own) = (KeyId::generate()?, TenantKey::generate()?);
    keys.push(RecordKey {
        id: own_id.to_hex(),
        wrapped: wrap(&own)?,
        base: false,
        wrapped_next: None,
    });
    Ok((keys, own_id, own))
}

/// Creates tenant `name` as `like` says (block size and all) from a store that `stage_db`
/// writes into the directory it is given (a copy of a base's template: `base::template`),
/// whose files are sealed under `base_key` (id and key), which its ring holds as its base's,
/// beside a key of its own for what it writes. `stage_db` also gets that ring, to change the
/// store before the tenant appears (a block volume's device made from the image).
pub(crate) fn create_from_base_store<E: From<TenantError>>(
    data: &DataDir,
    name: &str,
    like: &NewTenant,
    base_key: (KeyId, &TenantKey),
    stage_db: impl FnOnce(&Path, Arc<Keyring>) -> Result<(), E>,
) -> Result<TenantInfo, E> {
    let block_size = validate_block_size(like.block_size.unwrap_or(DEFAULT_BLOCK_SIZE as u64))?;
    create_staged(name, data, |staging| {
        let base = [(base_key.0, base_key.1.clone(), true)];
        let (keys, own_id, own) = ring_for(data, name, &base)?;
        let ring = Keyring::new(
            vec![(base_key.0, base_key.1.clone()), (own_id, own)],
            own_id,
        )
        .ok_or_else(|| TenantError::BadRecord {
            name: name.to_owned(),
            path: staging.join(RECORD),
            detail: "its own key's id is its base's".into(),
        })?;
        // (A tenant made from a base store is its own from here: no source to rotate.)
        stage_db(&staging.join(DB), Arc::new(ring))?;
        Ok(TenantRecord::new(name, block_size, keys, own_id, like))
    })
}

/// The ids of tenant `name`'s keys and of its writing key, from its record (no key needed).
pub fn key_ids(root: &Path, name: &str) -> Result<(Vec<KeyId>, KeyId), TenantError> {
    let record = read_record(&tenant_dir(root, name)?, name)?;
    let ids = record
        .keys
        .iter()
        .filter_map(|k| KeyId::from_hex(&k.id))
        .collect();
    let writing = record
        .writing_key
        .as_deref()
        .and_then(KeyId::from_hex)
        .expect("checked when read");
    Ok((ids, writing))
}

/// Deletes tenant `name` as [`delete`] does, its keys destroyed first: its record (the only
/// place its keys are kept, wrapped under the master key) is overwritten with zeros and
/// synced before anything else goes, so that its files, and their bytes the disk has not
/// trimmed yet, open under no key this data dir holds. Except its files from before a fork:
/// the fork holds its own copies of the keys it had then, to read the files they share.
/// Returns the tenants that hold any of its keys (its forks, and their forks). A record left zeroed by a shred that was cut
/// short is deleted without a question.
pub fn delete_shredded(data: &DataDir, name: &str) -> Result<Vec<String>, TenantError> {
    let dir = tenant_dir(data.root(), name)?;
    let closed = lock_closed(data.root(), name)?;
    // A fork of it killed on its way holds its keys, wrapped for the fork's name.
    let root = data.tenants_dir();
    crate::fs_util::remove_leftovers(&root, None, false).map_err(io_err(&root))?;
    let path = dir.join(RECORD);
    let mut holders = Vec::new();
    if let Some(record) = match read_record(&dir, name) {
        Err(TenantError::Shredded(_)) => None,
        r => Some(r?),
    } {
        // Held until the zeros are synced: a master key rotation must not write the record
        // again over them, nor this zero a record it replaced.
        let _keys = crate::data_dir::hold_records(data.root())?;
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        let keys = keyring(data, name, &dir, &record)?;
        holders = holders_of(data, name, &keys, &record)?;
        let mut file = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        std::io::Write::write_all(&mut file, &vec![0u8; bytes.len()]).map_err(io_err(&path))?;
        file.sync_all().map_err(io_err(&path))?;
        fail::fail_point!("shred-keys-gone");
    }
    drop(closed);
    delete(data, name)?;
    Ok(holders)
}

/// The other tenants whose rings hold a key of `keys` (tenant `name`'s, its `record`'s) that
/// is not its base's (every tenant of the base holds that one): its forks.
fn holders_of(
    data: &DataDir,
    name: &str,
    keys: &Keyring,
    record: &TenantRecord,
) -> Result<Vec<String>, TenantError> {
    let mut mine = zeroize::Zeroizing::new(Vec::new());
    keys.for_each(|id, key| {
        if !record.keys.iter().any(|k| k.base && k.id == id.to_hex()) {
            mine.push(*key.bytes());
        }
    });
    let mut holders = Vec::new();
    for other in list(data.root())? {
        if other.name == name {
            continue;
        }
        let dir = tenant_dir(data.root(), &other.name)?;
        let Ok(theirs) =
            read_record(&dir, &other.name).and_then(|r| keyring(data, &other.name, &dir, &r))
        else {
            continue; // not ours to judge: its own commands report it
        };
        let mut shares = false;
        theirs.for_each(|_, key| shares |= mine.contains(key.bytes()));
        if shares {
            holders.push(other.name);
        }
    }
    Ok(holders)
}

/// A step of a master key rotation on a record (see `master_rotation`).
#[derive(Clone, Copy)]
pub(crate) enum Reseal<'a> {
    /// Every key gets a second seal, under this key, beside its seal under the data dir's.
    Add(&'a crate::crypto::MasterKey),
    /// Every key keeps only the seal under the data dir's key (the rotation's new one by
    /// now).
    Settle,
}

/// Takes step `step` of a master key rotation on tenant `name`'s record, and on that of a
/// restore of it on its way; a shredded tenant has none to change. The caller holds the
/// data dir's keys alone. Returns how many records it wrote.
pub(crate) fn reseal(data: &DataDir, name: &str, step: Reseal) -> Result<usize, TenantError> {
    let dir = data.tenants_dir().join(name);
    let mut written = 0;
    for path in [dir.join(RECORD), dir.join(RESTORING_RECORD)] {
        if !path.exists() {
            continue;
        }
        let mut record = match read_record_file(&path, name) {
            Err(TenantError::Shredded(_)) => continue,
            // Deleted meanwhile (a delete's rename waits for the keys; this is its rest).
            Err(TenantError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue
            }
            r => r?,
        };
        let master = data.master_key();
        for k in &mut record.keys {
            let sealed = |hex_key: &str| -> Option<TenantKey> {
                master.unwrap_tenant_key(name, &hex::decode(hex_key).ok()?)
            };
            match step {
                Reseal::Add(next) => {
                    let key = sealed(&k.wrapped)
                        .or_else(|| k.wrapped_next.as_deref().and_then(sealed))
                        .ok_or_else(|| TenantError::WrongKey(name.to_owned()))?;
                    k.wrapped_next = Some(hex::encode(next.wrap_tenant_key(name, &key)?));
                }
                Reseal::Settle => match k.wrapped_next.take() {
                    Some(n) if sealed(&n).is_some() => k.wrapped = n,
                    _ if sealed(&k.wrapped).is_some() => {}
                    _ => return Err(TenantError::WrongKey(name.to_owned())),
                },
            }
        }
        record.settle_version();
        let json = serde_json::to_vec_pretty(&record).expect("record serialises");
        write_atomic(&path, &json, 0o600).map_err(io_err(&path))?;
        written += 1;
    }
    Ok(written)
}
