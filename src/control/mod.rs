//! The control socket: how `tenantfs` commands reach the process that serves mounts.
//!
//! The caches live in the serving process, so `tenantfs cache stats|release|budget` must ask
//! it. The daemon listens on one socket; a foreground mount's process on its own under
//! `<data-dir>/run/`. The protocol is one JSON request line and one JSON response line per
//! connection, each request with its typed reply ([`replies`]) or a refusal with a stable code.
//! Only root and the server's own uid may connect (peer credentials are checked on every
//! connection, and the socket is mode 0600).

mod client;
mod protocol;
pub mod replies;
mod server;

pub use client::{probe, serving_sockets, Client, ControlError, LimitsChange};
pub use protocol::{AttachVia, Refusal, RefusalCode, Reply, Request, Response};
pub use server::{Handler, Server, SocketHandle};

use std::path::{Path, PathBuf};

/// Who may use a control socket ([`server::peer_allowed`]), in the one wording both sides
/// give: the server's refusal and the client's "permission denied" at connect.
pub(crate) const WHO_MAY_CONNECT: &str =
    "the control socket takes requests from root and the serving process's own user only";

/// Where serving processes put their sockets.
pub fn run_dir(data_root: &Path) -> PathBuf {
    data_root.join("run")
}

/// The socket of the process serving `tenant`'s mount.
pub fn mount_socket(data_root: &Path, tenant: &str) -> PathBuf {
    run_dir(data_root).join(format!("mount-{tenant}.sock"))
}
