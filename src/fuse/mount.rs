//! Mountpoints and the mount table: mount options, checking a mountpoint before mounting
//! (one left dead by a killed server, "transport endpoint is not connected", is detached
//! first), mounting a tenant's FUSE device, finding tenantfs mounts in /proc/self/mountinfo,
//! unmounting by path, and the shutdown signals a serving process waits for. Serving itself
//! is [`super::Session`].

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};
use std::num::{NonZeroU32, NonZeroU64};

use crate::io_limits::IoLimits;
use crate::units::ByteSize;

use super::ops::CacheMode;
use super::ring::{self, Transport};

/// Filesystem type as the mount table shows it.
pub const FS_TYPE: &str = "fuse.tenantfs";
/// The mount source of a tenant's mount: `tenantfs:NAME`.
pub(super) const SOURCE_PREFIX: &str = "tenantfs:";

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
    #[error("unknown mount option {0:?}: use cache=direct, cache=kernel, transport=auto, transport=uring, transport=dev, iops=N, bandwidth=SIZE, weight=N, ro or rw")]
    BadOption(String),
    #[error("mount option {0:?}: a limit is a positive number (iops=1000, bandwidth=100M: bytes a second); leave the option out for no limit")]
    BadLimit(String),
    #[error("mount option {0:?}: a weight is a whole number from 1 to {max} (default {default}); a tenant with twice the weight of another gets twice its share when both are busy", max = crate::fair_share::MAX_WEIGHT, default = crate::fair_share::DEFAULT_WEIGHT)]
    BadWeight(String),
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
    /// The tenant's I/O limits on this mount (`iops=N`, `bandwidth=SIZE` a second).
    pub limits: IoLimits,
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
                l if l.starts_with("iops=") => {
                    let n = l["iops=".len()..].parse::<u32>().ok();
                    o.limits.iops = Some(n.and_then(NonZeroU32::new).ok_or_else(|| bad_limit(l))?);
                }
                l if l.starts_with("bandwidth=") => {
                    let n = l["bandwidth=".len()..].parse::<ByteSize>().ok();
                    o.limits.bandwidth = Some(
                        n.and_then(|b| NonZeroU64::new(b.0))
                            .ok_or_else(|| bad_limit(l))?,
                    );
                }
                w if w.starts_with("weight=") => {
                    let n = w["weight=".len()..].parse::<u32>().ok();
                    o.limits.weight = Some(
                        n.filter(|n| *n <= crate::fair_share::MAX_WEIGHT)
                            .and_then(NonZeroU32::new)
                            .ok_or_else(|| MountError::BadWeight(w.to_owned()))?,
                    );
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

fn bad_limit(option: &str) -> MountError {
    MountError::BadLimit(option.to_owned())
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

/// Whether `path` is a directory on the same device as its parent: nothing of its own
/// mounted there (a FUSE mount has a device of its own; a dead one fails the stat).
fn on_parents_device(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let path = absolute(path);
    let Some(parent) = path.parent() else {
        return false;
    };
    match (std::fs::symlink_metadata(&path), std::fs::metadata(parent)) {
        (Ok(m), Ok(p)) => m.dev() == p.dev(),
        _ => false,
    }
}

/// Checks that `path` can take a new mount, detaching a dead tenantfs mount left there.
pub fn prepare_mountpoint(path: &Path) -> Result<(), MountError> {
    // The mount table costs as much to read as there are mounts (10,000 mounts: tens of ms),
    // and a directory on its parent's device has no tenantfs mount on it.
    let mounted = if on_parents_device(path) {
        None
    } else {
        find_mount(path).ok().flatten()
    };
    if let Some(m) = mounted {
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

/// Mounts tenant `tenant`'s filesystem at `mountpoint` over a new FUSE device and returns the
/// device, the one descriptor a mount keeps (its INIT still to be answered). mount(2) as
/// fuser's own mount does it for root: type `fuse` with `subtype=tenantfs`, source
/// `tenantfs:NAME`, devices and setuid bits honoured, the kernel checking permissions
/// (`default_permissions`) for every user (`allow_other`).
pub(super) fn mount_device(
    mountpoint: &Path,
    tenant: &str,
    read_only: bool,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    let root_mode = std::fs::metadata(mountpoint)?.permissions().mode();
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => io::Error::new(
                e.kind(),
                "/dev/fuse does not exist: load the FUSE module (modprobe fuse)",
            ),
            _ => io::Error::new(e.kind(), format!("/dev/fuse: {e}")),
        })?;
    let data = format!(
        "fd={},rootmode={root_mode:o},user_id={},group_id={},subtype=tenantfs,\
         default_permissions,allow_other",
        device.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid(),
    );
    let mut flags = nix::mount::MsFlags::empty();
    if read_only {
        flags |= nix::mount::MsFlags::MS_RDONLY;
    }
    nix::mount::mount(
        Some(format!("{SOURCE_PREFIX}{tenant}").as_str()),
        mountpoint,
        Some("fuse"),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| match e {
        nix::errno::Errno::EPERM => io::Error::new(
            io::ErrorKind::PermissionDenied,
            "mounting a tenant needs root (CAP_SYS_ADMIN); run it as root or through the daemon",
        ),
        e => io::Error::other(format!("mount(2) with {data:?}: {e}")),
    })?;
    Ok(device.into())
}

/// The signals that end a serving process cleanly (SIGHUP is taken and ignored).
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
/// would kill the server and leave a dead mount instead of a clean unmount. The serving
/// process waits for them on a thread of its own ([`wait_for_shutdown_signal`]).
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
    fn a_weight_is_a_whole_number_up_to_the_largest() {
        let o = MountOptions::parse("weight=300").unwrap();
        assert_eq!(o.limits.weight, NonZeroU32::new(300));
        assert!(o.limits.is_unlimited(), "a weight limits nothing");
        assert!(MountOptions::parse("weight=10000").is_ok());
        for bad in [
            "weight=0",
            "weight=10001",
            "weight=-1",
            "weight=heavy",
            "weight=",
        ] {
            let e = MountOptions::parse(bad).unwrap_err();
            assert!(matches!(e, MountError::BadWeight(_)), "{bad}: {e}");
            assert!(e.to_string().contains("from 1 to 10000"), "{e}");
        }
    }

    #[test]
    fn limits_are_positive_numbers() {
        let o = MountOptions::parse("iops=1000,bandwidth=100M").unwrap();
        assert_eq!(o.limits.iops, NonZeroU32::new(1000));
        assert_eq!(o.limits.bandwidth, NonZeroU64::new(100 << 20));
        for bad in [
            "iops=0",
            "iops=-5",
            "iops=lots",
            "bandwidth=0",
            "bandwidth=1Q",
            "iops=",
        ] {
            let e = MountOptions::parse(bad).unwrap_err();
            assert!(matches!(e, MountError::BadLimit(_)), "{bad}: {e}");
            assert!(e.to_string().contains("positive number"), "{e}");
        }
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(absolute(Path::new("/a/b/../c/")), PathBuf::from("/a/c"));
    }
}
