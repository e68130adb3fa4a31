//! The asking side: send one request, read one response.
//!
//! A socket that cannot be reached is told apart by connect(2)'s errno, since each case
//! needs something else done: ENOENT or ECONNREFUSED (no socket, or one a dead process left)
//! means nothing serves there: start it; EACCES or EPERM means a process may well serve
//! there but the caller may not talk to it: run as root; anything else is reported as it is,
//! with the path.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::{AttachVia, Refusal, Reply, Request, Response};
use super::replies::{
    CacheReleaseReply, CacheReport, ForkReply, KeyReply, LimitsReply, MasterKeyReply, MountReply,
    QuotaReply, SnapshotReply, StatsReply, TenantListReply, UmountReply, VolumeAttachReply,
    VolumeDetachReply,
};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no tenantfs process is serving mounts under {0} (mount a tenant first: the caches live in the process that serves it)")]
    NoServer(PathBuf),
    #[error(
        "nothing serves the control socket {path} ({source}): the process that served it is \
         not running"
    )]
    NotRunning {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "permission denied on {path} ({source}): {who}; run this as root (or as that user)",
        who = super::WHO_MAY_CONNECT
    )]
    Denied {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The directory of the per-mount sockets could not be listed: not a socket, so not
    /// [`ControlError::Denied`]'s wording.
    #[error(
        "permission denied listing {dir} ({source}), the directory where the processes serving \
         mounts put their control sockets: it is private to the user that made it; run this \
         as root (or as that user)"
    )]
    RunDirDenied {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot reach the control socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {path}: {detail}")]
    Protocol { path: PathBuf, detail: String },
    /// The server sent nothing, not even the spaces it sends while it works, for `secs`.
    #[error(
        "the process serving {path} has sent nothing for {secs} s (it sends a space every \
         {keepalive} s while it works on a request): it is stopped or stuck; see its log, and \
         restart it if it does not recover (the request may still complete there)",
        keepalive = super::server::KEEPALIVE.as_secs()
    )]
    Silent { path: PathBuf, secs: u64 },
    #[error("{path}: {refusal}")]
    Refused { path: PathBuf, refusal: Refusal },
}

impl ControlError {
    /// Why connect(2) to the control socket at `path` failed, by its errno.
    fn connect(path: &Path, source: std::io::Error) -> Self {
        let path = path.to_owned();
        match source.raw_os_error() {
            Some(libc::ENOENT | libc::ECONNREFUSED) => ControlError::NotRunning { path, source },
            Some(libc::EACCES | libc::EPERM) => ControlError::Denied { path, source },
            _ => ControlError::Connect { path, source },
        }
    }

