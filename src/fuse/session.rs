//! One mounted tenant filesystem being served: the one session type of tenantfs.
//!
//! [`Session::start`] mounts a [`Volume`] (mount(2) by [`mount_device`], INIT answered by
//! fuser over a passing copy of the device, so the mount keeps one descriptor) and serves it
//! from threads of this process: the host's ring threads when the kernel takes FUSE over
//! io_uring ([`super::ring`]), else a thread of its own, the first /dev/fuse worker, with
//! more started on demand ([`super::device`]). It returns once the kernel has the mount. The session ends by
//! [`Session::unmount`], by [`Session::detach`] (shutdown of a busy mount), or from outside
//! (umount(8), `tenantfs umount`); [`Session::wait`] waits for the end, and the volume (the
//! session owns it) is dropped then, which makes the store durable and closes it. The daemon
//! and a foreground mount serve through this same type.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, SessionACL};

use super::device;
use super::dormancy::ServedVolume;
use super::handshake::Handshake;
use super::mount::{mount_device, prepare_mountpoint, unmount, MountError, MountOptions};
use super::ops::Operations;
use super::ring::{self, Transport};
use crate::io_limits::IoLimits;
use crate::metrics::MountMetrics;
use crate::store::StoreState;

/// The most threads answering FUSE requests on /dev/fuse for one mount at once (they start
/// on demand from one).
const MAX_DEVICE_WORKERS: usize = 4;

/// What fuser needs to answer INIT (the mount itself is [`mount_device`]'s).
fn session_config() -> Config {
    let mut cfg = Config::default();
    // The tenant's processes are not the daemon's user; the kernel checks permissions.
    cfg.acl = SessionACL::All;
    cfg
}

/// Whether a session has ended, for waiters.
#[derive(Default)]
struct Ended {
    done: Mutex<bool>,
    changed: Condvar,
}

impl Ended {
    fn set(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }
}

/// What ending the session takes over /dev/fuse: the serving thread (over the ring, the
/// host's ring threads serve the mount and start its end).
struct Control {
    thread: Option<JoinHandle<io::Result<()>>>,
}

/// A tenant mounted and served by threads of this process.
pub struct Session {
    tenant: String,
    path: PathBuf,
    metrics: Arc<MountMetrics>,
    /// The served volume while the session runs (the serving thread owns it, so the store
    /// closes as soon as the session ends).
    volume: Weak<ServedVolume>,
    /// The operations while the session runs: its I/O limits change through them.
    ops: Weak<Operations>,
    control: Mutex<Control>,
    ended: Arc<Ended>,
}

