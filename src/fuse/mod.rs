//! The FUSE side of a tenant filesystem: the fuser adapter over [`crate::volume::Volume`] and
//! mounting, serving and unmounting.

mod adapter;
mod mount;

pub use adapter::{CacheMode, TenantFs};
pub use mount::{
    block_shutdown_signals, find_mount, parse_mountinfo, prepare_mountpoint, serve, spawn_mount,
    unmount, wait_for_shutdown_signal, MountEntry, MountError, MountOptions, MountedTenant,
    FS_TYPE,
};
