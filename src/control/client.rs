//! The asking side: send one request, read one response.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::{AttachVia, Refusal, Reply, Request, Response};
use super::replies::{
    CacheReleaseReply, CacheReport, MountReply, StatsReply, TenantListReply, UmountReply,
    VolumeAttachReply, VolumeDetachReply,
};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no tenantfs process is serving mounts under {0} (mount a tenant first: the caches live in the process that serves it)")]
    NoServer(PathBuf),
    #[error("cannot reach the control socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {path}: {detail}")]
    Protocol { path: PathBuf, detail: String },
    #[error("{path}: {refusal}")]
    Refused { path: PathBuf, refusal: Refusal },
}

impl ControlError {
    /// The server's refusal, if that is what this is.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            ControlError::Refused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// One serving process's control socket, with one typed call per request.
#[derive(Clone, Debug)]
pub struct Client {
    path: PathBuf,
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
        Self { path: path.into() }
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
        let mut stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
            path: path.to_owned(),
            source,
        })?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| self.protocol(e.to_string()))?;
        let mut line = serde_json::to_string(req).map_err(|e| self.protocol(e.to_string()))?;
        line.push('\n');
        stream
            .write_all(line.as_bytes())
            .map_err(|e| self.protocol(e.to_string()))?;
        let mut answer = String::new();
        BufReader::new(&stream)
            .read_line(&mut answer)
            .map_err(|e| self.protocol(e.to_string()))?;
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

/// The control sockets under `<data-dir>/run/` that a live process answers on, sorted; sockets
/// left by dead processes are skipped. Errors when there is none.
pub fn serving_sockets(data_root: &Path) -> Result<Vec<PathBuf>, ControlError> {
    let dir = super::run_dir(data_root);
    let denied = |path: &Path, source: std::io::Error| ControlError::Connect {
        path: path.to_owned(),
        source: std::io::Error::new(
            source.kind(),
            format!("{source} (the control socket is for root: run this as root)"),
        ),
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(denied(&dir, e)),
        Err(_) => return Err(ControlError::NoServer(data_root.to_owned())),
    };
    let mut found = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        if p.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        match UnixStream::connect(&p) {
            Ok(_) => found.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(denied(&p, e))
            }
            // A socket left by a process that is gone.
            Err(_) => {}
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(ControlError::NoServer(data_root.to_owned()));
    }
    Ok(found)
}
