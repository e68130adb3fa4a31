//! The TOML config file: plain data, parsed and checked; the serving host ([`crate::host`])
//! builds the runtime objects it describes.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default), and every error
//! carries the file and line.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::space::Reserve;
use crate::store::DirectIo;
use crate::units::ByteSize;

/// Where the config is read from when `--config` is not given (absent is fine).
pub const DEFAULT_PATH: &str = "/etc/tenantfs/tenantfs.toml";

/// The whole config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub pressure: PressureConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[[mount]]`: tenants the daemon mounts when it starts.
    #[serde(default, rename = "mount")]
    pub mounts: Vec<MountConfig>,
    /// `[[volume]]`: block volumes the daemon attaches when it starts.
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeConfig>,
}

/// One `[[volume]]` entry: `nbd = "ADDR"`, `ublk = true` or `nbd_device = true`, one of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    /// An NBD export's address (`unix:/absolute/path` or a loopback `HOST:PORT`).
    pub nbd: Option<String>,
    /// As /dev/ublkbN.
    #[serde(default)]
    pub ublk: bool,
    /// As /dev/nbdN (the kernel's NBD client on the daemon's own server).
    #[serde(default)]
    pub nbd_device: bool,
}

impl VolumeConfig {
    /// How it is served (the config was validated: exactly one way).
    pub fn via(&self) -> crate::control::AttachVia {
        crate::control::AttachVia::of(self.nbd.clone(), self.ublk, self.nbd_device)
            .unwrap_or(crate::control::AttachVia::Ublk)
    }
}

/// `[metrics]`: the daemon's metrics endpoint (OpenMetrics text, which Prometheus scrapes).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Loopback address to serve metrics on (e.g. "127.0.0.1:9477"); none by default.
    pub listen: Option<std::net::SocketAddr>,
}

/// One `[[mount]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    pub tenant: String,
    pub mountpoint: PathBuf,
    /// As for `tenantfs mount -o` (e.g. "cache=kernel,ro").
    #[serde(default)]
    pub options: String,
}

/// `[store]`: the tenant stores' shared RocksDB resources.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Memtable memory across all tenant stores (charged to the cache budget).
    pub write_buffers: ByteSize,
    /// "auto" (O_DIRECT where supported) or "off".
    pub direct_io: DirectIo,
    /// Disk space of the data dir's filesystem kept back from tenants' growth, for deletes and
    /// the stores' upkeep: a size ("2G"; 0: none) or a percentage ("5%", the default).
    pub reserve: Reserve,
    /// A mount that answers no request for this many seconds closes its tenant's store until
    /// the next request (default 60; 0: stores stay open while mounted).
    pub close_idle_after_secs: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            write_buffers: ByteSize(64 << 20),
            direct_io: DirectIo::Auto,
            reserve: Reserve::default(),
            close_idle_after_secs: 60,
        }
    }
}

impl StoreConfig {
    /// How long a mount stays idle before its store closes; `None`: never.
    pub fn close_idle_after(&self) -> Option<std::time::Duration> {
        (self.close_idle_after_secs > 0)
            .then(|| std::time::Duration::from_secs(self.close_idle_after_secs))
    }
}

/// `[cache]`: the host cache (RocksDB block cache and content-addressed block cache).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// The most memory both caches may hold together; the governor may hold them lower.
    pub budget: ByteSize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            budget: ByteSize(512 << 20),
        }
    }
}

/// `[pressure]`: the governor that shrinks the cache under memory pressure.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PressureConfig {
    /// Run the governor (default true).
    pub governor: bool,
    /// How often it samples when no trigger fires, in milliseconds (default 1000).
    pub interval_ms: u64,
}

