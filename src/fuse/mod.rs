//! The FUSE side of a tenant filesystem: the operations over [`crate::volume::Volume`], the
//! wire format and the one dispatcher of requests to them, the two transports that carry
//! requests (worker threads on /dev/fuse, and FUSE over io_uring), the INIT handshake (fuser's
//! part: mounting and INIT), the serving session of one mount, and mountpoints.

mod buffer;
mod caller;
mod device;
mod dispatch;
mod dormancy;
mod handshake;
mod listing_prefetch;
mod mount;
mod notify;
mod ops;
mod ring;
mod session;
mod wire;

pub use dormancy::{wakes as dormant_mount_wakes, Reopen, ServedVolume};
pub use mount::{
    block_shutdown_signals, find_mount, parse_mountinfo, prepare_mountpoint, unmount,
    wait_for_shutdown_signal, MountEntry, MountError, MountOptions, FS_TYPE,
};
pub use ops::CacheMode;
pub use ring::{
    kernel_enabled as uring_enabled, Transport, ENABLE_PARAMETER as URING_PARAMETER,
    HANDOFF_COOLDOWN as RING_HANDOFF_COOLDOWN,
};
pub use session::Session;
