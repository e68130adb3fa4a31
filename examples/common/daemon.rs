//! A tenantfs daemon for the mount benchmarks: its own data dir, the fio suite's settings
//! (`[cache] budget = "2G"`), one tenant, killed when dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tenantfs_bin;

/// Turns FUSE over io_uring on if the kernel has it off (the benchmarks compare it with
/// /dev/fuse). Needs root and Linux >= 6.14.
pub fn enable_fuse_uring() {
    if !tenantfs::fuse::uring_enabled() {
        let p = tenantfs::fuse::URING_PARAMETER;
        eprintln!("enabling FUSE over io_uring: echo Y > {p}");
        fs::write(p, "Y").unwrap_or_else(|e| panic!("{p}: {e} (needs root and Linux >= 6.14)"));
    }
}

/// Runs `cmd`; panics with its stderr when it fails.
pub fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
}

impl Daemon {
    /// Initialises a data dir under `dir`, creates `tenant` and starts the daemon.
    pub fn start(dir: &Path, tenant: &str) -> Daemon {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("tenantfs.toml"), "[cache]\nbudget = \"2G\"\n").unwrap();
        let mut d = Daemon {
            child: None,
            dir: dir.to_owned(),
        };
        run(&mut d.cli(&["init"]));
        run(&mut d.cli(&["tenant", "create", tenant]));
        d.child = Some(
            d.cli(&["daemon"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let t = Instant::now();
        while !dir.join("tenantfs.sock").exists() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// A `tenantfs` command against this daemon's data dir and socket.
    pub fn cli(&self, args: &[&str]) -> Command {
        let mut c = Command::new(tenantfs_bin());
        c.arg("--config")
            .arg(self.dir.join("tenantfs.toml"))
            .env("TENANTFS_DATA_DIR", self.dir.join("data"))
            .env("TENANTFS_SOCKET", self.dir.join("tenantfs.sock"))
            .args(args);
        c
    }

    /// Mounts `tenant` at `mnt` through this daemon, served over `transport` (uring, dev).
    pub fn mount(&self, tenant: &str, mnt: &Path, transport: &str) {
        let o = format!("transport={transport}");
        run(&mut self.cli(&["mount", "-o", &o, tenant, mnt.to_str().unwrap()]));
    }

    pub fn umount(&self, mnt: &Path) {
        run(&mut self.cli(&["umount", mnt.to_str().unwrap()]));
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("started").id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a side-by-side benchmark works in: under one temporary directory in /var/tmp (a disk
/// filesystem: host ext4 here), a directory of the host's own and a daemon with an empty
/// mount point. Dropped in this order: the daemon before the directory it lives in.
pub struct SideBySide {
    pub daemon: Daemon,
    /// The host filesystem's side.
    pub host: PathBuf,
    /// Where the benchmark mounts the tenant.
    pub mnt: PathBuf,
    pub tmp: tempfile::TempDir,
}

impl SideBySide {
    /// `name` names the temporary directory (`tenantfs-bench-NAME-*`); `tenant` is created.
    pub fn new(name: &str, tenant: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("tenantfs-bench-{name}-"))
            .tempdir_in("/var/tmp")
            .unwrap();
        let (host, mnt) = (tmp.path().join("host"), tmp.path().join("mnt"));
        fs::create_dir_all(&host).unwrap();
        fs::create_dir_all(&mnt).unwrap();
        let daemon = Daemon::start(&tmp.path().join("daemon"), tenant);
        Self {
            daemon,
            host,
            mnt,
            tmp,
        }
    }
}