    /// The server's refusal, if that is what this is.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            ControlError::Refused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// How long a server may stay silent before a call fails: several of its keep-alive spaces.
const PATIENCE: Duration = Duration::from_secs(60);

/// One serving process's control socket, with one typed call per request.
#[derive(Clone, Debug)]
pub struct Client {
    path: PathBuf,
    /// How long the server may stay silent before the call fails.
    patience: Duration,
}

/// One typed call: sends the request and takes the reply of the variant it answers with.
macro_rules! call {
    ($self:ident, $req:expr, $variant:ident) => {
        match $self.call(&$req)? {
            Reply::$variant(r) => Ok(r),
            other => Err($self.unexpected(&$req, &other)),
        }
    };
}

impl Client {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            patience: PATIENCE,
        }
    }

    /// This client, failing a call once the server was silent for `patience`.
    #[cfg(test)]
    pub(crate) fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn cache_stats(&self) -> Result<CacheReport, ControlError> {
        call!(self, Request::CacheStats, Cache)
    }

    pub fn cache_release(&self, bytes: u64) -> Result<CacheReleaseReply, ControlError> {
        call!(self, Request::CacheRelease { bytes }, CacheRelease)
    }

    pub fn cache_budget(&self, bytes: u64) -> Result<CacheReport, ControlError> {
        call!(self, Request::CacheBudget { bytes }, Cache)
    }

    pub fn mount(
        &self,
        tenant: &str,
        mountpoint: &Path,
        options: &str,
    ) -> Result<MountReply, ControlError> {
        let req = Request::Mount {
            tenant: tenant.to_owned(),
            mountpoint: mountpoint.to_string_lossy().into_owned(),
            options: options.to_owned(),
        };
        call!(self, req, Mount)
    }

    pub fn umount(&self, mountpoint: &Path) -> Result<UmountReply, ControlError> {
        let req = Request::Umount {
            mountpoint: mountpoint.to_string_lossy().into_owned(),
        };
        call!(self, req, Umount)
    }

    /// Changes `tenant`'s I/O limits and weight on its mounts here.
    pub fn set_limits(
        &self,
        tenant: &str,
        limits: LimitsChange,
    ) -> Result<LimitsReply, ControlError> {
        call!(
            self,
            Request::SetLimits {
                tenant: tenant.to_owned(),
                iops: limits.iops,
                bandwidth: limits.bandwidth,
                weight: limits.weight,
            },
            Limits
        )
    }

    /// Changes the quota of `tenant`, served here (for each part: None keeps it, 0 removes
    /// it).
    pub fn set_quota(
        &self,
        tenant: &str,
        bytes: Option<u64>,
        inodes: Option<u64>,
    ) -> Result<QuotaReply, ControlError> {
        call!(
            self,
            Request::SetQuota {
                tenant: tenant.to_owned(),
                bytes,
                inodes,
            },
            Quota
        )
    }

    /// Takes snapshot `name` of `tenant`, served here.
    pub fn snapshot_create(&self, tenant: &str, name: &str) -> Result<SnapshotReply, ControlError> {
        let req = Request::SnapshotCreate {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
        };
        call!(self, req, Snapshot)
    }

    /// Forks `source`, served here, into `new` (from its snapshot `snapshot` if given).
    pub fn tenant_fork(
        &self,
        source: &str,
        new: &str,
        snapshot: Option<&str>,
    ) -> Result<ForkReply, ControlError> {
        let req = Request::TenantFork {
            source: source.to_owned(),
            new: new.to_owned(),
            snapshot: snapshot.map(str::to_owned),
        };
        call!(self, req, Fork)
    }

    /// Moves `tenant`, served here, to a new key; with `rewrite`, writes its files under
    /// older keys again under the new one.
    pub fn rotate_key(&self, tenant: &str, rewrite: bool) -> Result<KeyReply, ControlError> {
        let req = Request::RotateKey {
            tenant: tenant.to_owned(),
            rewrite,
        };
        call!(self, req, Key)
    }

    /// Moves the data dir to the master key in `new_key` (absolute), the server with it.
    pub fn rotate_master(&self, new_key: &Path) -> Result<MasterKeyReply, ControlError> {
        let req = Request::RotateMaster {
            new_key: new_key.to_string_lossy().into_owned(),
        };
        call!(self, req, MasterKey)
    }

    pub fn stats(&self) -> Result<StatsReply, ControlError> {
        call!(self, Request::Stats, Stats)
    }

    pub fn tenant_list(&self) -> Result<TenantListReply, ControlError> {
        call!(self, Request::TenantList, TenantList)
    }

    /// Attaches `volume` as `via` says.
    pub fn volume_attach(
        &self,
        volume: &str,
        via: &AttachVia,
    ) -> Result<VolumeAttachReply, ControlError> {
        call!(self, Request::volume_attach(volume, via), VolumeAttach)
    }

    pub fn volume_detach(&self, volume: &str) -> Result<VolumeDetachReply, ControlError> {
        let req = Request::VolumeDetach {
            volume: volume.to_owned(),
        };
        call!(self, req, VolumeDetach)
    }

    fn unexpected(&self, req: &Request, reply: &Reply) -> ControlError {
        self.protocol(format!("{reply:?} is no answer to {req:?}"))
    }

    fn protocol(&self, detail: String) -> ControlError {
        ControlError::Protocol {
            path: self.path.clone(),
            detail,
        }
    }

    /// Sends `req` and reads its reply (or refusal).
    pub fn call(&self, req: &Request) -> Result<Reply, ControlError> {
        let path = &self.path;
        let mut stream =
            UnixStream::connect(path).map_err(|source| ControlError::connect(path, source))?;
        // A long request (a rewrite takes as long as the tenant's data) keeps the server
        // sending spaces: the limit is on its silence.
        stream
            .set_read_timeout(Some(self.patience))
            .map_err(|e| self.protocol(e.to_string()))?;
        let mut line = serde_json::to_string(req).map_err(|e| self.protocol(e.to_string()))?;
        line.push('\n');
        stream
            .write_all(line.as_bytes())
            .map_err(|e| self.protocol(e.to_string()))?;
        let mut answer = String::new();
        BufReader::new(&stream)
            .read_line(&mut answer)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    ControlError::Silent {
                        path: path.to_owned(),
                        secs: self.patience.as_secs(),
                    }
                }
                _ => self.protocol(e.to_string()),
            })?;
        let resp: Response = serde_json::from_str(&answer)
            .map_err(|e| self.protocol(format!("bad response: {e}")))?;
        match resp.into_result() {
            Some(Ok(reply)) => Ok(reply),
            Some(Err(refusal)) => Err(ControlError::Refused {
                path: path.to_owned(),
                refusal,
            }),
            None => Err(self.protocol("a response with neither a reply nor a refusal".into())),
        }
    }
}

