//! sd_notify without libsystemd: a datagram to `$NOTIFY_SOCKET` (a path, or an abstract name
//! written with a leading '@').
//!
//! The watchdog (`WatchdogSec=` in the unit) is served by a thread that sends WATCHDOG=1 every
//! half interval only after the daemon answered a request on its own control socket: a timer
//! alone would keep a wedged daemon (accept loop stuck, handlers deadlocked) alive, while
//! this way systemd restarts it. The thread connects through the server's
//! [`SocketHandle`] (an O_PATH descriptor of the socket file taken as it was bound), not
//! through the file's name: deleting or replacing `tenantfs.sock` under a healthy daemon
//! must not have systemd kill it (and take its mounts down) as hung.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::control::{Server, SocketHandle};

/// Sends `state` (e.g. "READY=1") to systemd if it is listening; does nothing otherwise.
pub fn notify_systemd(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| -> std::io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let bytes = target.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            sock.send_to(state.as_bytes(), std::path::Path::new(&target))?;
        }
        Ok(())
    })();
    if let Err(e) = sent {
        tracing::warn!(error = %e, state, "cannot notify systemd");
    }
}

/// The watchdog interval systemd asked for (`WatchdogSec=`: `$WATCHDOG_USEC`, for this pid).
pub fn watchdog_interval() -> Option<std::time::Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Some(pid) = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    {
        if pid != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| std::time::Duration::from_micros(usec))
}

/// The watchdog thread; dropping this stops its pings (the daemon is going down and its
/// socket with it).
pub struct Watchdog {
    stop: Arc<AtomicBool>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// With `WatchdogSec=` set (for this pid), sends WATCHDOG=1 every half interval, but only
/// while the daemon answers a stats request on its own control socket (`server`, reached
/// through its handle whatever became of its file): a wedged daemon gets restarted. `None`
/// when systemd asked for no watchdog.
pub fn start_watchdog(server: &Server) -> Option<Watchdog> {
    let every = watchdog_interval()?;
    let socket = server.path().to_owned();
    // Kept open by the thread while it uses its name.
    let handle: Option<SocketHandle> = server
        .handle()
        .inspect_err(|e| {
            tracing::warn!(
                socket = %socket.display(),
                error = %e,
                "watchdog: no handle on the control socket; checking it by its path"
            )
        })
        .ok();
    let target = handle
        .as_ref()
        .map_or_else(|| socket.clone(), SocketHandle::path);
    tracing::info!(
        ping_every_ms = (every / 2).as_millis() as u64,
        "serving systemd's watchdog"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("tenantfs-watchdog".into())
        .spawn(move || {
            let _handle = handle;
            loop {
                std::thread::sleep(every / 2);
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                match crate::control::Client::new(target.clone()).stats() {
                    Ok(_) => notify_systemd("WATCHDOG=1"),
                    // Not while going down: the socket closes then.
                    Err(_) if stopped.load(Ordering::Acquire) => return,
                    Err(e) => tracing::error!(
                        socket = %socket.display(),
                        error = %e,
                        "watchdog: the daemon does not answer itself"
                    ),
                }
            }
        });
    match spawned {
        Ok(_) => Some(Watchdog { stop }),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the watchdog thread");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ready_reaches_a_listening_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // No other test in this binary reads NOTIFY_SOCKET, so setting it here races nothing
        // (this crate is edition 2021, where set_var is a plain call).
        std::env::set_var("NOTIFY_SOCKET", &path);
        super::notify_systemd("READY=1");
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
