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
    /// That socket file, held (O_PATH) from the moment it was bound: see [`SocketHandle`].
    handle: SocketHandle,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const MAX_REQUEST: u64 = 64 << 10;

/// How often a connection whose request is still being worked on gets a space (see
/// [`answer_keeping_alive`]); clients give up after a silence of several of these.
pub const KEEPALIVE: Duration = Duration::from_secs(5);

impl Server {
    /// Listens on `path`. A socket file left by a dead process is replaced; one that a live
    /// process answers on is an error (two servers for one mount).
    pub fn start(path: &Path, handler: Handler) -> std::io::Result<Self> {
        Self::start_with_keepalive(path, handler, KEEPALIVE)
    }

    /// [`Server::start`], with spaces every `keepalive` while a request is worked on.
    fn start_with_keepalive(
        path: &Path,
        handler: Handler,
        keepalive: Duration,
    ) -> std::io::Result<Self> {
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
        // At once, before anything else can delete or replace the file.
        let handle = SocketHandle::open(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let file = handle.file_id()?;
        let waker = listener.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("tenantfs-control".into())
                .spawn(move || accept_loop(listener, handler, stop, keepalive))?
        };
        Ok(Self {
            path: path.to_owned(),
            listener: waker,
            file,
            handle,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle of its own on this server's socket file (see [`SocketHandle`]): for a check
    /// from inside this process that must reach this very server whatever became of the
    /// file at [`Server::path`] (the daemon's watchdog).
    pub fn handle(&self) -> std::io::Result<SocketHandle> {
        Ok(SocketHandle(self.handle.0.try_clone()?))
    }
}

/// An O_PATH descriptor of a control socket's file, opened as the socket was bound. Its
/// [`SocketHandle::path`], `/proc/self/fd/N`, is a name connect(2) follows to that very inode,
/// which stays bound to the server's socket until the server closes it: connecting there
/// reaches the server even after its file was deleted (a cleanup of the data dir, an operator's
/// `rm`) or another file was put at its path. Only this process can use that name.
#[derive(Debug)]
pub struct SocketHandle(std::fs::File);

impl SocketHandle {
    fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("control socket {} as it was made: {e}", path.display()),
                )
            })?;
        if !file.metadata()?.file_type().is_socket() {
            return Err(std::io::Error::other(format!(
                "control socket {} was replaced by another file as it was made",
                path.display()
            )));
        }
        Ok(Self(file))
    }

    /// The file's (device, inode).
    fn file_id(&self) -> std::io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.0.metadata()?;
        Ok((m.dev(), m.ino()))
    }

    /// The name to connect to, valid in this process while `self` is open.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
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

fn accept_loop(
    listener: UnixListener,
    handler: Handler,
    stop: Arc<AtomicBool>,
    keepalive: Duration,
) {
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
                        if let Err(e) = serve_one(stream, &handler, keepalive) {
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

fn serve_one(stream: UnixStream, handler: &Handler, keepalive: Duration) -> std::io::Result<()> {
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
            "control request refused: neither root nor this process's own user"
        );
        Err(Refusal::new(
            RefusalCode::PermissionDenied,
            format!("permission denied: {}", super::WHO_MAY_CONNECT),
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
                answer_keeping_alive(&mut out, keepalive, move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || h(req)))
                        .unwrap_or_else(|_| {
                            tracing::error!(request = %shown, "control request panicked");
                            Err(Refusal::new(
                                RefusalCode::Internal,
                                format!("internal error while serving {shown}"),
                            ))
                        })
                })?
            }
        }
    };
    let response = Response::from(result);
    let mut text = serde_json::to_string(&response).map_err(std::io::Error::other)?;
    text.push('\n');
    out.write_all(text.as_bytes())
}

/// Runs `answer` on a thread of its own and writes a space to `out` every `keepalive` until
/// it returns. JSON takes whitespace before a value, so the client reads the spaces as the
/// start of the reply line, and its read timeout measures the server's silence, not the
/// request's length: a rewrite of a large store is waited for, a stopped server is not. A
/// client that went away stops the spaces; the answer is still worked out to the end.
fn answer_keeping_alive<T: Send>(
    out: &mut UnixStream,
    keepalive: Duration,
    answer: impl FnOnce() -> T + Send,
) -> std::io::Result<T> {
    use std::sync::mpsc::RecvTimeoutError;
    std::thread::scope(|s| {
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("tenantfs-control-req".into())
            .spawn_scoped(s, move || {
                let answer = answer();
                let _ = done.send(());
                answer
            })?;
        let mut listening = true;
        while let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(keepalive) {
            listening = listening && out.write_all(b" ").is_ok();
        }
        Ok(worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
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

    /// Through its handle, a server is reached after its socket file was deleted, and after
    /// another server took the path: the first one answers, not the second.
    #[test]
    fn the_handle_reaches_the_server_whatever_became_of_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let answer = |word: &'static str| -> Handler {
            Arc::new(move |_| Err(Refusal::new(RefusalCode::BadRequest, word)))
        };
        let first = Server::start(&path, answer("first")).unwrap();
        let handle = first.handle().unwrap();
        let ask = |at: &Path| match crate::control::Client::new(at).call(&Request::Stats) {
            Err(e) => e.refusal().map(|r| r.message.clone()),
            Ok(_) => None,
        };
        assert_eq!(ask(&handle.path()).as_deref(), Some("first"));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(ask(&handle.path()).as_deref(), Some("first"));
        let second = Server::start(&path, answer("second")).unwrap();
        assert_eq!(ask(&path).as_deref(), Some("second"));
        assert_eq!(ask(&handle.path()).as_deref(), Some("first"));
        assert!(drop_ends(first, 30));
        drop(second);
    }

    /// A server that takes `secs` to refuse each request, sending spaces every `keepalive`.
    fn slow_server(path: &Path, secs: f64, keepalive: Duration) -> Server {
        let slow: Handler = Arc::new(move |_| {
            std::thread::sleep(Duration::from_secs_f64(secs));
            Err(Refusal::new(RefusalCode::BadRequest, "slow"))
        });
        Server::start_with_keepalive(path, slow, keepalive).unwrap()
    }

    /// A request worked on for longer than the client's patience is answered: the spaces
    /// the server sends meanwhile are read as the reply's leading whitespace.
    #[test]
    fn a_long_request_is_answered_past_the_clients_patience() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let server = slow_server(&path, 2.5, Duration::from_millis(200));
        let client = super::super::Client::new(&path).with_patience(Duration::from_secs(1));
        let e = client.call(&Request::Stats).unwrap_err();
        assert_eq!(e.refusal().map(|r| r.message.as_str()), Some("slow"), "{e}");
        assert!(drop_ends(server, 30));
    }

    /// A server that sends nothing for the client's patience fails the call with what to
    /// do, rather than hanging it.
    #[test]
    fn a_silent_server_fails_the_call_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let server = slow_server(&path, 2.5, Duration::from_secs(30));
        let client = super::super::Client::new(&path).with_patience(Duration::from_secs(1));
        let e = client.call(&Request::Stats).unwrap_err().to_string();
        assert!(
            e.contains("has sent nothing for 1 s") && e.contains("stopped or stuck"),
            "{e}"
        );
        assert!(drop_ends(server, 30));
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
