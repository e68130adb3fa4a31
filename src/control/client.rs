//! The asking side: send one request, read one response.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::{Request, Response};

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
    #[error("{path}: {message}")]
    Refused { path: PathBuf, message: String },
}

/// Sends `req` to the server on `path` and returns its result.
pub fn request(path: &Path, req: &Request) -> Result<serde_json::Value, ControlError> {
    let proto = |detail: String| ControlError::Protocol {
        path: path.to_owned(),
        detail,
    };
    let mut stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_owned(),
        source,
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| proto(e.to_string()))?;
    let mut line = serde_json::to_string(req).map_err(|e| proto(e.to_string()))?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| proto(e.to_string()))?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| proto(e.to_string()))?;
    let resp: Response =
        serde_json::from_str(&answer).map_err(|e| proto(format!("bad response: {e}")))?;
    if resp.ok {
        Ok(resp.result.unwrap_or(serde_json::Value::Null))
    } else {
        Err(ControlError::Refused {
            path: path.to_owned(),
            message: resp.error.unwrap_or_else(|| "request failed".into()),
        })
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
