//! /dev/nbdN set up by the daemon itself: the kernel's NBD client on a socket pair whose
//! other end the daemon's NBD server serves, for hosts without ublk that want a volume as a
//! block device.
//!
//! Why not `nbd-client`: a device set up with the old ioctls fails its I/O when the server's
//! socket dies, and `nbd-client` in netlink mode exits once the device is up, so nothing
//! gives the kernel a new socket when the daemon restarts. Here the daemon is the device's
//! agent: it sets the device up over netlink (`netlink`) with a dead-connection timeout, so
//! when the daemon dies (or stops with the device attached) the kernel holds the device's I/O;
//! the next daemon on the data dir finds the device by its backend identifier
//! (/sys/block/nbdN/backend names the volume and the data dir, see [`leftovers`]), hands the
//! kernel a new socket (`NBD_CMD_RECONFIGURE`) and the held requests go on it. Requests in
//! flight when the daemon died are requeued when their timeout ([`TIMEOUT_SECS`]) runs out.
//! A request that runs past it while the daemon lives costs the socket too: the daemon sees
//! its end close, waits for the requests it was carrying out, and reconnects.
//!
//! Every connection goes through the server's whole handshake (the export's own code), and
//! its writes are logged (see `BlockDevice::write_logged`): the filesystem on the device
//! never sees the server go away, so an acknowledged write must survive the server dying.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{shutdown, Shutdown};

use super::address::Stream;
use super::netlink::{Connect, NbdNetlink};
use super::{lock, wire};
use crate::blockdev::BlockDevice;

/// Seconds a request may take before the kernel requeues it on a new socket: how long the
/// requests in flight at a daemon's death wait before they go to the next daemon.
pub const TIMEOUT_SECS: u64 = 5;
/// Seconds the kernel holds the device's I/O with no daemon before failing it.
pub const DEAD_CONNECTION_SECS: u64 = 600;
/// Where the kernel lists its block devices.
const SYS_BLOCK: &str = "/sys/block";
/// The start of the backend identifiers this server gives its devices.
const BACKEND_PREFIX: &str = "tenantfs:";

#[derive(Debug, thiserror::Error)]
pub enum NbdDeviceError {
    #[error("cannot set up an nbd device: {0}")]
    Connect(#[source] io::Error),
    #[error("cannot give /dev/nbd{index} a new socket: {source}")]
    Reconfigure { index: u32, source: io::Error },
    #[error("the NBD handshake with the daemon's own server failed: {0}")]
    Handshake(#[source] io::Error),
    #[error(
        "{path} is in use (a mounted filesystem or an open holder): unmount it or close it, \
         then detach"
    )]
    InUse { path: String },
    #[error("cannot make a socket pair for the device: {0}")]
    Socket(#[source] io::Error),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] io::Error),
}

/// A kernel nbd device a previous daemon of a data dir left set up.
#[derive(Debug, PartialEq, Eq)]
pub struct NbdLeftover {
    pub index: u32,
    pub volume: String,
}

/// What the device's threads share.
struct Shared {
    device: Arc<BlockDevice>,
    index: u32,
    backend: String,
    stopping: AtomicBool,
    /// The daemon's end of the socket the kernel has now, to end it at stop.
    socket: Mutex<Option<Arc<OwnedFd>>>,
}

/// A volume served as /dev/nbdN.
pub struct NbdKernelDevice {
    shared: Arc<Shared>,
    agent: Option<JoinHandle<()>>,
}

impl NbdKernelDevice {
    /// Sets up a free /dev/nbdN for `device`.
    pub fn attach(device: Arc<BlockDevice>, data_dir: &Path) -> Result<Self, NbdDeviceError> {
        let backend = backend_of(device.name(), data_dir);
        let mut nl = NbdNetlink::open().map_err(NbdDeviceError::Connect)?;
        let (client, served, size, flags) = connection_to(&device)?;
        let connected = nl.connect(&Connect {
            size,
            block_size: device.block_size().into(),
            server_flags: flags,
            timeout_secs: TIMEOUT_SECS,
            dead_conn_timeout_secs: DEAD_CONNECTION_SECS,
            backend: &backend,
            sockets: &[client.as_raw_fd()],
        });
        // The kernel holds its own reference to the socket now (or never took it).
        drop(client);
        let index = match connected {
            Ok(i) => i,
            Err(e) => {
                let _ = served.thread.join();
                return Err(NbdDeviceError::Connect(e));
            }
        };
        let this = Self::serving(device, index, backend, served)?;
        tracing::info!(volume = this.shared.device.name(), path = %this.path(), "nbd device set up");
        Ok(this)
    }

