//! The host daemon: one process serving every mounted tenant with one host cache, one
//! governor and one control socket, so the cache really is host-wide (N tenants of one base
//! share one cached copy) and operators have one thing to run under systemd.
//!
//! `mount`/`umount`/`cache ...` commands talk to it over the control socket when it runs.
//! SIGTERM/SIGINT unmount everything (flushing each store) and exit; a panic while serving
//! one request fails that request only (see `control::server`).

mod notify;
mod waiting;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::base::BaseBlockReader;
use crate::cache::HostCache;
use crate::config::Config;
use crate::control::{self, Request, Response, Server};
use crate::data_dir::DataDir;
use crate::fuse::{spawn_mount, MountOptions, MountedTenant};
use crate::pressure::Governor;
use crate::store::StoreHost;
use crate::volume::Volume;

pub use notify::notify_systemd;
use waiting::WaitingMount;

/// How often the daemon looks after its mounts: configured mounts still waiting, stores that
/// stopped for lack of space.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// Where the daemon listens when `--socket` and `TENANTFS_SOCKET` are not given.
pub fn default_socket(data_root: &Path) -> PathBuf {
    data_root.join("tenantfs.sock")
}

/// A running daemon's state.
pub struct Daemon {
    data: DataDir,
    cache: Arc<HostCache>,
    governor: Option<Arc<Governor>>,
    host: StoreHost,
    mounts: Mutex<BTreeMap<PathBuf, MountedTenant>>,
    /// Mountpoints with a mount in progress (the tenant being opened, outside `mounts`' lock).
    mounting: Mutex<BTreeSet<PathBuf>>,
    /// Configured mounts that failed and are retried, by mountpoint.
    waiting: Mutex<BTreeMap<PathBuf, WaitingMount>>,
    /// The last STATUS= line sent to systemd.
    status: Mutex<String>,
    cache_requests: control::Handler,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

impl Daemon {
    pub fn new(data: DataDir, config: &Config) -> std::io::Result<Arc<Self>> {
        let cache = Arc::new(config.host_cache());
        let governor = match config.governor() {
            Some(g) => Some(Arc::new(Governor::start(cache.clone(), cache.budget(), g)?)),
            None => None,
        };
        let host = config.store_host(Some(&cache));
        let cache_requests =
            control::cache_handler(cache.clone(), governor.clone(), "tenantfs daemon".into());
        Ok(Arc::new(Self {
            data,
            cache,
            governor,
            host,
            mounts: Mutex::default(),
            mounting: Mutex::default(),
            waiting: Mutex::default(),
            status: Mutex::default(),
            cache_requests,
        }))
    }

    fn mounts(&self) -> MutexGuard<'_, BTreeMap<PathBuf, MountedTenant>> {
        let mut m = lock(&self.mounts);
        // Sessions unmounted from outside (umount(8)) have ended: forget them.
        let before = m.len();
        m.retain(|_, t| !t.is_finished());
        if m.len() < before {
            crate::cache::malloc::give_back_free_heap();
        }
        m
    }

    /// Mounts `tenant` at `mountpoint`, served by this process. While the tenant's lock is
    /// held by a process that is exiting, waits for it (`tenants::open_when_free`).
    pub fn mount(&self, tenant: &str, mountpoint: &Path, options: &str) -> Result<Value, String> {
        let options = MountOptions::parse(options).map_err(|e| e.to_string())?;
        let path = absolute(mountpoint);
        {
            let mounts = self.mounts();
            if let Some(m) = mounts.get(&path) {
                return Err(format!(
                    "{} is already mounted (tenant {}); unmount it first with `tenantfs umount {}`",
                    path.display(),
                    m.tenant,
                    path.display()
                ));
            }
            if !lock(&self.mounting).insert(path.clone()) {
                return Err(format!(
                    "{} is being mounted right now; wait for that to finish",
                    path.display()
                ));
            }
        }
        let mounted = self.open_and_serve(tenant, &path, &options);
        lock(&self.mounting).remove(&path);
        let mounted = mounted?;
        self.mounts().insert(path.clone(), mounted);
        // Mounted by hand while its configured entry waited: nothing left to retry.
        lock(&self.waiting).remove(&path);
        Ok(json!({"tenant": tenant, "mountpoint": path, "pid": std::process::id()}))
    }

