//! Mounting, serving and unmounting a tenant filesystem, and reading the mount table.
//!
//! `serve` mounts a [`Volume`] with fuser and answers requests until the filesystem is
//! unmounted (by `tenantfs umount`, umount(8), or SIGTERM/SIGINT to the serving process), then
//! makes everything durable. A mountpoint left dead by a killed server ("transport endpoint is
//! not connected") is detached before mounting again.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use fuser::{Config, MountOption, SessionACL};
use nix::sys::signal::{SigSet, Signal};

use super::adapter::{CacheMode, TenantFs};
use super::ring::{self, Transport};
use crate::volume::Volume;

/// Threads answering FUSE requests for one mount.
const FUSE_THREADS: usize = 4;
/// Filesystem type as the mount table shows it.
pub const FS_TYPE: &str = "fuse.tenantfs";
const SOURCE_PREFIX: &str = "tenantfs:";

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mountpoint {0} does not exist; create it first (mkdir -p {0})")]
    NoMountpoint(PathBuf),
    #[error("mountpoint {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{path} is already mounted (tenant {tenant}); unmount it first with `tenantfs umount {path}`")]
    AlreadyMounted { path: PathBuf, tenant: String },
    #[error("nothing is mounted at {0}")]
    NotMounted(PathBuf),
    #[error("{path} is a {fstype} mount, not a tenantfs mount; use umount(8) for it")]
    NotTenantfs { path: PathBuf, fstype: String },
    #[error("{0} is busy: a process still uses files under it (see `fuser -vm {0}`); stop it and try again")]
    Busy(PathBuf),
    #[error("unknown mount option {0:?}: use cache=direct, cache=kernel, transport=auto, transport=uring, transport=dev, ro or rw")]
    BadOption(String),
    #[error("transport=uring asks for FUSE over io_uring, which this kernel has off: as root, `echo Y > {}` (Linux 6.14 or newer), or mount with transport=auto or transport=dev", ring::ENABLE_PARAMETER)]
    UringOff,
    #[error("cannot mount at {path}: {source}")]
    Mount { path: PathBuf, source: io::Error },
    #[error("cannot unmount {path}: {source}")]
    Unmount { path: PathBuf, source: io::Error },
}

/// Options of one mount (`-o` on the command line).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountOptions {
    pub cache: CacheMode,
    pub read_only: bool,
    /// How requests reach the daemon (`transport=auto|uring|dev`).
    pub transport: Transport,
}

impl MountOptions {
    /// Parses a comma-separated option list such as `cache=kernel,ro`. Options mount(8) passes
    /// along that do not change this filesystem (rw, dev, suid, exec, ...) are accepted.
    pub fn parse(list: &str) -> Result<Self, MountError> {
        let mut o = Self::default();
        for opt in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match opt {
                "cache=direct" => o.cache = CacheMode::Direct,
                "cache=kernel" => o.cache = CacheMode::Kernel,
                "ro" => o.read_only = true,
                t if t.starts_with("transport=") => {
                    o.transport = Transport::parse(&t["transport=".len()..])
                        .ok_or_else(|| MountError::BadOption(t.to_owned()))?;
                }
                "rw" => o.read_only = false,
                "dev" | "nodev" | "suid" | "nosuid" | "exec" | "noexec" | "atime" | "noatime"
                | "relatime" | "auto" | "noauto" | "nofail" | "defaults" | "_netdev" => {}
                other => return Err(MountError::BadOption(other.to_owned())),
            }
        }
        Ok(o)
    }
}

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    /// The tenant served at this mount, if it is a tenantfs mount.
    pub fn tenant(&self) -> Option<&str> {
        // Older releases mounted as plain "fuse"; their mounts are still recognised.
        (self.fstype == FS_TYPE || self.fstype == "fuse")
            .then(|| self.source.strip_prefix(SOURCE_PREFIX))
            .flatten()
    }
}

fn unescape(field: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mountpoint = unescape(left.split(' ').nth(4)?);
            let mut r = right.split(' ');
            let fstype = r.next()?.to_owned();
            let source = unescape(r.next()?);
            Some(MountEntry {
                mountpoint: PathBuf::from(mountpoint),
                fstype,
                source,
            })
        })
        .collect()
}

