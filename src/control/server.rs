//! The listening side: a thread accepting connections, one request each.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::socket::{shutdown, Shutdown};

use super::protocol::{Refusal, RefusalCode, Reply, Request, Response};

/// Answers one request. A panic inside fails that request only.
pub type Handler = Arc<dyn Fn(Request) -> Result<Reply, Refusal> + Send + Sync>;

/// A listening control socket; dropping it stops the thread and removes the socket file.
pub struct Server {
    path: PathBuf,
    /// The listening socket (a second handle to the one the thread accepts on): shut down to
    /// wake the thread, which works whatever became of the socket file.
    listener: UnixListener,
    /// The socket file's (device, inode): it is removed at the end only if it is still ours,
    /// not one a later server bound at the same path after ours was deleted.
    file: (u64, u64),
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const MAX_REQUEST: u64 = 64 << 10;

impl Server {
    /// Listens on `path`. A socket file left by a dead process is replaced; one that a live
    /// process answers on is an error (two servers for one mount).
    pub fn start(path: &Path, handler: Handler) -> std::io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.exists()) {
            // Only a directory made here is made private; an existing one (/run) is left be.
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "control socket {} is in use by another process",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let file = file_id(path).ok_or_else(|| {
            std::io::Error::other(format!(
                "control socket {} vanished as it was made",
                path.display()
            ))
        })?;
        let waker = listener.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("tenantfs-control".into())
                .spawn(move || accept_loop(listener, handler, stop))?
        };
        Ok(Self {
            path: path.to_owned(),
            listener: waker,
            file,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept call: a shut-down listening socket fails it at once. (Connecting to
        // the path did not when the socket file was gone: the daemon hung on its way out.)
        if let Err(e) = shutdown(self.listener.as_raw_fd(), Shutdown::Both) {
            tracing::warn!(error = %e, "cannot shut the control socket down");
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if file_id(&self.path) == Some(self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A file's (device, inode), if it exists.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn accept_loop(listener: UnixListener, handler: Handler, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        match conn {
            Ok(stream) => {
                let handler = handler.clone();
                // One thread per connection: a slow client cannot hold up the others.
                let spawned = std::thread::Builder::new()
                    .name("tenantfs-control-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_one(stream, &handler) {
                            tracing::debug!(error = %e, "control connection ended with an error");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a control connection thread");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Whether a peer with this uid may use the socket: root, or the server's own user.
pub(crate) fn peer_allowed(peer_uid: u32, server_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == server_uid
}

fn serve_one(stream: UnixStream, handler: &Handler) -> std::io::Result<()> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let cred = getsockopt(&stream, PeerCredentials).map_err(std::io::Error::from)?;
    let mut out = stream.try_clone()?;
    // Read the request whoever sent it, so a refused client gets its answer, not a reset.
    let mut line = String::new();
    BufReader::new(std::io::Read::take(&stream, MAX_REQUEST)).read_line(&mut line)?;
    let result = if !peer_allowed(cred.uid(), nix::unistd::geteuid().as_raw()) {
        tracing::warn!(
            uid = cred.uid(),
            pid = cred.pid(),
            "control request refused: not root"
        );
        Err(Refusal::new(
            RefusalCode::PermissionDenied,
            "permission denied: the control socket takes requests from root only",
        ))
    } else {
        match serde_json::from_str::<Request>(&line) {
            Err(e) => Err(Refusal::new(
                RefusalCode::BadRequest,
                format!("bad request: {e}"),
            )),
            Ok(req) => {
                let h = handler.clone();
                let shown = format!("{req:?}");
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || h(req)))
                    .unwrap_or_else(|_| {
                        tracing::error!(request = %shown, "control request panicked");
                        Err(Refusal::new(
                            RefusalCode::Internal,
                            format!("internal error while serving {shown}"),
                        ))
                    })
            }
        }
    };
    let response = Response::from(result);
    let mut text = serde_json::to_string(&response).map_err(std::io::Error::other)?;
    text.push('\n');
    out.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse_all() -> Handler {
        Arc::new(|_| Err(Refusal::new(RefusalCode::BadRequest, "test")))
    }

    /// Drops `server` on a thread of its own; whether that ended within `secs` (a hang is a
    /// daemon that cannot stop).
    fn drop_ends(server: Server, secs: u64) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(server);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(secs)).is_ok()
    }

    /// A server whose socket file was deleted under it (its directory cleaned up, or taken by
    /// a second server at the same path) still stops when dropped, and leaves the second
    /// server's socket file where it is.
    #[test]
    fn a_server_whose_socket_file_went_stops_and_leaves_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let first = Server::start(&path, refuse_all()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let second = Server::start(&path, refuse_all()).unwrap();
        assert!(drop_ends(first, 30), "the first server hung on its way out");
        assert!(
            path.exists(),
            "the first server removed the second's socket file"
        );
        assert!(
            UnixStream::connect(&path).is_ok(),
            "the second still answers"
        );
        assert!(drop_ends(second, 30));
        assert!(!path.exists(), "a server removes its own socket file");
    }

    #[test]
    fn only_root_and_the_owner_are_allowed() {
        assert!(peer_allowed(0, 1000));
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(peer_allowed(0, 0));
        assert!(!peer_allowed(65534, 0));
    }
}