    /// Takes over /dev/nbd`index`, which a previous daemon set up for `device`: the I/O the
    /// kernel held goes to this one.
    pub fn recover(
        device: Arc<BlockDevice>,
        data_dir: &Path,
        index: u32,
    ) -> Result<Self, NbdDeviceError> {
        let backend = backend_of(device.name(), data_dir);
        let served = reconnect(&device, index, &backend)?;
        Self::serving(device, index, backend, served)
    }

    fn serving(
        device: Arc<BlockDevice>,
        index: u32,
        backend: String,
        served: Served,
    ) -> Result<Self, NbdDeviceError> {
        let shared = Arc::new(Shared {
            device,
            index,
            backend,
            stopping: AtomicBool::new(false),
            socket: Mutex::new(Some(served.socket.clone())),
        });
        let s = shared.clone();
        let agent = std::thread::Builder::new()
            .name(format!("nbd{index}-agent"))
            .spawn(move || look_after(&s, served))
            .map_err(NbdDeviceError::Thread)?;
        Ok(Self {
            shared,
            agent: Some(agent),
        })
    }

    pub fn path(&self) -> String {
        format!("/dev/nbd{}", self.shared.index)
    }

    pub fn device(&self) -> &Arc<BlockDevice> {
        &self.shared.device
    }

    /// Disconnects the device (`volume detach`): refused while it is mounted or held open
    /// exclusively; otherwise the kernel's requests in flight are answered and the store
    /// synced.
    pub fn stop(&mut self) -> Result<(), NbdDeviceError> {
        let path = self.path();
        if crate::blockdev::is_held(&path) {
            return Err(NbdDeviceError::InUse { path });
        }
        self.shared.stopping.store(true, Ordering::Release);
        let disconnected = NbdNetlink::open().and_then(|mut nl| nl.disconnect(self.shared.index));
        if let Err(error) = disconnected {
            tracing::warn!(%path, %error, "cannot disconnect the nbd device; closing its socket");
        }
        self.end("nbd device disconnected");
        Ok(())
    }

    /// Stops serving but leaves the device set up for the next daemon (daemon shutdown):
    /// requests read are answered, the store is synced; the kernel holds the rest.
    pub fn suspend(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.end("nbd device kept for recovery by the next daemon");
    }

    /// Ends the connection (the kernel's DISC ends it first after a disconnect), waits for
    /// the agent and syncs the store.
    fn end(&mut self, what: &str) {
        let Some(agent) = self.agent.take() else {
            return;
        };
        if let Some(s) = lock(&self.shared.socket).take() {
            // Reading ends; the replies of what was read still go out.
            let _ = shutdown(s.as_raw_fd(), Shutdown::Read);
        }
        let _ = agent.join();
        let device = &self.shared.device;
        if let Err(error) = device.flush() {
            tracing::error!(volume = device.name(), %error, "cannot sync a volume");
        }
        tracing::info!(volume = device.name(), path = %self.path(), "{what}");
    }
}

impl Drop for NbdKernelDevice {
    fn drop(&mut self) {
        self.suspend();
    }
}

/// One connection of the daemon's server: its thread and a descriptor of its socket.
struct Served {
    thread: JoinHandle<()>,
    socket: Arc<OwnedFd>,
}

/// A socket pair whose one end the server serves (in a new thread) and whose other end has
/// been through the handshake: (client end, server, size, transmission flags).
fn connection_to(
    device: &Arc<BlockDevice>,
) -> Result<(UnixStream, Served, u64, u16), NbdDeviceError> {
    let (mut client, server) = UnixStream::pair().map_err(NbdDeviceError::Socket)?;
    let (thread, socket) = super::serve_on_thread(device.clone(), Stream::Unix(server), true)
        .map_err(NbdDeviceError::Thread)?;
    let served = Served { thread, socket };
    match handshake(&mut client, device.name()) {
        Ok((size, flags)) => Ok((client, served, size, flags)),
        Err(e) => {
            drop(client);
            let _ = served.thread.join();
            Err(NbdDeviceError::Handshake(e))
        }
    }
}

/// The client's side of the fixed newstyle handshake, as `nbd-client` does it:
/// `NBD_OPT_EXPORT_NAME`, then the export's size and transmission flags.
fn handshake(s: &mut UnixStream, export: &str) -> io::Result<(u64, u16)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting)?;
    if greeting[..8] != wire::NBD_MAGIC.to_be_bytes()
        || greeting[8..16] != wire::IHAVEOPT.to_be_bytes()
    {
        return Err(bad("not a newstyle NBD server"));
    }
    let mut m = (wire::CLIENT_FIXED_NEWSTYLE | wire::CLIENT_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    m.extend_from_slice(&wire::IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&wire::OPT_EXPORT_NAME.to_be_bytes());
    m.extend_from_slice(&(export.len() as u32).to_be_bytes());
    m.extend_from_slice(export.as_bytes());
    s.write_all(&m)?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply)?;
    let size = u64::from_be_bytes(reply[..8].try_into().unwrap());
    let flags = u16::from_be_bytes([reply[8], reply[9]]);
    Ok((size, flags))
}

