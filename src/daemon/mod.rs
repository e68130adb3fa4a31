//! Serving processes: the host daemon, one process serving every mounted tenant with one
//! host cache, one governor and one control socket, so the cache really is host-wide (N
//! tenants of one base share one cached copy) and operators have one thing to run under
//! systemd; and a foreground mount, the same [`ServingHost`] serving one mount.
//!
//! `mount`/`umount`/`cache ...` commands talk to the daemon over the control socket when it
//! runs. SIGTERM/SIGINT unmount everything (flushing each store) and exit; a panic while
//! serving one request fails that request only (see `control::server`).

mod notify;
mod waiting;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::control::replies::MountReply;
use crate::control::{self, AttachVia, Refusal, Reply, Request, Server};
use crate::data_dir::DataDir;
use crate::fuse::MountOptions;
use crate::host::{absolute, lock, HostError, Role, ServingHost};

pub use notify::notify_systemd;
use waiting::WaitingMount;

/// How often a serving process looks after its mounts: configured mounts still waiting,
/// stores that stopped for lack of space.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// Where the daemon listens when `--socket` and `TENANTFS_SOCKET` are not given.
pub fn default_socket(data_root: &Path) -> PathBuf {
    data_root.join("tenantfs.sock")
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Mount(#[from] Refusal),
    #[error("cannot open the control socket {path}: {source}")]
    Control {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot serve metrics: {0}")]
    Metrics(#[source] std::io::Error),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A running daemon: a serving host that takes mount requests, and the configured mounts it
/// has not mounted yet.
pub struct Daemon {
    host: ServingHost,
    /// Configured mounts that failed and are retried, by mountpoint.
    waiting: Mutex<BTreeMap<PathBuf, WaitingMount>>,
    /// Configured volumes that failed to attach and are retried, by name.
    waiting_volumes: Mutex<BTreeMap<String, (AttachVia, WaitingMount)>>,
    /// The last STATUS= line sent to systemd.
    status: Mutex<String>,
}

impl Daemon {
    pub fn new(data: DataDir, config: &Config) -> Result<Arc<Self>, HostError> {
        Ok(Arc::new(Self {
            host: ServingHost::start(data, config, Role::Daemon)?,
            waiting: Mutex::default(),
            waiting_volumes: Mutex::default(),
            status: Mutex::default(),
        }))
    }

    /// Mounts `tenant` at `mountpoint` with options as for `tenantfs mount -o`.
    pub fn mount(
        &self,
        tenant: &str,
        mountpoint: &Path,
        options: &str,
    ) -> Result<MountReply, Refusal> {
        let reply = self.host.mount_request(tenant, mountpoint, options)?;
        // Mounted by hand while its configured entry waited: nothing left to retry.
        lock(&self.waiting).remove(&reply.mountpoint);
        Ok(reply)
    }

    /// Mounts the config's `[[mount]]` entries; those that fail wait and are retried by
    /// [`Self::supervise`].
    fn mount_configured(&self, entries: &[crate::config::MountConfig]) {
        for m in entries {
            if let Err(error) = self.mount(&m.tenant, &m.mountpoint, &m.options) {
                tracing::error!(
                    tenant = %m.tenant,
                    mountpoint = %m.mountpoint.display(),
                    %error,
                    "cannot mount a configured tenant; retrying until it mounts"
                );
                lock(&self.waiting).insert(
                    absolute(&m.mountpoint),
                    WaitingMount::new(&m.tenant, &m.options, error.message),
                );
            }
        }
    }

    /// Attaches the config's `[[volume]]` entries (one a previous daemon left as a ublk
    /// device is attached already: recovered); those that fail wait and are retried by
    /// [`Self::supervise`].
    fn attach_configured(&self, entries: &[crate::config::VolumeConfig]) {
        for v in entries {
            let via = v.via();
            if let Err(error) = self.attach_configured_volume(&v.name, &via) {
                tracing::error!(volume = %v.name, %via, %error,
                    "cannot attach a configured volume; retrying until it attaches");
                let w = WaitingMount::new(&v.name, &via.to_string(), error);
                lock(&self.waiting_volumes).insert(v.name.clone(), (via, w));
            }
        }
    }

    /// One configured volume: attached now, or attached already (recovered, or by hand).
    fn attach_configured_volume(&self, volume: &str, via: &AttachVia) -> Result<(), String> {
        match self.host.attach_volume(volume, via) {
            Ok(r) => {
                tracing::info!(volume, kind = %r.served.kind, address = %r.served.address, "attached a configured volume");
                Ok(())
            }
            Err(e) if e.code == control::RefusalCode::AlreadyAttached => Ok(()),
            Err(e) => Err(e.message),
        }
    }

    /// Retries the configured volumes that are due.
    fn retry_volumes(&self) {
        let now = Instant::now();
        let due: Vec<(String, AttachVia)> = lock(&self.waiting_volumes)
            .iter()
            .filter(|(_, (_, w))| w.due(now))
            .map(|(n, (via, _))| (n.clone(), via.clone()))
            .collect();
        for (name, via) in due {
            match self.attach_configured_volume(&name, &via) {
                Ok(()) => {
                    lock(&self.waiting_volumes).remove(&name);
                }
                Err(error) => {
                    if let Some((_, w)) = lock(&self.waiting_volumes).get_mut(&name) {
                        if w.failed_again(error.clone()) {
                            tracing::error!(volume = %name, %via, %error, attempts = w.attempts,
                                "cannot attach a configured volume; retrying until it attaches");
                        }
                    }
                }
            }
        }
    }

    /// One round of looking after the mounts: retries waiting configured mounts that are due,
    /// resumes stores that stopped for lack of space once there is room, flushes idle
    /// stores' memtables, and tells systemd.
    fn supervise(&self) {
        let now = Instant::now();
        let due: Vec<(PathBuf, WaitingMount)> = lock(&self.waiting)
            .iter()
            .filter(|(_, w)| w.due(now))
            .map(|(p, w)| (p.clone(), w.clone()))
            .collect();
        for (path, w) in due {
            match self.mount(&w.tenant, &path, &w.options) {
                Ok(_) => {
                    // Under its own key too (the path may canonicalise differently now).
                    lock(&self.waiting).remove(&path);
                    tracing::info!(
                        tenant = %w.tenant,
                        mountpoint = %path.display(),
                        attempts = w.attempts + 1,
                        "mounted a configured tenant"
                    )
                }
                Err(error) => {
                    if let Some(entry) = lock(&self.waiting).get_mut(&path) {
                        if entry.failed_again(error.message.clone()) {
                            tracing::error!(
                                tenant = %w.tenant,
                                mountpoint = %path.display(),
                                %error,
                                attempts = entry.attempts,
                                "cannot mount a configured tenant; retrying until it mounts"
                            );
                        }
                    }
                }
            }
        }
        self.retry_volumes();
        self.host.resume_stores();
        self.host.flush_idle_stores();
        self.host.rest_idle_mounts();
        self.tell_systemd();
    }

    /// STATUS= for `systemctl status`: the mounts, and what is not mounted or not writable.
    fn tell_systemd(&self) {
        let sessions = self.host.all_sessions();
        let mut status = format!("serving {} mounts", sessions.len());
        let waiting = lock(&self.waiting);
        if !waiting.is_empty() {
            let list: Vec<String> = waiting
                .iter()
                .map(|(p, w)| format!("{} at {} ({})", w.tenant, p.display(), w.error))
                .collect();
            status += &format!("; not mounted yet: {}", list.join(", "));
        }
        drop(waiting);
        let volumes = lock(&self.waiting_volumes);
        if !volumes.is_empty() {
            let list: Vec<String> = volumes
                .iter()
                .map(|(n, (via, w))| format!("{n} as {via} ({})", w.error))
                .collect();
            status += &format!("; not attached yet: {}", list.join(", "));
        }
        drop(volumes);
        let full: Vec<&str> = sessions
            .iter()
            .filter(|s| {
                s.store()
                    .is_some_and(|(s, _)| s.is_some_and(|s| s.label() != "rw"))
            })
            .map(|s| s.tenant())
            .collect();
        if !full.is_empty() {
            status += &format!("; not taking writes: {}", full.join(", "));
        }
        let mut last = lock(&self.status);
        if *last != status {
            notify_systemd(&format!("STATUS={status}"));
            *last = status;
        }
    }

    /// Answers one control request: the host's answers, with the waiting mounts in `stats`.
    pub fn handle(&self, req: Request) -> Result<Reply, Refusal> {
        match req {
            Request::Mount {
                tenant,
                mountpoint,
                options,
            } => Ok(Reply::Mount(self.mount(
                &tenant,
                Path::new(&mountpoint),
                &options,
            )?)),
            Request::Stats => {
                let mut stats = self.host.stats();
                stats.waiting_mounts = lock(&self.waiting)
                    .iter()
                    .map(|(p, w)| w.report(p))
                    .collect();
                stats.waiting_volumes = lock(&self.waiting_volumes)
                    .values()
                    .map(|(_, w)| w.volume_report())
                    .collect();
                Ok(Reply::Stats(stats))
            }
            Request::VolumeAttach { ref volume, .. } => {
                let name = volume.clone();
                let reply = self.host.handle(req)?;
                // Attached by hand while its configured entry waited: nothing left to retry.
                lock(&self.waiting_volumes).remove(&name);
                Ok(reply)
            }
            other => self.host.handle(other),
        }
    }
}

/// Each mounted tenant holds about a dozen descriptors while its store is open (its store's
/// files, the FUSE device and the one copy its transport and notifications share) and 3 once
/// dormant: the soft limit (often 1,024) is raised to the hard one.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            tracing::info!(from = soft, to = hard, "raised the open files limit");
        }
    }
}

fn control_server(socket: &Path, handler: control::Handler) -> Result<Server, DaemonError> {
    Server::start(socket, handler).map_err(|source| DaemonError::Control {
        path: socket.to_owned(),
        source,
    })
}

/// Runs the daemon until SIGTERM/SIGINT: control socket at `socket`, READY=1 to systemd.
/// The caller must have blocked the shutdown signals before any thread started.
pub fn run(data: DataDir, config: &Config, socket: &Path) -> Result<(), DaemonError> {
    raise_open_files_limit();
    match crate::tenants::remove_leftovers(&data) {
        Ok(0) => {}
        Ok(n) => tracing::info!(n, "removed what killed creates and deletes of tenants left"),
        Err(e) => tracing::warn!(error = %e, "cannot remove what killed tenant commands left"),
    }
    let daemon = Daemon::new(data, config)?;
    // The ublk devices a previous daemon left (killed, or stopped with them attached), before
    // the socket takes requests: their held I/O goes on here.
    daemon.host.recover_block_devices();
    let handler: control::Handler = {
        let d = daemon.clone();
        Arc::new(move |req| d.handle(req))
    };
    let server = control_server(socket, handler)?;
    if let Some(listen) = config.metrics.listen {
        let d = daemon.clone();
        let addr = crate::metrics::serve(listen, Arc::new(move || d.host.render_metrics()))
            .map_err(DaemonError::Metrics)?;
        tracing::info!(%addr, "metrics served");
    }
    // The tenants the config lists (after a crash, their dead mounts are detached first).
    daemon.mount_configured(&config.mounts);
    daemon.attach_configured(&config.volumes);
    tracing::info!(socket = %socket.display(), "tenantfs daemon ready");
    notify_systemd("READY=1");
    daemon.tell_systemd();
    let watchdog = notify::start_watchdog(&server);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let supervisor = {
        let d = daemon.clone();
        std::thread::Builder::new()
            .name("tenantfs-supervise".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(SUPERVISE_EVERY)
                {
                    d.supervise();
                }
            })
            .map_err(DaemonError::Thread)?
    };
    let sig = crate::fuse::wait_for_shutdown_signal();
    tracing::info!(?sig, "shutting down: unmounting every tenant");
    drop(watchdog);
    notify_systemd("STOPPING=1");
    drop(stop);
    let _ = supervisor.join();
    drop(server);
    daemon.host.shutdown();
    Ok(())
}

