//! The serving host: what a process serving tenant mounts owns once, whatever it serves (the
//! host cache, the governor that steers its budget, the store resources every tenant's
//! RocksDB shares) and the sessions it serves, with the answers to control requests about
//! them. The daemon is a host that takes mount requests over its socket; a foreground mount
//! is a host with one mount ([`Role`]). Both are built here from the config, which stays
//! plain data.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::blockdev::BlockDevice;
use crate::cache::{process_rss_bytes, HostCache};
use crate::config::{Config, PressureConfig, StoreConfig};
use crate::control::replies::{
    CacheReleaseReply, CacheReport, MountReply, MountReport, ServedTenant, StatsReply,
    TenantListReply, UmountReply,
};
pub use crate::control::AttachVia;
use crate::control::{LimitsChange, Refusal, RefusalCode, Reply, Request};
use crate::data_dir::DataDir;
use crate::fuse::{MountError, MountOptions, Reopen, ServedVolume, Session};
use crate::metrics::{self, HostNumbers, MountMetrics};
use crate::pressure::{Governor, GovernorConfig};
use crate::space::HostSpace;
use crate::store::StoreHost;
use crate::tenants::{self, TenantError};
use crate::volume::{Opening, Volume, VolumeError};

mod attached;
mod block_volumes;
mod snapshots;
mod tenant_settings;

pub use attached::Attached;

/// What a serving process is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The host daemon: mounts whatever it is asked to.
    Daemon,
    /// A foreground mount of one tenant (mount requests go to the daemon).
    OneMount { tenant: String },
}

impl Role {
    /// How the process names itself in replies.
    fn label(&self) -> String {
        match self {
            Role::Daemon => "tenantfs daemon".into(),
            Role::OneMount { tenant } => format!("mount of tenant {tenant}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot start the cache governor: {0}")]
    Governor(#[source] std::io::Error),
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error("cannot open tenant {tenant}: {source}")]
    Volume { tenant: String, source: VolumeError },
}

/// The governor's settings from `[pressure]`, or `None` when it is turned off.
pub fn governor_config(pressure: &PressureConfig) -> Option<GovernorConfig> {
    pressure.governor.then(|| GovernorConfig {
        interval: std::time::Duration::from_millis(pressure.interval_ms),
        ..GovernorConfig::default()
    })
}

/// The shared store resources of `[store]`, on `cache`'s RocksDB cache, or on a small cache of
/// their own for commands that only create or check a store.
pub fn store_host(store: &StoreConfig, cache: Option<&HostCache>) -> StoreHost {
    let builder = StoreHost::builder()
        .write_buffer_bytes(store.write_buffers.0 as usize)
        .direct_io(store.direct_io);
    match cache {
        Some(c) => builder.block_cache(c.rocksdb().clone()),
        None => builder.block_cache_bytes(32 << 20),
    }
    .build()
}

/// `opened`'s volume on a host's cache and disk space: base blocks are read from the host's
/// packs through the host block cache.
fn volume_on(
    data: &DataDir,
    cache: &Arc<HostCache>,
    space: &Arc<HostSpace>,
    opened: tenants::Tenant,
    opening: Opening,
) -> Result<Volume, VolumeError> {
    crate::base::open_volume(data, opened, Some(cache.clone()), opening)
        .map(|v| v.with_space(space.clone()))
}

/// The sessions by mountpoint, shared with the metrics collector.
type Sessions = Arc<Mutex<BTreeMap<PathBuf, Arc<Session>>>>;

/// The attached block volumes by name, shared with the metrics collector.
type Exports = Arc<Mutex<BTreeMap<String, Attached>>>;

/// Locks `m`, going on past a poisoned lock (a panic while serving one request fails that
/// request only; the tables it guards stay usable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The path a mountpoint is known by (as given when it does not resolve).
pub fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// A store that wrote and then nothing for this long has its memtables flushed
/// ([`ServingHost::flush_idle_stores`]).
pub const IDLE_FLUSH_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// A serving process's shared resources and its sessions.
pub struct ServingHost {
    data: Arc<DataDir>,
    cache: Arc<HostCache>,
    governor: Option<Arc<Governor>>,
    stores: Arc<StoreHost>,
    /// A mount idle this long closes its store (`[store] close_idle_after`; `None`: never).
    close_idle_after: Option<std::time::Duration>,
    role: Role,
    sessions: Sessions,
    exports: Exports,
    /// The metrics of this process: one collector over the sessions, cache and governor.
    registry: Registry,
    /// Mountpoints with a mount in progress (the tenant being opened, outside `sessions`' lock).
    mounting: Mutex<BTreeSet<PathBuf>>,
    /// Volumes with an attach in progress.
    attaching: Mutex<BTreeSet<String>>,
    /// The data dir's disk, kept back from tenants' growth by the reserve.
    space: Arc<HostSpace>,
}

impl ServingHost {
    /// The host cache, governor and store resources `config` describes.
    pub fn start(data: DataDir, config: &Config, role: Role) -> Result<Self, HostError> {
        let cache = Arc::new(HostCache::new(config.cache.budget.0));
        let governor = match governor_config(&config.pressure) {
            Some(g) => Some(Arc::new(
                Governor::start(cache.clone(), cache.budget(), g).map_err(HostError::Governor)?,
            )),
            None => None,
        };
        let stores = Arc::new(store_host(&config.store, Some(&cache)));
        let sessions = Sessions::default();
        let exports = Exports::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(HostCollector {
            sessions: sessions.clone(),
            exports: exports.clone(),
            cache: cache.clone(),
            governor: governor.clone(),
        }));
        Ok(Self {
            cache,
            governor,
            stores,
            role,
            sessions,
            exports,
            registry,
            mounting: Mutex::default(),
            attaching: Mutex::default(),
            space: HostSpace::new(&data.tenants_dir(), config.store.reserve),
            close_idle_after: config.store.close_idle_after(),
            data: Arc::new(data),
        })
    }

