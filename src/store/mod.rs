//! The encrypted per-tenant RocksDB store.
//!
//! Each tenant has its own RocksDB instance ([`TenantDb`]) whose every file is encrypted by the
//! C++ shim (`shim.cc`, bridged in `ffi`) with a per-file key kept in a 4 KiB header
//! (`file_key`). All stores of one process share one block cache and one write buffer manager
//! ([`StoreHost`]), and read and write with O_DIRECT where the filesystem allows it
//! (`direct_io`).

mod activity;
mod background;
mod checkpoint;
pub mod direct_io;
mod extent_io;
mod extent_span;
mod extents;
mod ffi;
mod file_ids;
mod file_key;
mod foreground;
mod health;
mod host;
mod manifest_roll;
mod ring_read;
mod tenant_db;

use std::path::{Path, PathBuf};

#[cfg(test)]
pub(crate) use background::CountingAccount;
pub use background::{BackgroundAccount, BackgroundSink, BackgroundWork};
pub(crate) use extent_io::ALIGN as EXTENT_ALIGN;
pub use extent_span::{ExtentSpan, SpanCheck, SpanPart, PIECE};
pub use extents::{ExtentFileStats, ExtentFiles, ExtentLineage};
pub(crate) use foreground::note as note_foreground_io;
pub use health::StoreState;
pub use host::{DirectIo, StoreHost, StoreHostBuilder};
pub use tenant_db::{
    disk_space_at, Batch, BlobSpace, Encryption, Entry, Family, ManifestLimitsLowered, OpenMode,
    TenantDb,
};

/// Size of the encryption header at the start of every store file.
pub const FILE_HEADER_LEN: usize = file_key::PREFIX_LEN;

/// Whether the store file at `path` (any file a store writes: table, blob, WAL, MANIFEST,
/// extent file) opens under `ring`; the error says why not (the key id its header names
/// that the ring lacks, a seal that does not open, no header).
pub fn file_opens_under(ring: &crate::crypto::Keyring, path: &Path) -> Result<(), String> {
    let mut header = vec![0u8; FILE_HEADER_LEN];
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    std::io::Read::read_exact(&mut file, &mut header).map_err(|e| e.to_string())?;
    file_key::open_prefix(ring, &header)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The files of the store in `db` (its extent files too) sealed under a key other than
/// `writing`, or under none a ring names (a header from before keyrings); files without a
/// tenantfs header (RocksDB's lock and info logs) are not sealed and are passed over.
pub fn files_under_other_keys(
    db: &Path,
    writing: crate::crypto::KeyId,
) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for dir in [db.to_owned(), db.join("extents")] {
        let entries = match std::fs::read_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            entries => entries?,
        };
        for entry in entries {
            let path = entry?.path();
            if !path.is_file() {
                continue;
            }
            let mut header = vec![0u8; FILE_HEADER_LEN];
            let mut file = match std::fs::File::open(&path) {
                // Deleted since the listing (an obsolete file, a collected one).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                opened => opened?,
            };
            if std::io::Read::read_exact(&mut file, &mut header).is_err() {
                continue; // shorter than a header: not a sealed file
            }
            match file_key::key_id(&header) {
                Ok(Some(id)) if id == writing => {}
                Ok(_) => out.push(path),
                Err(_) => {}
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The id of the key a store file's header names (`None`: a header from before keyrings).
pub fn file_key_id(path: &Path) -> Result<Option<crate::crypto::KeyId>, String> {
    let mut header = vec![0u8; FILE_HEADER_LEN];
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    std::io::Read::read_exact(&mut file, &mut header).map_err(|e| e.to_string())?;
    file_key::key_id(&header).map_err(|e| e.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "tenant {tenant}: its store is in use by another process or mount \
         (RocksDB: {detail}); unmount it or stop that process first"
    )]
    InUse { tenant: String, detail: String },
    #[error(
        "tenant {tenant}: store data is corrupt during {op} ({detail}); the damaged range is \
         unreadable, nothing was returned from it; restore the tenant from a backup"
    )]
    Corrupt {
        tenant: String,
        op: &'static str,
        detail: String,
    },
    #[error("tenant {tenant}: store {op} failed: {detail}")]
    Rocks {
        tenant: String,
        op: &'static str,
        detail: String,
    },
    #[error(
        "tenant {tenant}: no store at {path}; was the tenant created (`tenantfs tenant create`)?"
    )]
    Missing { tenant: String, path: PathBuf },
    #[error("tenant {tenant}: {path}: {source}")]
    Io {
        tenant: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "tenant {tenant}: no space left on its filesystem ({detail}); free space there \
         (delete other tenants or files) and try again"
    )]
    NoSpace { tenant: String, detail: String },
    #[error("tenant {tenant}: cannot build the encrypted RocksDB environment")]
    Env { tenant: String },
    /// Not a failure: the read's disk reads were handed to the thread answering it
    /// (`serving::defer`), which answers it again once they are done.
    #[error("tenant {tenant}: the read's disk reads are being made; it is answered again after")]
    Deferred { tenant: String },
}

