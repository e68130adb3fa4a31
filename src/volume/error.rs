//! The volume's one error type, and the errno each variant is to the kernel.

use super::codec;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("invalid argument")]
    Invalid,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value does not fit the buffer")]
    Range,
    #[error("file too large")]
    TooBig,
    #[error("argument list too long")]
    ArgTooBig,
    #[error("operation not supported")]
    NotSupported,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("no data or hole at or after this offset")]
    NoMoreData,
    #[error("no space left on the tenant's disk")]
    NoSpace,
    #[error(
        "the tenant's quota of {quota} {what} is used up (free some, or raise it: tenant set)"
    )]
    OverQuota { what: &'static str, quota: u64 },
    #[error(
        "the host's disk is down to its reserve ({free} bytes free, {reserve} kept back for \
         deletes and upkeep): delete files, or ask the host's operator for room"
    )]
    HostFull { free: u64, reserve: u64 },
    #[error("tenant {tenant}: inode {ino} record is damaged")]
    Damaged { tenant: String, ino: u64 },
    #[error("tenant {tenant}: a base image block of inode {ino} cannot be read: {detail}")]
    BaseBlock {
        tenant: String,
        ino: u64,
        detail: String,
    },
    #[error(
        "tenant {tenant} was being created from a base image when that was interrupted; \
         delete it and create it again"
    )]
    Incomplete { tenant: String },
    #[error("tenant {tenant} holds its files in data format {found}, {}", format_advice(*found))]
    Format { tenant: String, found: u32 },
    #[error("internal error while serving {0} (a bug: see the log)")]
    Panicked(&'static str),
    #[error(
        "tenant {tenant}: its store, closed while the mount was idle, does not open again: \
         {detail}; each request tries again (see the daemon's log)"
    )]
    Unwoken {
        tenant: String,
        detail: String,
        no_space: bool,
    },
    #[error("tenant {tenant}: {detail}")]
    BaseKeys { tenant: String, detail: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What to do with a store of a data format this tenantfs does not read.
fn format_advice(found: u32) -> String {
    let reads = format!(
        "it reads formats {} to {}",
        codec::FORMAT_MIGRATES_FROM,
        codec::FORMAT_VERSION
    );
    if found > codec::FORMAT_VERSION {
        format!(
            "written by a newer tenantfs ({reads}); open it with the tenantfs that wrote it or \
             a newer one"
        )
    } else {
        format!(
            "which this tenantfs does not read ({reads}, written since tenantfs 0.3); copy the \
             files out with the tenantfs that wrote them, then into a tenant created by this one"
        )
    }
}

impl VolumeError {
    /// The errno a POSIX caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            VolumeError::NotFound => libc::ENOENT,
            VolumeError::Exists => libc::EEXIST,
            VolumeError::NotDir => libc::ENOTDIR,
            VolumeError::IsDir => libc::EISDIR,
            VolumeError::NotEmpty => libc::ENOTEMPTY,
            VolumeError::NameTooLong => libc::ENAMETOOLONG,
            VolumeError::Invalid => libc::EINVAL,
            VolumeError::NoAttr => libc::ENODATA,
            VolumeError::Range => libc::ERANGE,
            VolumeError::TooBig => libc::EFBIG,
            VolumeError::ArgTooBig => libc::E2BIG,
            VolumeError::NotSupported => libc::EOPNOTSUPP,
            VolumeError::NotPermitted => libc::EPERM,
            VolumeError::NoMoreData => libc::ENXIO,
            VolumeError::NoSpace => libc::ENOSPC,
            VolumeError::OverQuota { .. } => libc::EDQUOT,
            VolumeError::HostFull { .. } => libc::ENOSPC,
            VolumeError::Damaged { .. } => libc::EIO,
            VolumeError::BaseBlock { .. }
            | VolumeError::BaseKeys { .. }
            | VolumeError::Format { .. }
            | VolumeError::Incomplete { .. }
            | VolumeError::Panicked(_) => libc::EIO,
            VolumeError::Unwoken { no_space, .. } => {
                if *no_space {
                    libc::ENOSPC
                } else {
                    libc::EIO
                }
            }
            VolumeError::Store(e) if e.is_no_space() => libc::ENOSPC,
            VolumeError::Store(_) => libc::EIO,
        }
    }
}

pub(super) type Result<T> = std::result::Result<T, VolumeError>;
