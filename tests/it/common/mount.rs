//! A host data dir for tests through the real `tenantfs` binary (initialised, with its own
//! master key, in its own temp dir), the CLI run against it, mounts and the daemon started
//! from it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::guards::{tenantfs_mounted, Daemon, Mount};
use super::process::*;

/// A host data dir (initialised, with its own master key) in a fresh temp dir under /var/tmp.
pub struct Host {
    pub tmp: tempfile::TempDir,
    pub data: PathBuf,
    pub config: PathBuf,
}

impl Host {
    pub fn new(prefix: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("tenantfs-fuse-{prefix}-"))
            .tempdir_in("/var/tmp")
            .unwrap();
        // Other users (test processes that drop privileges) must be able to reach mountpoints.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let h = Self {
            data: tmp.path().join("data"),
            tmp,
            config: PathBuf::from("/dev/null"),
        };
        h.ok(&["init"]);
        h
    }

    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// Commands from now on read this config (instead of none).
    pub fn with_config(mut self, text: &str) -> Self {
        self.config = self.root().join("tenantfs.toml");
        std::fs::write(&self.config, text).unwrap();
        self
    }

    /// A new empty directory `name` in the temp dir.
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.root().join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// `tenantfs --data-dir <data> --config <config or /dev/null>`, ready for arguments.
    pub fn cmd(&self) -> Command {
        self.cmd_under(&[])
    }

    /// As [`Self::cmd`], run by `wrapper` (a program and its arguments, e.g. `taskset -c 0`).
    pub fn cmd_under(&self, wrapper: &[&str]) -> Command {
        let mut c = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        c.env_remove("CREDENTIALS_DIRECTORY")
            .env_remove("TENANTFS_DATA_DIR")
            .env_remove("TENANTFS_LOG")
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        output(self.cmd().args(args))
    }

    pub fn ok(&self, args: &[&str]) -> String {
        check(self.cmd().args(args))
    }

    pub fn fails(&self, args: &[&str]) -> String {
        check_fails(self.cmd().args(args))
    }

    pub fn create_tenant(&self, name: &str) {
        self.ok(&["tenant", "create", name]);
    }

    /// The tenant's on-disk size as `tenant list --json` reports it.
    pub fn disk_bytes(&self, tenant: &str) -> u64 {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["tenant", "list", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tenant)
            .unwrap_or_else(|| panic!("no tenant {tenant} in {v}"))["disk_bytes"]
            .as_u64()
            .unwrap()
    }

    /// Mounts `tenant` at `mountpoint` with `tenantfs mount` (options: `-o` list, may be empty).
    pub fn mount(&self, tenant: &str, mountpoint: &Path, options: &str) -> Mount {
        self.mount_with(self.cmd(), tenant, mountpoint, options)
    }

    /// Mounts with `c` (e.g. a `self.cmd()` wrapped to start in a given cgroup).
    pub fn mount_with(
        &self,
        mut c: Command,
        tenant: &str,
        mountpoint: &Path,
        options: &str,
    ) -> Mount {
        c.args(["mount", tenant]).arg(mountpoint);
        if !options.is_empty() {
            c.args(["-o", options]);
        }
        let out = check(&mut c);
        let pid: u32 = out
            .rsplit_once("served by pid ")
            .and_then(|(_, rest)| rest.trim().trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("no serving pid in {out:?}"));
        assert!(
            tenantfs_mounted(mountpoint),
            "{} not in the mount table after {out:?}",
            mountpoint.display()
        );
        assert!(alive(pid), "serving process {pid} is not running");
        Mount {
            data: self.data.clone(),
            path: mountpoint.to_owned(),
            tenant: tenant.to_owned(),
            pid,
        }
    }
}

impl Host {
    /// A guard for a mount made some other way (pid 0: unknown).
    pub fn guard(&self, tenant: &str, mountpoint: &Path, pid: u32) -> Mount {
        Mount {
            data: self.data.clone(),
            path: mountpoint.to_owned(),
            tenant: tenant.to_owned(),
            pid,
        }
    }
}

/// Starts `tenantfs daemon` and waits for READY=1 on a datagram socket of our own.
pub fn start_daemon(h: &Host, notify: &Path) -> Daemon {
    start_daemon_env(h, notify, &[]).0
}

/// As `start_daemon`, with extra environment; also returns the notify socket (still bound).
pub fn start_daemon_env(
    h: &Host,
    notify: &Path,
    env: &[(&str, &str)],
) -> (Daemon, std::os::unix::net::UnixDatagram) {
    let log = std::fs::File::create(h.root().join("daemon.log")).unwrap();
    start_daemon_logging_to(h, notify, env, log.into())
}

/// As `start_daemon_env`, with the daemon's stderr (its log) going to `log`.
pub fn start_daemon_logging_to(
    h: &Host,
    notify: &Path,
    env: &[(&str, &str)],
    log: std::process::Stdio,
) -> (Daemon, std::os::unix::net::UnixDatagram) {
    spawn_daemon(h.cmd(), notify, env, log)
}

/// Starts `tenantfs daemon` under `wrapper` (see [`Host::cmd_under`]) and waits for READY=1.
pub fn start_daemon_under(h: &Host, notify: &Path, wrapper: &[&str]) -> Daemon {
    let log = std::fs::File::create(h.root().join("daemon.log")).unwrap();
    spawn_daemon(h.cmd_under(wrapper), notify, &[], log.into()).0
}

/// `tenantfs` command `c` run as `daemon`, up once it sent READY=1.
fn spawn_daemon(
    mut c: Command,
    notify: &Path,
    env: &[(&str, &str)],
    log: std::process::Stdio,
) -> (Daemon, std::os::unix::net::UnixDatagram) {
    let _ = std::fs::remove_file(notify);
    let listener = std::os::unix::net::UnixDatagram::bind(notify).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let child = c
        .arg("daemon")
        .env("NOTIFY_SOCKET", notify)
        .env("TENANTFS_LOG", "tenantfs=info")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let mut buf = [0u8; 64];
    let n = listener.recv(&mut buf).expect("no READY=1 from the daemon");
    assert_eq!(&buf[..n], b"READY=1");
    (d, listener)
}