    /// Opens `tenant`'s volume on this host's stores and cache. While the tenant's lock is
    /// held by a process that is exiting, waits for it (`tenants::open_when_free`).
    pub fn open_volume(&self, tenant: &str) -> Result<Volume, HostError> {
        let opened = tenants::open_when_free(&self.data, &self.stores, tenant)?;
        self.volume_of(opened, Opening::Fresh)
    }

    /// The volume of `opened` on this host's cache and disk space.
    fn volume_of(&self, opened: tenants::Tenant, opening: Opening) -> Result<Volume, HostError> {
        let tenant = opened.info().name.clone();
        volume_on(&self.data, &self.cache, &self.space, opened, opening)
            .map_err(|source| HostError::Volume { tenant, source })
    }

    /// Opens `tenant`'s volume for a mount, whose store closes while the mount is idle
    /// (`[store] close_idle_after`) and opens again on the lock the mount keeps.
    fn open_served(&self, tenant: &str) -> Result<ServedVolume, HostError> {
        let opened = tenants::open_when_free(&self.data, &self.stores, tenant)?;
        let reopen = self.close_idle_after.map(|_| {
            let (data, stores) = (self.data.clone(), self.stores.clone());
            let (cache, space) = (self.cache.clone(), self.space.clone());
            let (name, lock) = (tenant.to_owned(), opened.lock());
            Box::new(move || {
                let opened = tenants::open_locked(&data, &stores, &name, lock.clone()).map_err(
                    |e| match e {
                        TenantError::Store(e) => VolumeError::Store(e),
                        e => VolumeError::Unwoken {
                            tenant: name.clone(),
                            detail: e.to_string(),
                            no_space: false,
                        },
                    },
                )?;
                volume_on(&data, &cache, &space, opened, Opening::Woken)
            }) as Reopen
        });
        let volume = self.volume_of(opened, Opening::Fresh)?;
        Ok(ServedVolume::new(volume, reopen))
    }