impl Default for PressureConfig {
    fn default() -> Self {
        Self {
            governor: true,
            interval_ms: 1000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}, line {line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("config file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Config {
    /// Loads `path`; with no explicit path a missing default file means the defaults.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_owned(), true),
            None => (PathBuf::from(DEFAULT_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::default())
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        Self::parse(&text, &path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(0);
            ConfigError::Parse {
                path: path.to_owned(),
                line,
                message: e.message().to_owned(),
            }
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        if config.cache.budget.0 < 16 << 20 {
            return Err(invalid(format!(
                "cache.budget = {} is too small; use at least 16M",
                config.cache.budget
            )));
        }
        if let Some(a) = config.metrics.listen.filter(|a| !a.ip().is_loopback()) {
            return Err(invalid(format!(
                "metrics.listen = {a} is not a loopback address; use 127.0.0.1:PORT or [::1]:PORT \
                 (the metrics name tenants)"
            )));
        }
        if config.store.close_idle_after_secs > 7 * 24 * 3600 {
            return Err(invalid(format!(
                "store.close_idle_after_secs = {} is out of range; use 0 (never) to 604800 (a week)",
                config.store.close_idle_after_secs
            )));
        }
        if !(10..=60_000).contains(&config.pressure.interval_ms) {
            return Err(invalid(format!(
                "pressure.interval_ms = {} is out of range; use 10 to 60000",
                config.pressure.interval_ms
            )));
        }
        for (i, v) in config.volumes.iter().enumerate() {
            if config.volumes[..i].iter().any(|w| w.name == v.name) {
                return Err(invalid(format!(
                    "volume {} is listed twice; keep one [[volume]] entry for it",
                    v.name
                )));
            }
            match (&v.nbd, v.ublk, v.nbd_device) {
                (Some(nbd), false, false) => {
                    let problem = match crate::nbd::NbdAddress::parse(nbd) {
                        Err(e) => Some(e.to_string()),
                        Ok(crate::nbd::NbdAddress::Unix(p)) if p.is_relative() => {
                            Some("a unix socket path in the config must be absolute".to_owned())
                        }
                        Ok(_) => None,
                    };
                    if let Some(e) = problem {
                        return Err(invalid(format!("volume {}: nbd = {nbd:?}: {e}", v.name)));
                    }
                }
                (None, true, false) | (None, false, true) => {}
                _ => {
                    return Err(invalid(format!(
                        "volume {}: say how to serve it: nbd = \"unix:/PATH\", ublk = true or \
                         nbd_device = true, one of them",
                        v.name
                    )))
                }
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parse_and_errors() {
        let p = Path::new("t.toml");
        let c = Config::parse(
            "[store]\ndirect_io = \"off\"\n[cache]\nbudget = \"1G\"\n[pressure]\ninterval_ms = 200\n",
            p,
        )
        .unwrap();
        assert_eq!(c.cache.budget.0, 1 << 30);
        assert_eq!(c.store.direct_io, DirectIo::Off);
        assert_eq!(c.pressure.interval_ms, 200);
        let e = Config::parse("[cache]\n\nbudgt = \"1G\"\n", p).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { line: 3, .. }), "{e}");
        let e = Config::parse("[cache]\nbudget = \"lots\"\n", p).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(Config::parse("[cache]\nbudget = 10\n", p).is_err());
        assert_eq!(c.store.reserve, Reserve::Percent(5));
        let reserve = |text: &str| Config::parse(&format!("[store]\nreserve = {text}\n"), p);
        assert_eq!(
            reserve("\"2G\"").unwrap().store.reserve,
            Reserve::Bytes(2 << 30)
        );
        assert_eq!(reserve("0").unwrap().store.reserve, Reserve::Bytes(0));
        let e = reserve("\"60%\"").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("invalid reserve"), "{e}");
        assert!(Config::parse("[pressure]\ninterval_ms = 0\n", p).is_err());
        assert!(Config::parse("[metrics]\nlisten = \"0.0.0.0:9477\"\n", p).is_err());
        assert_eq!(
            Config::parse("[metrics]\nlisten = \"127.0.0.1:9477\"\n", p)
                .unwrap()
                .metrics
                .listen,
            Some("127.0.0.1:9477".parse().unwrap())
        );
        let c = Config::parse(
            "[[mount]]\ntenant = \"a\"\nmountpoint = \"/m/a\"\n[[mount]]\ntenant = \"b\"\nmountpoint = \"/m/b\"\noptions = \"ro\"\n",
            p,
        )
        .unwrap();
        assert_eq!(c.mounts.len(), 2);
        assert_eq!(c.mounts[1].options, "ro");
        assert!(
            Config::parse("[[mount]]\ntenant = \"a\"\n", p).is_err(),
            "mountpoint missing"
        );
        let c = Config::parse(
            "[[volume]]\nname = \"v\"\nublk = true\n[[volume]]\nname = \"w\"\nnbd = \"unix:/run/w.sock\"\n\
             [[volume]]\nname = \"x\"\nnbd_device = true\n",
            p,
        )
        .unwrap();
        use crate::control::AttachVia;
        let via: Vec<AttachVia> = c.volumes.iter().map(VolumeConfig::via).collect();
        assert_eq!(
            via,
            [
                AttachVia::Ublk,
                AttachVia::Nbd("unix:/run/w.sock".into()),
                AttachVia::NbdDevice
            ]
        );
        for bad in [
            "name = \"v\"\n",
            "name = \"v\"\nublk = true\nnbd = \"unix:/x\"\n",
            "name = \"v\"\nublk = true\nnbd_device = true\n",
            "name = \"v\"\nnbd = \"unix:rel.sock\"\n",
            "name = \"v\"\nnbd = \"0.0.0.0:10809\"\n",
            "name = \"v\"\nublk = true\n[[volume]]\nname = \"v\"\nublk = true\n",
        ] {
            let e = Config::parse(&format!("[[volume]]\n{bad}"), p).unwrap_err();
            assert!(e.to_string().contains("volume v"), "{bad}: {e}");
        }
        assert!(
            !Config::parse("[pressure]\ngovernor = false\n", p)
                .unwrap()
                .pressure
                .governor
        );
    }
}
