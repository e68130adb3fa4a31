//! An NBD server for block volumes: one export per attached volume, on a unix socket or a
//! loopback TCP address, for QEMU (`nbd:unix:PATH`), the kernel's `nbd-client` and libnbd's
//! tools (`nbdinfo`, `nbdcopy`).
//!
//! The fixed newstyle handshake (`NBD_OPT_GO`, `NBD_OPT_INFO`, `NBD_OPT_EXPORT_NAME`,
//! `NBD_OPT_LIST`, `NBD_OPT_ABORT`; no TLS: hence loopback and unix sockets only), then
//! simple replies to READ, WRITE, FLUSH, TRIM, WRITE_ZEROES (FUA honoured) and DISC. Each
//! connection's requests are carried out by a few workers at once (replies may come out of
//! order, as the protocol allows); several connections may share one export
//! (`NBD_FLAG_CAN_MULTI_CONN`: a flush on any makes every completed write durable, since it
//! syncs the whole store). `wire` is the byte layout, `connection` one client, `address` where
//! an export listens. `kernel_device` serves a volume as /dev/nbdN through the kernel's own
//! NBD client, set up over `netlink` by the daemon so the device outlives a daemon restart.

mod address;
mod connection;
mod kernel_device;
mod netlink;
mod wire;

pub use address::NbdAddress;
pub use kernel_device::{leftovers, NbdDeviceError, NbdKernelDevice, NbdLeftover};

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::sys::socket::{shutdown, Shutdown};

use crate::blockdev::BlockDevice;
use address::Listener;

#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error(
        "invalid NBD address {0:?}: use unix:PATH, or HOST:PORT on a loopback address (for \
         example 127.0.0.1:10809)"
    )]
    BadAddress(String),
    #[error(
        "NBD address {0} is not a loopback address: NBD here has no TLS or authentication, so \
         it is served on loopback addresses (127.0.0.1, [::1]) and unix sockets only"
    )]
    NotLoopback(String),
    #[error("{0} is in use by another server; pick another address, or stop that server")]
    InUse(String),
    #[error("{0} exists and is not a socket; pick another path, or remove that file")]
    NotASocket(String),
    #[error("cannot listen on {address}: {source}")]
    Listen { address: String, source: io::Error },
}

/// Locks `m`, going on past a poisoned lock (a panic on one connection's thread leaves the
/// connection list and the reply stream usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a connection's threads share.
struct Export {
    device: Arc<BlockDevice>,
    /// The connections served now (a clone of each socket, to shut it down on stop).
    connections: Mutex<Vec<(Arc<OwnedFd>, JoinHandle<()>)>>,
    stopping: AtomicBool,
}

/// A volume served over NBD: a listening socket and a thread per client. Stopping it (or
/// dropping it) stops accepting, lets every connection's requests in flight finish, syncs the
/// device and removes the socket file.
pub struct NbdExport {
    address: NbdAddress,
    export: Arc<Export>,
    listener: Listener,
    accept: Option<JoinHandle<()>>,
}

impl NbdExport {
    /// Listens on `address` and serves `device` to every client that connects. A TCP port of
    /// 0 takes a free one ([`NbdExport::address`] says which).
    pub fn start(device: Arc<BlockDevice>, address: &NbdAddress) -> Result<Self, NbdError> {
        let listener = Listener::bind(address)?;
        let address = listener.local_address(address);
        let export = Arc::new(Export {
            device,
            connections: Mutex::default(),
            stopping: AtomicBool::new(false),
        });
        let accepting = listener.try_clone().map_err(|source| NbdError::Listen {
            address: address.to_string(),
            source,
        })?;
        let shared = export.clone();
        let name = format!("nbd-{}", export.device.name());
        let accept = std::thread::Builder::new()
            .name(name)
            .spawn(move || accept_loop(accepting, shared))
            .map_err(|source| NbdError::Listen {
                address: address.to_string(),
                source,
            })?;
        tracing::info!(volume = export.device.name(), %address, "NBD export started");
        Ok(Self {
            address,
            export,
            listener,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub fn address(&self) -> &NbdAddress {
        &self.address
    }

    pub fn device(&self) -> &Arc<BlockDevice> {
        &self.export.device
    }

    /// Clients connected now.
    pub fn connections(&self) -> usize {
        let mut c = lock(&self.export.connections);
        c.retain(|(_, t)| !t.is_finished());
        c.len()
    }

    /// Stops serving: no new clients; each connection's requests in flight are answered, then
    /// it is closed; the device is synced. Returns the connections it closed.
    pub fn stop(&mut self) -> usize {
        let Some(accept) = self.accept.take() else {
            return 0;
        };
        self.export.stopping.store(true, Ordering::Release);
        // A shut-down listening socket fails the blocked accept at once.
        let _ = shutdown(self.listener.as_raw_fd(), Shutdown::Both);
        let _ = accept.join();
        let connections = std::mem::take(&mut *lock(&self.export.connections));
        let closed = connections.iter().filter(|(_, t)| !t.is_finished()).count();
        for (socket, _) in &connections {
            // Reading ends; the replies of what was read still go out.
            let _ = shutdown(socket.as_raw_fd(), Shutdown::Read);
        }
        for (_, thread) in connections {
            let _ = thread.join();
        }
        if let Err(e) = self.export.device.flush() {
            tracing::error!(volume = self.export.device.name(), error = %e, "sync at detach failed");
        }
        self.listener.remove_socket_file();
        tracing::info!(
            volume = self.export.device.name(),
            closed,
            "NBD export stopped"
        );
        closed
    }
}

impl Drop for NbdExport {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: Listener, export: Arc<Export>) {
    loop {
        let accepted = listener.accept();
        if export.stopping.load(Ordering::Acquire) {
            return;
        }
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: the listener itself stays good.
                tracing::warn!(volume = export.device.name(), error = %e, "NBD accept failed");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        let spawned = serve_on_thread(export.device.clone(), stream, false);
        match spawned {
            Ok((thread, socket)) => {
                let mut c = lock(&export.connections);
                c.retain(|(_, t)| !t.is_finished());
                c.push((socket, thread));
            }
            Err(e) => tracing::warn!(error = %e, "cannot serve an NBD connection: closing it"),
        }
    }
}

/// Serves `stream` on a thread of its own (`logged` as for `connection::serve`); returns the
/// thread and a second descriptor of the socket, to shut it down from elsewhere. When the
/// connection ends its socket is shut down, so the client sees the end at once although that
/// descriptor keeps the socket open (a client waiting for the close after DISC or ABORT; the
/// kernel, which then marks the connection dead).
fn serve_on_thread(
    device: Arc<BlockDevice>,
    stream: address::Stream,
    logged: bool,
) -> io::Result<(JoinHandle<()>, Arc<OwnedFd>)> {
    let socket = Arc::new(stream.try_clone_fd()?);
    let own = socket.clone();
    let thread = std::thread::Builder::new()
        .name(format!("nbd-{}-conn", device.name()))
        .spawn(move || {
            let peer = stream.peer();
            match connection::serve(stream, &device, logged) {
                Ok(()) => tracing::debug!(volume = device.name(), peer, "NBD client disconnected"),
                Err(e) => {
                    tracing::info!(volume = device.name(), peer, error = %e, "NBD connection ended")
                }
            }
            let _ = shutdown(own.as_raw_fd(), Shutdown::Both);
        })?;
    Ok((thread, socket))
}