/// The process serving the control socket at `path`, if one runs there: `Ok(None)` when
/// nothing does (no socket file, or one a dead process left); an error when one may run but
/// cannot be reached (permission denied, or another errno), which says so.
pub fn probe(path: &Path) -> Result<Option<Client>, ControlError> {
    match UnixStream::connect(path) {
        Ok(_) => Ok(Some(Client::new(path))),
        Err(source) => match ControlError::connect(path, source) {
            ControlError::NotRunning { .. } => Ok(None),
            e => Err(e),
        },
    }
}

/// The control sockets under `<data-dir>/run/` that a live process answers on, sorted; sockets
/// left by dead processes are skipped. Errors when there is none, or when one cannot be
/// reached for another reason than that its process is gone (permission denied).
pub fn serving_sockets(data_root: &Path) -> Result<Vec<PathBuf>, ControlError> {
    let dir = super::run_dir(data_root);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(source) if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            return Err(ControlError::RunDirDenied { dir, source })
        }
        Err(_) => return Err(ControlError::NoServer(data_root.to_owned())),
    };
    let mut found = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        if p.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        if probe(&p)?.is_some() {
            found.push(p);
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(ControlError::NoServer(data_root.to_owned()));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eacces() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EACCES)
    }

    /// A directory that cannot be listed is not called a control socket; a socket that cannot
    /// be reached is described in the words the server refuses with.
    #[test]
    fn denied_messages_say_what_was_denied() {
        let dir = ControlError::RunDirDenied {
            dir: "/d/run".into(),
            source: eacces(),
        }
        .to_string();
        assert!(
            dir.starts_with("permission denied listing /d/run (")
                && dir.contains("directory where the processes serving mounts put their")
                && dir.contains("run this as root"),
            "{dir}"
        );
        assert!(!dir.contains("control socket takes"), "{dir}");
        let sock = ControlError::connect(Path::new("/d/tenantfs.sock"), eacces()).to_string();
        assert!(
            sock.starts_with("permission denied on /d/tenantfs.sock (")
                && sock.contains(super::super::WHO_MAY_CONNECT),
            "{sock}"
        );
    }
}

/// A change to a tenant's limits, as `set_limits` sends it: for each, None keeps it, 0
/// removes it (the weight: back to the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitsChange {
    pub iops: Option<u64>,
    pub bandwidth: Option<u64>,
    pub weight: Option<u64>,
}