impl Session {
    /// Mounts `volume` at `mountpoint` and serves it from new threads; returns once mounted.
    pub fn start(
        volume: ServedVolume,
        mountpoint: &Path,
        options: &MountOptions,
    ) -> Result<Self, MountError> {
        prepare_mountpoint(mountpoint)?;
        if options.transport == Transport::Uring && !ring::kernel_enabled() {
            return Err(MountError::UringOff);
        }
        let tenant = volume.tenant().to_owned();
        let metrics = MountMetrics::new();
        let volume = Arc::new(volume);
        let served = Arc::downgrade(&volume);
        let fs = Handshake::new(volume, options, metrics.clone());
        let mount_err = |source| MountError::Mount {
            path: mountpoint.to_owned(),
            source,
        };
        let (ring, ops) = (fs.ring(), fs.ops());
        let served_ops = Arc::downgrade(&ops);
        let device = mount_device(mountpoint, &tenant, options.read_only).map_err(mount_err)?;
        // fuser answers INIT through `fs` over a second descriptor of the device, which goes
        // with its session right after: the mount keeps one, for the transport and the
        // notifications alike.
        let negotiated = device.try_clone().and_then(|copy| {
            fuser::Session::from_fd(fs, copy, SessionACL::All, session_config()).map(drop)
        });
        if let Err(e) = negotiated {
            let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
            return Err(mount_err(e));
        }
        let device = Arc::new(device);
        ops.set_device(device.clone());
        let ended = Arc::new(Ended::default());
        let end = {
            let path = mountpoint.to_owned();
            let (ended, ring, ops) = (ended.clone(), ring.clone(), ops.clone());
            move || {
                // The ring stopped and the store synced (its volume goes with the last
                // reference to the operations), so the store is durable and closed before
                // waiters hear of the end.
                ring.stop();
                ops.destroy();
                drop(ops);
                tracing::info!(path = %path.display(), "unmounted");
                ended.set();
            }
        };
        let thread = if ring.is_started() {
            // The host's ring threads serve the mount, its device included.
            ring.attach(device, Box::new(end));
            None
        } else {
            let name: String = format!("tenantfs-{tenant}").chars().take(15).collect();
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let r = device::serve(device, ops, MAX_DEVICE_WORKERS, "fuse-worker");
                    end();
                    r
                })
                .map_err(|e| {
                    // Nothing would answer the mount: take it away.
                    let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
                    mount_err(e)
                })?;
            Some(thread)
        };
        tracing::info!(tenant, path = %mountpoint.display(), "mounted");
        Ok(Self {
            tenant,
            path: mountpoint.to_owned(),
            metrics,
            volume: served,
            ops: served_ops,
            control: Mutex::new(Control { thread }),
            ended,
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mount's operation counters.
    pub fn metrics(&self) -> &MountMetrics {
        &self.metrics
    }

    /// The tenant's I/O limits on this mount (none once the session has ended).
    pub fn limits(&self) -> IoLimits {
        self.ops.upgrade().map(|o| o.limits()).unwrap_or_default()
    }

    /// Answers data requests within `limits` from now on; false once the session has ended.
    pub fn set_limits(&self, limits: IoLimits) -> bool {
        let Some(ops) = self.ops.upgrade() else {
            return false;
        };
        ops.set_limits(limits);
        tracing::info!(tenant = %self.tenant, ?limits, "I/O limits set");
        true
    }

    /// The served volume, while the session runs.
    pub fn volume(&self) -> Option<Arc<ServedVolume>> {
        self.volume.upgrade()
    }

    /// The served store: whether it takes writes (`None` while dormant: closed), and whether
    /// it uses O_DIRECT. None once the session has ended.
    pub fn store(&self) -> Option<(Option<StoreState>, bool)> {
        let v = self.volume()?;
        let state = v.if_awake(|v| v.tenant().db().state());
        Some((state, v.direct_io()))
    }

    /// Closes the store if the mount has answered no request for `after` (see
    /// [`super::dormancy`]); says whether it closed now.
    pub fn rest_if_idle(&self, after: Duration) -> bool {
        let requests = self.metrics.requests();
        self.volume()
            .is_some_and(|v| v.rest_if_idle(requests, after))
    }

    /// Whether the session has ended (unmounted from outside, e.g. by umount(8)).
    pub fn is_finished(&self) -> bool {
        *self.ended.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `timeout` (forever for `None`) for the session to end; says whether it has.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let done = self.ended.done.lock().unwrap_or_else(|p| p.into_inner());
        let done = match timeout {
            None => self
                .ended
                .changed
                .wait_while(done, |d| !*d)
                .unwrap_or_else(|p| p.into_inner()),
            Some(t) => {
                self.ended
                    .changed
                    .wait_timeout_while(done, t, |d| !*d)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        *done
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unmounts and waits until the session ended and the store closed. A busy mount stays
    /// mounted and served (the error says so).
    pub fn unmount(&self) -> Result<(), MountError> {
        if !self.is_finished() {
            match nix::mount::umount2(&self.path, nix::mount::MntFlags::empty()) {
                Ok(()) => {}
                Err(nix::errno::Errno::EBUSY) => return Err(MountError::Busy(self.path.clone())),
                // Not busy, but not unmounted either: by path, as `tenantfs umount` does.
                Err(_) => {
                    unmount(&self.path)?;
                }
            }
        }
        self.join();
        Ok(())
    }

    /// Detaches the mount even while it is busy (MNT_DETACH): for shutting down.
    pub fn detach(&self) {
        if !self.is_finished() {
            if let Err(e) = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH) {
                tracing::error!(path = %self.path.display(), error = %e, "lazy unmount failed");
            }
        }
    }

    /// Waits for the session's end (the store closed) and logs how it ended.
    pub fn join(&self) {
        let Some(t) = self.control().thread.take() else {
            self.wait(None);
            return;
        };
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(path = %self.path.display(), error = %e, "FUSE session ended with an error")
            }
            Err(_) => {
                tracing::error!(path = %self.path.display(), "FUSE session thread panicked")
            }
        }
    }
}
