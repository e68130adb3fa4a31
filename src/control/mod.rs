//! The control socket: how `tenantfs` commands reach the process that serves mounts.
//!
//! The caches live in the serving process, so `tenantfs cache stats|release|budget` must ask
//! it. Each serving process listens on a Unix socket under `<data-dir>/run/` (one per mount
//! until the host daemon serves them all on one socket). The protocol is one JSON request line
//! and one JSON response line per connection. Only root and the server's own uid may connect
//! (peer credentials are checked on every connection, and the socket is mode 0600).

mod cache_service;
mod client;
mod protocol;
mod server;

pub use cache_service::cache_handler;
pub use client::{request, serving_sockets, ControlError};
pub use protocol::{Request, Response};
pub use server::{Handler, Server};

use std::path::{Path, PathBuf};

/// Where serving processes put their sockets.
pub fn run_dir(data_root: &Path) -> PathBuf {
    data_root.join("run")
}

/// The socket of the process serving `tenant`'s mount.
pub fn mount_socket(data_root: &Path, tenant: &str) -> PathBuf {
    run_dir(data_root).join(format!("mount-{tenant}.sock"))
}