/// The mount at exactly `path` (the last one, if stacked).
pub fn find_mount(path: &Path) -> io::Result<Option<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = absolute(path);
    Ok(parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == want))
}

/// `path` made absolute and free of `.`/`..` and trailing slashes, without touching the
/// filesystem (a dead FUSE mountpoint cannot be canonicalised).
fn absolute(path: &Path) -> PathBuf {
    let base = if path.is_absolute() {
        PathBuf::new()
    } else {
        std::env::current_dir().unwrap_or_default()
    };
    let mut out = PathBuf::from("/");
    for c in base.join(path).components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Whether a mountpoint answers (a killed FUSE server leaves ENOTCONN behind). statfs always
/// asks the server: stat(2) would be answered from the root's cached attributes for up to
/// their TTL after the server died, and a restarted daemon would take the dead mount for a
/// live one ("already mounted") until they expired.
fn is_dead(path: &Path) -> bool {
    matches!(
        nix::sys::statfs::statfs(path),
        Err(nix::errno::Errno::ENOTCONN)
    )
}

/// Checks that `path` can take a new mount, detaching a dead tenantfs mount left there.
pub fn prepare_mountpoint(path: &Path) -> Result<(), MountError> {
    if let Some(m) = find_mount(path).ok().flatten() {
        if let Some(tenant) = m.tenant() {
            if is_dead(path) {
                tracing::warn!(path = %path.display(), tenant, "detaching a dead mount left by a killed server");
                nix::mount::umount2(&absolute(path), nix::mount::MntFlags::MNT_DETACH).map_err(
                    |e| MountError::Unmount {
                        path: path.to_owned(),
                        source: e.into(),
                    },
                )?;
            } else {
                return Err(MountError::AlreadyMounted {
                    path: path.to_owned(),
                    tenant: tenant.to_owned(),
                });
            }
        }
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(MountError::NotADirectory(path.to_owned())),
        Err(_) => Err(MountError::NoMountpoint(path.to_owned())),
    }
}

/// The signals that make `serve` unmount (SIGHUP is taken and ignored).
fn shutdown_signals() -> SigSet {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signals
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and so in every thread it starts
/// afterwards. Call it before opening the store: a process-directed signal goes to any thread
/// that does not block it, and one of RocksDB's background threads taking SIGTERM or SIGINT
/// would kill the server and leave a dead mount instead of a clean unmount. `serve` waits for
/// them on a thread of its own.
pub fn block_shutdown_signals() {
    let _ = shutdown_signals().thread_block();
}

/// Waits (in the calling thread, which must block them: [`block_shutdown_signals`]) for
/// SIGTERM or SIGINT; SIGHUP is ignored.
pub fn wait_for_shutdown_signal() -> Signal {
    loop {
        match shutdown_signals().wait() {
            Ok(Signal::SIGHUP) => continue,
            Ok(sig) => return sig,
            Err(_) => continue,
        }
    }
}

/// Mounts `volume` at `mountpoint`, calls `ready` once the kernel has completed the FUSE
/// handshake, and serves until unmounted or until SIGTERM/SIGINT. The store is synced when the
/// volume drops. Threads started before this call must block those signals (see
/// [`block_shutdown_signals`]).
fn session_config(tenant: &str, options: &MountOptions) -> Config {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(format!("{SOURCE_PREFIX}{tenant}")),
        // To the kernel, so the mount table says `fuse.tenantfs` (fuser keeps its Subtype
        // option for fusermount and mounts as plain `fuse` when it calls mount(2) itself).
        MountOption::CUSTOM("subtype=tenantfs".into()),
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
        if options.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    // The tenant's processes are not the daemon's user; the kernel checks permissions.
    cfg.acl = SessionACL::All;
    cfg.n_threads = Some(FUSE_THREADS);
    cfg.clone_fd = true;
    cfg
}

/// Mounts `fs` and hands its io_uring side the session's device (a duplicate: fuser keeps
/// reading the original for INIT, FORGET and INTERRUPT).
fn open_session(
    fs: TenantFs,
    mountpoint: &Path,
    cfg: &Config,
    options: &MountOptions,
) -> Result<fuser::Session<TenantFs>, MountError> {
    if options.transport == Transport::Uring && !ring::kernel_enabled() {
        return Err(MountError::UringOff);
    }
    let mount_err = |source| MountError::Mount {
        path: mountpoint.to_owned(),
        source,
    };
    let ring = fs.ring();
    let session = fuser::Session::new(fs, mountpoint, cfg).map_err(mount_err)?;
    if options.transport != Transport::Device {
        use std::os::fd::AsFd;
        ring.set_device(session.as_fd().try_clone_to_owned().map_err(mount_err)?);
    }
    Ok(session)
}

/// A tenant mounted and served by threads of this process (the daemon's mounts). The store
/// stays open until the session ends: by [`MountedTenant::unmount`], or by umount(8).
pub struct MountedTenant {
    pub tenant: String,
    pub path: PathBuf,
    pub options: MountOptions,
    /// The mount's operation counters.
    pub metrics: std::sync::Arc<crate::metrics::MountMetrics>,
    /// The served volume while the session runs (the session owns it: the store closes as
    /// soon as the session ends).
    volume: std::sync::Weak<Volume>,
    unmounter: fuser::SessionUnmounter,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

/// Mounts `volume` at `mountpoint` and serves it from new threads; returns once mounted.
pub fn spawn_mount(
    volume: Volume,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<MountedTenant, MountError> {
    prepare_mountpoint(mountpoint)?;
    let tenant = volume.tenant().info().name.clone();
    let metrics = crate::metrics::MountMetrics::new();
    let volume = std::sync::Arc::new(volume);
    let served = std::sync::Arc::downgrade(&volume);
    let fs = TenantFs::new(volume, options.cache, metrics.clone(), options.transport);
    let mount_err = |source| MountError::Mount {
        path: mountpoint.to_owned(),
        source,
    };
    let mut session = open_session(fs, mountpoint, &session_config(&tenant, options), options)?;
    let unmounter = session.unmount_callable();
    let name = format!("tenantfs-{tenant}");
    let path = mountpoint.to_owned();
    let thread = std::thread::Builder::new()
        .name(name.chars().take(15).collect())
        .spawn(move || {
            let r = session.run();
            tracing::info!(path = %path.display(), "unmounted");
            r
        })
        .map_err(mount_err)?;
    tracing::info!(tenant, path = %mountpoint.display(), "mounted");
    Ok(MountedTenant {
        tenant,
        path: mountpoint.to_owned(),
        options: options.clone(),
        metrics,
        volume: served,
        unmounter,
        thread: Some(thread),
    })
}

impl MountedTenant {
    /// The served tenant's store: whether it takes writes, and whether it uses O_DIRECT. None
    /// once the session has ended.
    pub fn store(&self) -> Option<(crate::store::StoreState, bool)> {
        let v = self.volume()?;
        let db = v.tenant().db();
        Some((db.state(), db.direct_io()))
    }

    /// The served volume, while the session runs.
    pub fn volume(&self) -> Option<std::sync::Arc<Volume>> {
        self.volume.upgrade()
    }

    /// Whether the session has ended (unmounted from outside, e.g. by umount(8)).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Unmounts and waits until the session ended and the store closed. A busy mount stays
    /// mounted and served (the error says so).
    pub fn unmount(&mut self) -> Result<(), MountError> {
        if !self.is_finished() {
            if let Err(e) = self.unmounter.unmount() {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    return Err(MountError::Busy(self.path.clone()));
                }
                // fuser's unmounter works once; fall back to unmounting by path.
                unmount(&self.path)?;
            }
        }
        self.join();
        Ok(())
    }

    /// Detaches the mount even while it is busy (MNT_DETACH): for shutting down.
    pub fn detach(&mut self) {
        if !self.is_finished() {
            if let Err(e) = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH) {
                tracing::error!(path = %self.path.display(), error = %e, "lazy unmount failed");
            }
        }
    }

    fn join(&mut self) {
        if let Some(t) = self.thread.take() {
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

    /// Waits for the session to end (after `detach` or an outside unmount).
    pub fn wait(&mut self) {
        self.join();
    }
}

pub fn serve(
    volume: Volume,
    mountpoint: &Path,
    options: &MountOptions,
    ready: impl FnOnce(),
) -> Result<(), MountError> {
    prepare_mountpoint(mountpoint)?;
    let tenant = volume.tenant().info().name.clone();
    let fs = TenantFs::new(
        volume,
        options.cache,
        crate::metrics::MountMetrics::new(),
        options.transport,
    );
    let cfg = session_config(&tenant, options);

    // Signals are taken by one thread with sigwait; block them before fuser starts threads.
    let signals = shutdown_signals();
    block_shutdown_signals();

    let mount_err = |source| MountError::Mount {
        path: mountpoint.to_owned(),
        source,
    };
    let mut session = open_session(fs, mountpoint, &cfg, options)?;
    let mut unmounter = session.unmount_callable();
    let path = mountpoint.to_owned();
    std::thread::Builder::new()
        .name("tenantfs-signals".into())
        .spawn(move || {
            let mut first = true;
            loop {
                match signals.wait() {
                    Ok(Signal::SIGHUP) => continue,
                    Ok(sig) => {
                        tracing::info!(?sig, path = %path.display(), "unmounting on signal");
                        // fuser's unmounter works once; a retry (after a busy mount) unmounts
                        // by path like `tenantfs umount` does.
                        let result = if first {
                            unmounter.unmount().map_err(|e| e.to_string())
                        } else {
                            unmount(&path).map(drop).map_err(|e| e.to_string())
                        };
                        first = false;
                        match result {
                            Ok(()) => return,
                            Err(e) => tracing::error!(
                                error = %e,
                                "unmount on signal failed; send the signal again once the mount is idle"
                            ),
                        }
                    }
                    Err(_) => return,
                }
            }
        })
        .map_err(mount_err)?;
    tracing::info!(tenant, path = %mountpoint.display(), "mounted");
    ready();
    session.run().map_err(mount_err)?;
    tracing::info!(tenant, path = %mountpoint.display(), "unmounted");
    Ok(())
}

/// Unmounts the tenantfs mount at `path`; returns the tenant that was mounted there.
pub fn unmount(path: &Path) -> Result<String, MountError> {
    let entry = find_mount(path)
        .map_err(|source| MountError::Unmount {
            path: path.to_owned(),
            source,
        })?
        .ok_or_else(|| MountError::NotMounted(path.to_owned()))?;
    let tenant = entry
        .tenant()
        .ok_or_else(|| MountError::NotTenantfs {
            path: path.to_owned(),
            fstype: entry.fstype.clone(),
        })?
        .to_owned();
    let target = std::ffi::CString::new(entry.mountpoint.as_os_str().as_bytes()).map_err(|e| {
        MountError::Unmount {
            path: path.to_owned(),
            source: io::Error::other(e),
        }
    })?;
    let flags = if is_dead(path) {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(target.as_c_str(), flags) {
        Ok(()) => Ok(tenant),
        Err(nix::errno::Errno::EBUSY) => Err(MountError::Busy(path.to_owned())),
        Err(nix::errno::Errno::EPERM) => {
            // Not root: the setuid helper can unmount what this user mounted.
            let out = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(&entry.mountpoint)
                .output()
                .map_err(|source| MountError::Unmount {
                    path: path.to_owned(),
                    source,
                })?;
            if out.status.success() {
                Ok(tenant)
            } else {
                Err(MountError::Unmount {
                    path: path.to_owned(),
                    source: io::Error::other(
                        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                    ),
                })
            }
        }
        Err(e) => Err(MountError::Unmount {
            path: path.to_owned(),
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing() {
        let text = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    80 36 0:50 / /tmp/with\\040space rw,nosuid,nodev shared:2 - fuse.tenantfs tenantfs:alpha rw,user_id=0\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].mountpoint, PathBuf::from("/tmp/with space"));
        assert_eq!(m[1].tenant(), Some("alpha"));
        assert_eq!(m[0].tenant(), None);
        assert_eq!(m[0].fstype, "ext3");
    }

    #[test]
    fn options() {
        assert_eq!(MountOptions::parse("").unwrap(), MountOptions::default());
        let o = MountOptions::parse("cache=kernel,ro,noatime").unwrap();
        assert_eq!(o.cache, CacheMode::Kernel);
        assert!(o.read_only);
        assert!(MountOptions::parse("cache=bogus").is_err());
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(absolute(Path::new("/a/b/../c/")), PathBuf::from("/a/c"));
    }
}