/// Serves `tenant` at `mountpoint` in this process until it is unmounted (or SIGTERM/SIGINT
/// unmounts it), calling `ready` once mounted: a daemon with one mount, its control socket
/// under `<data-dir>/run/` for the cache commands. The caller must have blocked the
/// shutdown signals before any thread started.
pub fn run_one_mount(
    data: DataDir,
    config: &Config,
    tenant: &str,
    mountpoint: &Path,
    options: &MountOptions,
    ready: impl FnOnce(),
) -> Result<(), DaemonError> {
    let socket = control::mount_socket(data.root(), tenant);
    let role = Role::OneMount {
        tenant: tenant.to_owned(),
    };
    let host = Arc::new(ServingHost::start(data, config, role)?);
    let server = {
        let h = host.clone();
        control_server(&socket, Arc::new(move |req| h.handle(req)))?
    };
    host.mount(tenant, mountpoint, options)?;
    let Some(session) = host.session(mountpoint) else {
        // Unmounted from outside already.
        return Ok(());
    };
    {
        let session = session.clone();
        std::thread::Builder::new()
            .name("tenantfs-signals".into())
            .spawn(move || loop {
                let sig = crate::fuse::wait_for_shutdown_signal();
                tracing::info!(?sig, path = %session.path().display(), "unmounting on signal");
                match session.unmount() {
                    Ok(()) => return,
                    Err(e) => tracing::error!(
                        error = %e,
                        "unmount on signal failed; send the signal again once the mount is idle"
                    ),
                }
            })
            .map_err(DaemonError::Thread)?;
    }
    ready();
    while !session.wait(Some(SUPERVISE_EVERY)) {
        host.resume_stores();
        host.flush_idle_stores();
        host.rest_idle_mounts();
    }
    session.join();
    drop(server);
    host.shutdown();
    Ok(())
}