    /// The sessions that still run (those unmounted from outside, by umount(8), are
    /// forgotten here).
    fn sessions(&self) -> MutexGuard<'_, BTreeMap<PathBuf, Arc<Session>>> {
        let mut s = lock(&self.sessions);
        let before = s.len();
        s.retain(|_, t| !t.is_finished());
        if s.len() < before {
            crate::cache::malloc::give_back_free_heap();
        }
        s
    }

    /// The session at `mountpoint`, if this host serves one there.
    pub fn session(&self, mountpoint: &Path) -> Option<Arc<Session>> {
        self.sessions().get(&absolute(mountpoint)).cloned()
    }

    /// Every running session.
    pub fn all_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions().values().cloned().collect()
    }

    /// `f` of served tenant `tenant`'s open volume: an attached block volume's, or a mount's
    /// (a dormant mount's store opens for it). [`RefusalCode::NotServed`] if this process
    /// serves neither.
    fn with_served<R>(&self, tenant: &str, f: impl FnOnce(&Volume) -> R) -> Result<R, Refusal> {
        let device = lock(&self.exports)
            .get(tenant)
            .map(|a| Arc::clone(a.device()));
        if let Some(device) = device {
            return Ok(f(device.volume()));
        }
        // A tenant's lock lets one session of this process serve it.
        let Some(served) = self
            .all_sessions()
            .into_iter()
            .filter(|s| s.tenant() == tenant)
            .find_map(|s| s.volume())
        else {
            return Err(Refusal::new(
                RefusalCode::NotServed,
                format!("tenant {tenant} is not mounted or attached by this process"),
            ));
        };
        served.woken(f).map_err(|e| {
            Refusal::new(
                RefusalCode::Internal,
                format!("tenant {tenant}: its store did not open: {e}"),
            )
        })
    }

    /// Mounts `tenant` at `mountpoint`, served by this process.
    pub fn mount(
        &self,
        tenant: &str,
        mountpoint: &Path,
        options: &MountOptions,
    ) -> Result<MountReply, Refusal> {
        let path = absolute(mountpoint);
        {
            let sessions = self.sessions();
            if let Some(s) = sessions.get(&path) {
                return Err(Refusal::new(
                    RefusalCode::AlreadyMounted,
                    MountError::AlreadyMounted {
                        path: path.clone(),
                        tenant: s.tenant().to_owned(),
                    }
                    .to_string(),
                ));
            }
            if !lock(&self.mounting).insert(path.clone()) {
                return Err(Refusal::new(
                    RefusalCode::MountInProgress,
                    format!(
                        "{} is being mounted right now; wait for that to finish",
                        path.display()
                    ),
                ));
            }
        }
        let started = self.open_and_start(tenant, &path, options);
        lock(&self.mounting).remove(&path);
        let session = started.map_err(|message| Refusal::new(RefusalCode::MountFailed, message))?;
        self.sessions().insert(path.clone(), Arc::new(session));
        Ok(MountReply {
            tenant: tenant.to_owned(),
            mountpoint: path,
            pid: std::process::id(),
        })
    }

    /// A mount asked for over the control socket, its options as for `tenantfs mount -o`:
    /// only the daemon takes these.
    pub fn mount_request(
        &self,
        tenant: &str,
        mountpoint: &Path,
        options: &str,
    ) -> Result<MountReply, Refusal> {
        if self.role != Role::Daemon {
            return Err(Refusal::new(
                RefusalCode::DaemonOnly,
                "this process serves one mount; mounts are the daemon's (start it with \
                 `tenantfs daemon`)",
            ));
        }
        let options = MountOptions::parse(options)
            .map_err(|e| Refusal::new(RefusalCode::MountFailed, e.to_string()))?;
        self.mount(tenant, mountpoint, &options)
    }

    fn open_and_start(
        &self,
        tenant: &str,
        path: &Path,
        options: &MountOptions,
    ) -> Result<Session, String> {
        // The tenant first: after a kill -9 of the server that had it, opening waits for the
        // exiting holder, by which time the kernel has made its old mount dead, which
        // `Session::start` then detaches (checked first, a mount still dying looks live).
        let volume = self.open_served(tenant).map_err(|e| e.to_string())?;
        Session::start(volume, path, options).map_err(|e| e.to_string())
    }

    /// Unmounts what this host serves at `mountpoint`, waiting until its store is closed.
    pub fn umount(&self, mountpoint: &Path) -> Result<UmountReply, Refusal> {
        let path = absolute(mountpoint);
        let Some(session) = self.sessions().get(&path).cloned() else {
            let whom = match self.role {
                Role::Daemon => "the daemon",
                Role::OneMount { .. } => "this process",
            };
            return Err(Refusal::new(
                RefusalCode::NotServed,
                format!("{whom} serves nothing at {}", mountpoint.display()),
            ));
        };
        session.unmount().map_err(|e| {
            let code = match e {
                MountError::Busy(_) => RefusalCode::Busy,
                _ => RefusalCode::UnmountFailed,
            };
            Refusal::new(code, e.to_string())
        })?;
        lock(&self.sessions).remove(&path);
        crate::cache::malloc::give_back_free_heap();
        Ok(UmountReply {
            tenant: session.tenant().to_owned(),
        })
    }

    /// Unmounts everything (busy mounts are detached), waiting for every store to close.
    pub fn shutdown(&self) {
        let attached = std::mem::take(&mut *lock(&self.exports));
        for (_, mut a) in attached {
            a.shut_down();
        }
        let mut sessions = lock(&self.sessions);
        for (path, s) in sessions.iter() {
            if let Err(e) = s.unmount() {
                tracing::warn!(path = %path.display(), error = %e, "busy at shutdown: detaching");
                s.detach();
                s.join();
            }
        }
        sessions.clear();
    }

    /// Resumes stores that stopped for lack of space once there is room again, and raises
    /// the MANIFEST limits that key rotations lowered once they are done with them.
    pub fn resume_stores(&self) {
        self.each_store(|db| {
            db.try_resume();
            db.raise_manifest_limits();
        });
    }

    /// Flushes the memtables of stores that wrote and then nothing for [`IDLE_FLUSH_AFTER`]
    /// (without waiting): an idle tenant's memtables stop holding part of the cache budget.
    pub fn flush_idle_stores(&self) {
        self.each_store(|db| {
            db.flush_if_idle(IDLE_FLUSH_AFTER);
        });
    }

    /// Closes the stores of mounts idle for `[store] close_idle_after` (see
    /// `fuse::dormancy`), and gives the memory they held back to the kernel.
    pub fn rest_idle_mounts(&self) {
        let Some(after) = self.close_idle_after else {
            return;
        };
        let rested = self
            .all_sessions()
            .iter()
            .filter(|s| s.rest_if_idle(after))
            .count();
        if rested > 0 {
            crate::cache::malloc::give_back_free_heap();
            tracing::debug!(rested, "idle mounts' stores closed");
        }
    }

    /// Calls `f` with the open store of every served mount and volume, outside the sessions'
    /// lock (a resume flushes memtables, which can take a while). Dormant mounts' stores are
    /// closed: nothing to do for them.
    fn each_store(&self, f: impl Fn(&crate::store::TenantDb)) {
        let served: Vec<_> = self
            .all_sessions()
            .iter()
            .filter_map(|s| s.volume())
            .collect();
        for v in served {
            v.if_awake(|v| f(v.tenant().db()));
        }
        let devices: Vec<Arc<BlockDevice>> = lock(&self.exports)
            .values()
            .map(|e| e.device().clone())
            .collect();
        for d in devices {
            f(d.volume().tenant().db());
        }
    }

    /// The cache's numbers and the governor's state.
    pub fn cache_report(&self) -> CacheReport {
        CacheReport {
            server: self.role.label(),
            pid: std::process::id(),
            cache: self.cache.stats(),
            process_rss_bytes: process_rss_bytes().ok(),
            ceiling_bytes: self
                .governor
                .as_ref()
                .map_or(self.cache.budget(), |g| g.ceiling()),
            governor: self.governor.as_ref().map(|g| g.stats()),
        }
    }

    /// Evicts about `bytes` now and gives the memory back to the kernel.
    pub fn cache_release(&self, bytes: u64) -> CacheReleaseReply {
        let rss_before_bytes = process_rss_bytes().ok();
        let released_bytes = self.cache.release(bytes);
        // Evicted entries free malloc'd metadata too: hand glibc's free pages back as well.
        crate::cache::malloc::give_back_free_heap();
        CacheReleaseReply {
            server: self.role.label(),
            pid: std::process::id(),
            requested_bytes: bytes,
            released_bytes,
            rss_before_bytes,
            rss_after_bytes: process_rss_bytes().ok(),
        }
    }

    /// Sets the operator's budget ceiling (the governor may hold the budget lower).
    pub fn set_cache_budget(&self, bytes: u64) -> CacheReport {
        match &self.governor {
            Some(g) => g.set_ceiling(bytes),
            None => self.cache.set_budget(bytes),
        }
        tracing::info!(bytes, "cache budget set by the operator");
        self.cache_report()
    }

    /// The served mounts with their activity and store state.
    fn mount_reports(&self) -> Vec<MountReport> {
        self.all_sessions()
            .iter()
            .map(|s| {
                let store = s.store();
                MountReport {
                    tenant: s.tenant().to_owned(),
                    mountpoint: s.path().to_owned(),
                    activity: s.metrics().summary(),
                    direct_io: store.as_ref().map(|(_, d)| *d),
                    dormant: store.as_ref().is_some_and(|(s, _)| s.is_none()),
                    store: store.and_then(|(s, _)| s),
                    limits: s.limits().into(),
                    quota: s.volume().map(|v| v.quota()).filter(|q| !q.is_unlimited()),
                    usage: s.volume().map(|v| v.usage()),
                }
            })
            .collect()
    }

    /// The mounts and host numbers (waiting mounts are the daemon's to add).
    pub fn stats(&self) -> StatsReply {
        StatsReply {
            pid: std::process::id(),
            mounts: self.mount_reports(),
            volumes: self.volume_reports(),
            waiting_mounts: Vec::new(),
            waiting_volumes: Vec::new(),
            cache: self.cache_report(),
            log_lines_dropped: crate::logging::dropped_lines(),
        }
    }

    /// The tenants this host serves, each with its mountpoints (the CLI merges this into the
    /// data dir's list, so the server does not walk the tenant directories again).
    pub fn tenant_list(&self) -> TenantListReply {
        let mut served: BTreeMap<String, ServedTenant> = BTreeMap::new();
        for (path, s) in self.sessions().iter() {
            let tenant = served
                .entry(s.tenant().to_owned())
                .or_insert_with(|| ServedTenant {
                    name: s.tenant().to_owned(),
                    mounts: Vec::new(),
                    usage: None,
                });
            tenant.mounts.push(path.clone());
            tenant.usage = tenant.usage.or_else(|| s.volume().map(|v| v.usage()));
        }
        TenantListReply {
            tenants: served.into_values().collect(),
        }
    }

    /// Answers one control request.
    pub fn handle(&self, req: Request) -> Result<Reply, Refusal> {
        Ok(match req {
            Request::CacheStats => Reply::Cache(self.cache_report()),
            Request::CacheRelease { bytes } => Reply::CacheRelease(self.cache_release(bytes)),
            Request::CacheBudget { bytes } => Reply::Cache(self.set_cache_budget(bytes)),
            Request::Mount {
                tenant,
                mountpoint,
                options,
            } => Reply::Mount(self.mount_request(&tenant, Path::new(&mountpoint), &options)?),
            Request::Umount { mountpoint } => Reply::Umount(self.umount(Path::new(&mountpoint))?),
            Request::Stats => Reply::Stats(self.stats()),
            Request::TenantList => Reply::TenantList(self.tenant_list()),
            Request::VolumeAttach {
                volume,
                nbd,
                ublk,
                nbd_device,
            } => {
                let Some(via) = AttachVia::of(nbd, ublk, nbd_device) else {
                    return Err(Refusal::new(
                        RefusalCode::AttachFailed,
                        "say how to serve the volume: an NBD address, ublk or an nbd device, \
                         one of them",
                    ));
                };
                Reply::VolumeAttach(self.attach_volume(&volume, &via)?)
            }
            Request::VolumeDetach { volume } => Reply::VolumeDetach(self.detach_volume(&volume)?),
            Request::SetLimits {
                tenant,
                iops,
                bandwidth,
                weight,
            } => Reply::Limits(self.set_limits(
                &tenant,
                LimitsChange {
                    iops,
                    bandwidth,
                    weight,
                },
            )?),
            Request::SetQuota {
                tenant,
                bytes,
                inodes,
            } => Reply::Quota(self.set_quota(&tenant, bytes, inodes)?),
            Request::SnapshotCreate { tenant, name } => {
                Reply::Snapshot(self.snapshot(&tenant, &name)?)
            }
            Request::TenantFork {
                source,
                new,
                snapshot,
            } => Reply::Fork(self.fork(&source, &new, snapshot.as_deref())?),
            Request::RotateKey { tenant, rewrite } => {
                Reply::Key(self.rotate_key(&tenant, rewrite)?)
            }
            Request::RotateMaster { new_key } => {
                Reply::MasterKey(self.rotate_master(Path::new(&new_key))?)
            }
        })
    }

    /// The metrics in the OpenMetrics text format: per-mount operation series and host
    /// numbers (the catalogue is `crate::metrics`).
    pub fn render_metrics(&self) -> String {
        crate::metrics::exposition(&self.registry)
    }
}

