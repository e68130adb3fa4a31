//! Where an export listens (a unix socket path, or a loopback TCP address) and the sockets
//! that come of it, either kind behind one type.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use super::NbdError;

/// An NBD listening address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdAddress {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl NbdAddress {
    /// Parses `unix:PATH`, `HOST:PORT` or `tcp:HOST:PORT` (HOST a loopback address or
    /// `localhost`). A relative unix path stays relative: callers that hand it to another
    /// process make it absolute first ([`NbdAddress::absolute`]).
    pub fn parse(s: &str) -> Result<Self, NbdError> {
        let bad = || NbdError::BadAddress(s.to_owned());
        if let Some(path) = s.strip_prefix("unix:") {
            return if path.is_empty() {
                Err(bad())
            } else {
                Ok(NbdAddress::Unix(PathBuf::from(path)))
            };
        }
        let hostport = s.strip_prefix("tcp:").unwrap_or(s);
        let addr: SocketAddr = match hostport.strip_prefix("localhost:") {
            Some(port) => SocketAddr::from(([127, 0, 0, 1], port.parse().map_err(|_| bad())?)),
            None => hostport.parse().map_err(|_| bad())?,
        };
        if !addr.ip().is_loopback() {
            return Err(NbdError::NotLoopback(addr.to_string()));
        }
        Ok(NbdAddress::Tcp(addr))
    }

    /// The address with a unix path made absolute against the current directory.
    pub fn absolute(self) -> io::Result<Self> {
        match self {
            NbdAddress::Unix(p) if p.is_relative() => {
                Ok(NbdAddress::Unix(std::env::current_dir()?.join(p)))
            }
            a => Ok(a),
        }
    }

    /// The address as an NBD URI, which libnbd's tools (`nbdinfo`, `nbdcopy`) take.
    pub fn uri(&self) -> String {
        match self {
            NbdAddress::Unix(p) => format!("nbd+unix:///?socket={}", p.display()),
            NbdAddress::Tcp(a) => format!("nbd://{a}/"),
        }
    }
}

impl fmt::Display for NbdAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NbdAddress::Unix(p) => write!(f, "unix:{}", p.display()),
            NbdAddress::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A listening socket of either kind.
pub(super) enum Listener {
    /// With the socket file's identity, so that only this listener's file is removed.
    Unix(UnixListener, PathBuf, (u64, u64)),
    Tcp(TcpListener),
}

impl Listener {
    pub(super) fn bind(address: &NbdAddress) -> Result<Self, NbdError> {
        let failed = |source| NbdError::Listen {
            address: address.to_string(),
            source,
        };
        match address {
            NbdAddress::Tcp(a) => match TcpListener::bind(a) {
                Ok(l) => Ok(Listener::Tcp(l)),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    Err(NbdError::InUse(address.to_string()))
                }
                Err(e) => Err(failed(e)),
            },
            NbdAddress::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(NbdError::NotASocket(path.display().to_string()));
                    }
                    // A socket file nobody listens on is what a killed server leaves.
                    if UnixStream::connect(path).is_ok() {
                        return Err(NbdError::InUse(address.to_string()));
                    }
                    std::fs::remove_file(path).map_err(failed)?;
                }
                let l = UnixListener::bind(path).map_err(failed)?;
                // Root's (or the daemon user's) only: NBD carries no authentication.
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .map_err(failed)?;
                let meta = std::fs::metadata(path).map_err(failed)?;
                Ok(Listener::Unix(l, path.clone(), (meta.dev(), meta.ino())))
            }
        }
    }

    /// The address it listens on (a TCP port 0 resolved).
    pub(super) fn local_address(&self, asked: &NbdAddress) -> NbdAddress {
        match self {
            Listener::Tcp(l) => l.local_addr().map_or(asked.clone(), NbdAddress::Tcp),
            Listener::Unix(..) => asked.clone(),
        }
    }

    pub(super) fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Listener::Unix(l, p, id) => Listener::Unix(l.try_clone()?, p.clone(), *id),
            Listener::Tcp(l) => Listener::Tcp(l.try_clone()?),
        })
    }

    pub(super) fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Unix(l, ..) => Stream::Unix(l.accept()?.0),
            Listener::Tcp(l) => {
                let s = l.accept()?.0;
                // Replies are a header and then data: sent at once, not held for an ACK.
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        })
    }

    /// Removes the socket file if it is still this listener's.
    pub(super) fn remove_socket_file(&self) {
        if let Listener::Unix(_, path, id) = self {
            if std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == *id) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Listener::Unix(l, ..) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }
}

/// A connected client of either kind.
pub(super) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(super) fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// A second descriptor of the socket (to shut it down from another thread).
    pub(super) fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        match self {
            Stream::Unix(s) => s.as_fd().try_clone_to_owned(),
            Stream::Tcp(s) => s.as_fd().try_clone_to_owned(),
        }
    }

    /// Who is connected, for logs.
    pub(super) fn peer(&self) -> String {
        match self {
            Stream::Unix(_) => "unix socket client".into(),
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp client".into(), |a| a.to_string()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_only_loopback_tcp_is_taken() {
        assert_eq!(
            NbdAddress::parse("unix:/run/v.sock").unwrap(),
            NbdAddress::Unix("/run/v.sock".into())
        );
        let lo = NbdAddress::Tcp("127.0.0.1:10809".parse().unwrap());
        assert_eq!(NbdAddress::parse("127.0.0.1:10809").unwrap(), lo);
        assert_eq!(NbdAddress::parse("tcp:127.0.0.1:10809").unwrap(), lo);
        assert_eq!(NbdAddress::parse("localhost:10809").unwrap(), lo);
        assert!(matches!(
            NbdAddress::parse("[::1]:9").unwrap(),
            NbdAddress::Tcp(_)
        ));
        assert!(matches!(
            NbdAddress::parse("0.0.0.0:10809"),
            Err(NbdError::NotLoopback(_))
        ));
        for bad in ["unix:", "10809", "127.0.0.1", "host:1", "nbd://x"] {
            assert!(
                matches!(NbdAddress::parse(bad), Err(NbdError::BadAddress(_))),
                "{bad}"
            );
        }
        assert_eq!(lo.uri(), "nbd://127.0.0.1:10809/");
        assert_eq!(
            NbdAddress::parse("unix:/s").unwrap().uri(),
            "nbd+unix:///?socket=/s"
        );
        assert_eq!(NbdAddress::parse("unix:/s").unwrap().to_string(), "unix:/s");
    }
}
