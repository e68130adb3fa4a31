//! Content-addressed base images, stored once per host.
//!
//! Most of what tenants read is the same base image. `import` cuts a directory tree (or a raw
//! disk image) into volume-size blocks and stores each distinct block once per host (BLAKE3
//! names it): sealed with AES-256-GCM under a host key derived from the master key (AAD = the
//! hash, so a damaged or swapped block is an error, never wrong data) in append-only pack files
//! (`pack`), found through an encrypted host index (`index`) with reference counts. The tree
//! of each base is kept in the index too, for tenants created from it.

pub(crate) mod host_keys;
mod index;
mod pack;
mod reader;
mod store;
mod tree;
mod uring;

/// `Pack` is public for `examples/bench_pack_io.rs` only (not a stable interface).
#[doc(hidden)]
pub use pack::Pack;
pub use pack::{PackIo, PreadIo};
pub use reader::{open_volume, BaseBlockReader, PackReader};
pub use store::{
    BaseInfo, BaseList, BaseRecord, BaseState, BaseStore, GcReport, HostTotals, ImageDevice,
    Progress, VerifyReport,
};
pub use tree::{EntryKind, SourceKind, TreeEntry};
pub use uring::UringIo;

use std::path::{Path, PathBuf};

/// A block's name: the BLAKE3 hash of its bytes (zero-padded to the block size).
pub type BlockHash = [u8; 32];

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error(
        "invalid base name {0:?}: use 1-64 characters from a-z, A-Z, 0-9, '.', '_', '-', \
         starting with a letter or digit"
    )]
    BadName(String),
    #[error("base {0} already exists; pick another name or delete it first")]
    Exists(String),
    #[error("no base named {0}; see `tenantfs base list`")]
    Unknown(String),
    #[error("invalid block size {0}: use a power of two from 4096 to 1048576")]
    BadBlockSize(u64),
    #[error("cannot import {path}: {detail}")]
    Source { path: PathBuf, detail: String },
    #[error("base block {hash} is damaged ({pack}, slot {slot}): {reason}; nothing was returned from it")]
    BlockCorrupt {
        hash: String,
        pack: PathBuf,
        slot: u32,
        reason: String,
    },
    #[error("base block {0} is not in the index")]
    BlockMissing(String),
    #[error("the base index is damaged: {0}")]
    Corrupt(String),
    #[error(
        "base {base} was written by a newer tenantfs (record format {found}, this one reads up \
         to {known}); use that version or newer"
    )]
    NewerFormat {
        base: String,
        found: u32,
        known: u32,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "base {base} is used by tenant(s) {}; delete them first (`tenantfs tenant delete`)",
        tenants.join(", ")
    )]
    InUse { base: String, tenants: Vec<String> },
    #[error(
        "base {0} is a directory tree, not a raw disk image: a block volume starts from an \
         image (`tenantfs base import NAME IMAGE-FILE`)"
    )]
    NotAnImage(String),
    #[error(
        "base {base} is a {image}-byte image: a volume from it needs --size of at least that \
         (or none: the image's size)"
    )]
    SmallerThanImage { base: String, image: u64, size: u64 },
    #[error(
        "the template of base {base} is being built by {by} (tenants of a base start as copies \
         of it); try again once that is done"
    )]
    TemplateBusy { base: String, by: String },
    #[error(
        "the host's base store is in use by another tenantfs command (base import, delete, \
         gc, verify, or a tenant or volume create --base: one at a time per data dir); try \
         again once it is done"
    )]
    StoreBusy,
    #[error(
        "the template of base {base} ({path}) is damaged: {detail}; delete that directory (the \
         next tenant from the base builds it again)"
    )]
    TemplateDamaged {
        base: String,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "the host's base keys ({path}) cannot be read: {detail}; restore that file from a \
         backup (every base's packs are sealed under them)"
    )]
    HostKeys { path: PathBuf, detail: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Tenant(#[from] crate::tenants::TenantError),
    #[error(transparent)]
    Volume(#[from] crate::volume::VolumeError),
    #[error(transparent)]
    Key(#[from] crate::crypto::KeyError),
}

/// Takes step `step` of a master key rotation on every key the base side keeps sealed under
/// the master key: the host's pack and index keys and each template's key. The caller holds
/// the data dir's keys alone. Returns how many records it wrote.
pub(crate) fn reseal(
    data: &crate::data_dir::DataDir,
    step: crate::tenants::Reseal,
) -> Result<usize, BaseError> {
    host_keys::reseal(data, step)?;
    Ok(1 + store::reseal_templates(data, step)?)
}

impl BaseError {
    fn io(path: &Path) -> impl Fn(std::io::Error) -> BaseError + '_ {
        move |source| BaseError::Io {
            path: path.to_owned(),
            source,
        }
    }
}
