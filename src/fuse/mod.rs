//! The FUSE side of a tenant filesystem: the operations over [`crate::volume::Volume`], the
//! two transports that carry requests to them (fuser over /dev/fuse, and FUSE over io_uring),
//! the serving session of one mount, and mountpoints.

mod adapter;
mod mount;
mod ops;
mod ring;
mod session;

pub use adapter::{CacheMode, TenantFs};
pub use mount::{
    block_shutdown_signals, find_mount, parse_mountinfo, prepare_mountpoint, unmount,
    wait_for_shutdown_signal, MountEntry, MountError, MountOptions, FS_TYPE,
};
pub use ring::{kernel_enabled as uring_enabled, Transport, ENABLE_PARAMETER as URING_PARAMETER};
pub use session::Session;