    fn open_and_serve(
        &self,
        tenant: &str,
        path: &Path,
        options: &MountOptions,
    ) -> Result<MountedTenant, String> {
        let opened = crate::tenants::open_when_free(&self.data, &self.host, tenant)
            .map_err(|e| e.to_string())?;
        let from_base = opened.info().base.is_some();
        let mut volume =
            Volume::open(opened).map_err(|e| format!("cannot open tenant {tenant}: {e}"))?;
        if from_base {
            volume = volume.with_base(Arc::new(BaseBlockReader::new(
                &self.data,
                Some(self.cache.clone()),
            )));
        }
        spawn_mount(volume, path, options).map_err(|e| e.to_string())
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
                    WaitingMount::new(&m.tenant, &m.options, error),
                );
            }
        }
    }

    /// One round of looking after the mounts: retries waiting configured mounts that are due,
    /// resumes stores that stopped for lack of space once there is room, and tells systemd.
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
                        if entry.failed_again(error.clone()) {
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
        // Outside the mounts lock: a resume flushes memtables, which can take a while.
        let served: Vec<_> = self.mounts().values().filter_map(|m| m.volume()).collect();
        for v in served {
            v.tenant().db().try_resume();
        }
        self.tell_systemd();
    }

    /// STATUS= for `systemctl status`: the mounts, and what is not mounted or not writable.
    fn tell_systemd(&self) {
        let mut status = format!("serving {} mounts", self.mounts().len());
        let waiting = lock(&self.waiting);
        if !waiting.is_empty() {
            let list: Vec<String> = waiting
                .iter()
                .map(|(p, w)| format!("{} at {} ({})", w.tenant, p.display(), w.error))
                .collect();
            status += &format!("; not mounted yet: {}", list.join(", "));
        }
        drop(waiting);
        let full: Vec<String> = self
            .mounts()
            .values()
            .filter(|m| m.store().is_some_and(|(s, _)| s.label() != "rw"))
            .map(|m| m.tenant.clone())
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

    /// Unmounts what this daemon serves at `mountpoint`; `Ok(None)` if it serves nothing there.
    pub fn umount(&self, mountpoint: &Path) -> Result<Option<String>, String> {
        let path = absolute(mountpoint);
        let mut mounts = self.mounts();
        let Some(m) = mounts.get_mut(&path) else {
            return Ok(None);
        };
        m.unmount().map_err(|e| e.to_string())?;
        let m = mounts.remove(&path).expect("present");
        drop(mounts);
        let tenant = m.tenant.clone();
        // The store is closed once the session and its volume are gone.
        drop(m);
        crate::cache::malloc::give_back_free_heap();
        Ok(Some(tenant))
    }

    /// Unmounts everything (busy mounts are detached), waiting for every store to close.
    pub fn shutdown(&self) {
        let mut mounts = lock(&self.mounts);
        for (path, m) in mounts.iter_mut() {
            if let Err(e) = m.unmount() {
                tracing::warn!(path = %path.display(), error = %e, "busy at shutdown: detaching");
                m.detach();
                m.wait();
            }
        }
        mounts.clear();
    }

    fn stats(&self) -> Value {
        let mounts: Vec<Value> = self
            .mounts()
            .values()
            .map(|m| {
                let mut v = m.metrics.summary();
                v["tenant"] = json!(m.tenant);
                v["mountpoint"] = json!(m.path);
                if let Some((state, direct_io)) = m.store() {
                    v["store"] = json!(state);
                    v["direct_io"] = json!(direct_io);
                }
                v
            })
            .collect();
        let cache = (self.cache_requests)(Request::CacheStats)
            .result
            .unwrap_or(Value::Null);
        let waiting: Vec<Value> = lock(&self.waiting)
            .iter()
            .map(|(p, w)| json!(w.report(p)))
            .collect();
        json!({
            "pid": std::process::id(),
            "mounts": mounts,
            "waiting_mounts": waiting,
            "cache": cache,
            "log_lines_dropped": crate::logging::dropped_lines(),
        })
    }

    /// The tenants this daemon serves, each with its mountpoints (the CLI merges this into
    /// the data dir's list, so the daemon does not walk the tenant directories again).
    fn tenant_list(&self) -> Value {
        let mut served: BTreeMap<&str, Vec<&PathBuf>> = BTreeMap::new();
        let mounts = self.mounts();
        for (path, m) in mounts.iter() {
            served.entry(m.tenant.as_str()).or_default().push(path);
        }
        served
            .into_iter()
            .map(|(name, at)| json!({"name": name, "mounts": at}))
            .collect()
    }

    /// Everything in the Prometheus text format: per-mount operation series and host numbers.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        crate::metrics::mount_metric_types(&mut out);
        let mounts = self.mounts();
        for m in mounts.values() {
            m.metrics.render(&m.tenant, &mut out);
        }
        let c = self.cache.stats();
        let g = self.governor.as_ref().map(|g| g.stats());
        let rss = crate::cache::process_rss_bytes().unwrap_or(0);
        let host: [(&str, &str, u64); 14] = [
            ("tenantfs_mounts", "gauge", mounts.len() as u64),
            ("tenantfs_cache_budget_bytes", "gauge", c.budget_bytes),
            ("tenantfs_cache_used_bytes", "gauge", c.used_bytes),
            ("tenantfs_cache_resident_bytes", "gauge", c.resident_bytes),
            ("tenantfs_cache_hits_total", "counter", c.hits),
            ("tenantfs_cache_misses_total", "counter", c.misses),
            ("tenantfs_cache_evictions_total", "counter", c.evictions),
            (
                "tenantfs_cache_released_bytes_total",
                "counter",
                c.released_bytes,
            ),
            (
                "tenantfs_base_block_cache_hits_total",
                "counter",
                c.blocks.hits,
            ),
            ("tenantfs_process_rss_bytes", "gauge", rss),
            (
                "tenantfs_log_lines_dropped_total",
                "counter",
                crate::logging::dropped_lines(),
            ),
            (
                "tenantfs_pressure_events_total",
                "counter",
                g.as_ref().map_or(0, |g| g.pressure_events),
            ),
            (
                "tenantfs_governor_shrinks_total",
                "counter",
                g.as_ref().map_or(0, |g| g.shrinks),
            ),
            (
                "tenantfs_governor_grows_total",
                "counter",
                g.as_ref().map_or(0, |g| g.grows),
            ),
        ];
        for (name, kind, v) in host {
            let _ = writeln!(out, "# TYPE {name} {kind}\n{name} {v}");
        }
        out
    }

    /// Answers one control request.
    pub fn handle(&self, req: Request) -> Response {
        let result = match req {
            Request::Mount {
                tenant,
                mountpoint,
                options,
            } => self.mount(&tenant, Path::new(&mountpoint), &options),
            Request::Umount { mountpoint } => match self.umount(Path::new(&mountpoint)) {
                Ok(Some(tenant)) => Ok(json!({"tenant": tenant})),
                Ok(None) => Err(format!("the daemon serves nothing at {mountpoint}")),
                Err(e) => Err(e),
            },
            Request::Stats => Ok(self.stats()),
            Request::TenantList => Ok(self.tenant_list()),
            other => return (self.cache_requests)(other),
        };
        match result {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(e),
        }
    }

    pub fn governor(&self) -> Option<&Governor> {
        self.governor.as_deref()
    }
}