/// A new connection given to /dev/nbd`index` in place of its dead one.
fn reconnect(
    device: &Arc<BlockDevice>,
    index: u32,
    backend: &str,
) -> Result<Served, NbdDeviceError> {
    let (client, served, ..) = connection_to(device)?;
    let done =
        NbdNetlink::open().and_then(|mut nl| nl.reconfigure(index, backend, &[client.as_raw_fd()]));
    drop(client);
    match done {
        Ok(()) => Ok(served),
        Err(source) => {
            let _ = served.thread.join();
            Err(NbdDeviceError::Reconfigure { index, source })
        }
    }
}

/// The device's agent: while the device is attached, a connection that ends (the kernel gave
/// its socket up after a timeout, or did not take it) is replaced, after a pause that grows
/// while connections keep ending at once.
fn look_after(shared: &Shared, mut served: Served) {
    let mut pause = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        let _ = served.thread.join();
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        if started.elapsed() > Duration::from_secs(10) {
            pause = Duration::from_millis(100);
        }
        loop {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(5));
            if shared.stopping.load(Ordering::Acquire) {
                return;
            }
            match reconnect(&shared.device, shared.index, &shared.backend) {
                Ok(s) => {
                    tracing::warn!(
                        volume = shared.device.name(),
                        index = shared.index,
                        "the kernel gave the nbd device's socket up; gave it a new one"
                    );
                    *lock(&shared.socket) = Some(s.socket.clone());
                    served = s;
                    break;
                }
                Err(error) => tracing::error!(volume = shared.device.name(), %error,
                    "cannot reconnect the nbd device; retrying"),
            }
        }
    }
}

/// What a device's backend identifier says: which volume of which data dir it serves.
fn backend_of(volume: &str, data_dir: &Path) -> String {
    format!("{BACKEND_PREFIX}{volume}:{}", data_dir.display())
}

fn owner_of(backend: &str) -> Option<(String, PathBuf)> {
    let (volume, dir) = backend
        .trim_end()
        .strip_prefix(BACKEND_PREFIX)?
        .split_once(':')?;
    Some((volume.to_owned(), PathBuf::from(dir)))
}

/// The nbd devices a previous daemon of `data_dir` left set up (killed, or stopped with them
/// attached).
pub fn leftovers(data_dir: &Path) -> Vec<NbdLeftover> {
    let Ok(entries) = std::fs::read_dir(SYS_BLOCK) else {
        return Vec::new();
    };
    let mut found: Vec<NbdLeftover> = entries
        .flatten()
        .filter_map(|e| {
            let index = e.file_name().to_str()?.strip_prefix("nbd")?.parse().ok()?;
            let backend = std::fs::read_to_string(e.path().join("backend")).ok()?;
            let (volume, dir) = owner_of(&backend)?;
            (dir == data_dir).then_some(NbdLeftover { index, volume })
        })
        .collect();
    found.sort_by_key(|l| l.index);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_identifier_names_the_volume_and_data_dir() {
        let b = backend_of("vm-1.disk", Path::new("/var/lib/tenant:fs"));
        assert_eq!(b, "tenantfs:vm-1.disk:/var/lib/tenant:fs");
        // sysfs ends it with a newline.
        assert_eq!(
            owner_of(&format!("{b}\n")),
            Some(("vm-1.disk".into(), PathBuf::from("/var/lib/tenant:fs")))
        );
        assert_eq!(owner_of("qemu-nbd:/img"), None);
        assert_eq!(owner_of("tenantfs:novolume"), None);
    }
}
