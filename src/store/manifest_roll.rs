//! A store's move to a new MANIFEST when it moves to a new key.
//!
//! Why: after a key rotation nothing may be appended to a file sealed under the old key, and
//! the MANIFEST is appended to at every flush and compaction. RocksDB starts a new MANIFEST
//! only at an edit that finds the current one past its size limit, so the limits are lowered
//! until an edit made after the rotation has started a new one, then raised back to RocksDB's
//! defaults. Raising them is tenantfs's work, never a RocksDB callback's: `SetDBOptions`
//! registers RocksDB's periodic tasks again, which a store closing must not see.
//!
//! How: every rotation holds the limits lowered (a count) until it has switched its
//! memtable, and notes the MANIFEST it switched beside; [`ManifestRoll::raise_if_rolled`]
//! raises them once no rotation holds them and the store appends to another MANIFEST.

use std::sync::Mutex;

/// The limits while lowered: any edit starts a new MANIFEST.
const LOWERED: [(&str, &str); 2] = [
    ("max_manifest_file_size", "1"),
    ("max_manifest_space_amp_pct", "0"),
];
/// RocksDB's defaults (tenantfs sets neither option otherwise).
const DEFAULTS: [(&str, &str); 2] = [
    ("max_manifest_file_size", "1073741824"),
    ("max_manifest_space_amp_pct", "500"),
];

#[derive(Debug, Default)]
pub(crate) struct ManifestRoll {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Rotations holding the limits lowered.
    holders: u32,
    /// The limits are lowered and no rotation holds them any more.
    to_raise: bool,
    /// The MANIFEST the last rotation switched beside: another one means an edit made
    /// after that switch started it.
    switched_beside: Option<u64>,
}

impl State {
    /// Notes the MANIFEST the store appends to now (kept as it was if RocksDB cannot tell).
    fn note_manifest(&mut self, db: &rocksdb::DB) {
        if let Some(n) = super::ffi::manifest_number(db) {
            self.switched_beside = Some(n);
        }
    }
}

impl ManifestRoll {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lowers the limits for one more rotation (RocksDB writes its OPTIONS file again,
    /// unless they are lowered already).
    pub(crate) fn lower(&self, db: &rocksdb::DB) -> Result<(), String> {
        let mut state = self.state();
        state.note_manifest(db);
        if let Err(e) = super::ffi::set_db_options(db, &LOWERED) {
            // RocksDB may have taken them and failed to write its OPTIONS file only.
            state.to_raise = true;
            return Err(e);
        }
        state.holders += 1;
        Ok(())
    }

    /// A rotation is about to switch its memtable: notes the MANIFEST of now.
    pub(crate) fn switching(&self, db: &rocksdb::DB) {
        self.state().note_manifest(db);
    }

    /// A rotation lets go of the limits, `switched` or not. One that failed before its
    /// switch notes the MANIFEST of now: one started since its lowering (a fork's
    /// checkpoint flushes with the limits low, under the old key) is not a move.
    pub(crate) fn release(&self, db: &rocksdb::DB, switched: bool) {
        let mut state = self.state();
        if !switched {
            state.note_manifest(db);
        }
        state.holders = state.holders.saturating_sub(1);
        state.to_raise = true;
    }

    /// Raises the limits back if no rotation holds them and the store has moved to a new
    /// MANIFEST since the last switch; true if it did.
    pub(crate) fn raise_if_rolled(&self, db: &rocksdb::DB) -> Result<bool, String> {
        let mut state = self.state();
        if state.holders > 0 || !state.to_raise {
            return Ok(false);
        }
        match (super::ffi::manifest_number(db), state.switched_beside) {
            (Some(now), Some(beside)) if now != beside => {
                super::ffi::set_db_options(db, &DEFAULTS)?;
                state.to_raise = false;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