/// Each mounted tenant holds about a dozen descriptors (its store's files, the FUSE device
/// and its per-worker clones): the soft limit (often 1,024) is raised to the hard one.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            tracing::info!(from = soft, to = hard, "raised the open files limit");
        }
    }
}

/// Runs the daemon until SIGTERM/SIGINT: control socket at `socket`, READY=1 to systemd.
/// The caller must have blocked the shutdown signals before any thread started.
pub fn run(data: DataDir, config: &Config, socket: &Path) -> std::io::Result<()> {
    raise_open_files_limit();
    let daemon = Daemon::new(data, config)?;
    let handler: control::Handler = {
        let d = daemon.clone();
        Arc::new(move |req| d.handle(req))
    };
    let server = Server::start(socket, handler)?;
    if let Some(listen) = config.metrics.listen {
        let d = daemon.clone();
        let addr = crate::metrics::serve(listen, Arc::new(move || d.render_metrics()))?;
        tracing::info!(%addr, "metrics served");
    }
    // The tenants the config lists (after a crash, their dead mounts are detached first).
    daemon.mount_configured(&config.mounts);
    tracing::info!(socket = %socket.display(), "tenantfs daemon ready");
    notify_systemd("READY=1");
    daemon.tell_systemd();
    notify::start_watchdog(socket.to_owned());
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
            })?
    };
    let sig = crate::fuse::wait_for_shutdown_signal();
    tracing::info!(?sig, "shutting down: unmounting every tenant");
    notify_systemd("STOPPING=1");
    drop(stop);
    let _ = supervisor.join();
    drop(server);
    daemon.shutdown();
    Ok(())
}