/// Reads the host's numbers at each scrape.
struct HostCollector {
    sessions: Sessions,
    exports: Exports,
    cache: Arc<HostCache>,
    governor: Option<Arc<Governor>>,
}

impl std::fmt::Debug for HostCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCollector").finish_non_exhaustive()
    }
}

impl Collector for HostCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions)
            .values()
            .filter(|s| !s.is_finished())
            .cloned()
            .collect();
        let devices: Vec<Arc<BlockDevice>> = lock(&self.exports)
            .values()
            .map(|e| e.device().clone())
            .collect();
        let mounts: Vec<(&str, &MountMetrics)> =
            sessions.iter().map(|s| (s.tenant(), s.metrics())).collect();
        // An attached volume's series are a tenant's like a mount's (`tenant` = its name).
        let served: Vec<(&str, &MountMetrics)> = mounts
            .iter()
            .copied()
            .chain(devices.iter().map(|d| (d.name(), &**d.metrics())))
            .collect();
        metrics::encode_mounts(&mut encoder, &served)?;
        let dormant_mounts = sessions
            .iter()
            .filter_map(|s| s.volume())
            .filter(|v| v.is_dormant())
            .count() as u64;
        let c = self.cache.stats();
        let g = self
            .governor
            .as_ref()
            .map(|g| g.stats())
            .unwrap_or_default();
        metrics::encode_host(
            &mut encoder,
            &HostNumbers {
                mounts: mounts.len() as u64,
                dormant_mounts,
                mount_wakes: crate::fuse::dormant_mount_wakes(),
                cache_budget_bytes: c.budget_bytes,
                cache_used_bytes: c.used_bytes,
                cache_resident_bytes: c.resident_bytes,
                cache_hits: c.hits,
                cache_misses: c.misses,
                cache_evictions: c.evictions,
                cache_released_bytes: c.released_bytes,
                base_block_cache_hits: c.blocks.hits,
                process_rss_bytes: process_rss_bytes().unwrap_or(0),
                log_lines_dropped: crate::logging::dropped_lines(),
                pressure_events: g.pressure_events,
                governor_shrinks: g.shrinks,
                governor_grows: g.grows,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_becomes_runtime_settings() {
        let p = Path::new("t.toml");
        let c = Config::parse("[pressure]\ninterval_ms = 200\n", p).unwrap();
        assert_eq!(
            governor_config(&c.pressure).unwrap().interval,
            std::time::Duration::from_millis(200)
        );
        let off = Config::parse("[pressure]\ngovernor = false\n", p).unwrap();
        assert!(governor_config(&off.pressure).is_none());
        assert_eq!(Role::Daemon.label(), "tenantfs daemon");
        assert_eq!(
            Role::OneMount { tenant: "a".into() }.label(),
            "mount of tenant a"
        );
    }
}