impl StoreError {
    /// An I/O error on `path`; a full filesystem gets its own message.
    pub(crate) fn io(tenant: &str, path: &Path, source: std::io::Error) -> Self {
        let (tenant, path) = (tenant.to_owned(), path.to_owned());
        if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            let detail = format!("{}: {source}", path.display());
            StoreError::NoSpace { tenant, detail }
        } else {
            StoreError::Io {
                tenant,
                path,
                source,
            }
        }
    }

    fn from_rocksdb(tenant: &str, op: &'static str, e: rocksdb::Error) -> Self {
        Self::from_detail(tenant, op, e.into_string())
    }

    /// An error RocksDB reported as `detail` (its Status string).
    pub(crate) fn from_detail(tenant: &str, op: &'static str, detail: String) -> Self {
        let tenant = tenant.to_owned();
        if detail.contains("No space left on device") {
            StoreError::NoSpace { tenant, detail }
        } else if detail.contains("lock") && detail.contains("LOCK") {
            StoreError::InUse { tenant, detail }
        } else if detail.starts_with("Corruption") {
            StoreError::Corrupt { tenant, op, detail }
        } else {
            StoreError::Rocks { tenant, op, detail }
        }
    }

    /// True when the store's filesystem is full.
    /// True when the read was not answered but its disk reads handed over (`serving::defer`).
    pub fn is_deferred(&self) -> bool {
        matches!(self, StoreError::Deferred { .. })
    }

    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::NoSpace { .. } => true,
            StoreError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            _ => false,
        }
    }

    /// True when the store's bytes failed a checksum or key check.
    pub fn is_corruption(&self) -> bool {
        matches!(self, StoreError::Corrupt { .. })
    }
}

#[doc(hidden)]
/// For tests/store_ffi.rs: facts about the C++ shim to check against RocksDB's C API.
pub mod layout {
    pub fn env_wrapper_size() -> usize {
        super::ffi::shim_layout().wrapper_size
    }
    pub fn prefix_length() -> usize {
        super::ffi::shim_layout().prefix_length
    }
    /// Files the shim wrote through its pipelined direct writes since the process started.
    pub fn pipelined_files() -> u64 {
        super::ffi::pipelined_files()
    }
    /// Builds an encrypted Env and returns it with the `Env*` the shim says it holds.
    pub fn encrypted_env_and_rep() -> (rocksdb::Env, *const std::ffi::c_void) {
        let ring = crate::crypto::Keyring::single(
            crate::crypto::KeyId::generate().unwrap(),
            crate::crypto::TenantKey::generate().unwrap(),
        );
        let ids = std::sync::Arc::default();
        let env = super::ffi::encrypted_env(std::sync::Arc::new(ring), ids).expect("env");
        let rep = super::ffi::env_rep(&env);
        (env, rep)
    }
}
