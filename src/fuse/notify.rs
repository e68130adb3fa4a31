//! Notifications from the daemon to the kernel about a mount, written to its /dev/fuse: what
//! the reply to the request that made a change does not carry. Today one: forget an inode's
//! cached attributes after a write cleared setuid or setgid (until the kernel asks again, exec
//! would still see the bit).

use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};

use super::wire;

/// The mount's /dev/fuse, once it is mounted.
#[derive(Default)]
pub(crate) struct KernelNotifier(OnceLock<Arc<OwnedFd>>);

impl KernelNotifier {
    /// The mount's /dev/fuse, which notifications go to (the first one given stays).
    pub(crate) fn set_device(&self, fd: Arc<OwnedFd>) {
        let _ = self.0.set(fd);
    }

    /// Tells the kernel to forget `ino`'s cached attributes (FUSE_NOTIFY_INVAL_INODE, no
    /// data range). Before the mount is set up there is nothing to tell; a kernel that no
    /// longer has the inode answers ENOENT, which is no error here.
    pub(crate) fn forget_attributes(&self, ino: u64) {
        let Some(fd) = self.0.get() else {
            return;
        };
        match nix::unistd::write(&**fd, &wire::inval_inode_attributes(ino)) {
            Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => tracing::warn!(ino, error = %e, "cannot invalidate cached attributes"),
        }
    }
}
