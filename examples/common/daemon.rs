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
        Self::start_with(dir, "[cache]\nbudget = \"2G\"\n", &[tenant])
    }

    /// Initialises a data dir under `dir` with `config`, creates `tenants` and starts the
    /// daemon.
    pub fn start_with(dir: &Path, config: &str, tenants: &[&str]) -> Daemon {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("tenantfs.toml"), config).unwrap();
        let mut d = Daemon {
            child: None,
            dir: dir.to_owned(),
        };
        run(&mut d.cli(&["init"]));
        for tenant in tenants {
            run(&mut d.cli(&["tenant", "create", tenant]));
        }
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

    /// Mounts `tenant` at `mnt` through this daemon with `options` (`-o`; none if empty).
    pub fn mount_with(&self, tenant: &str, mnt: &Path, options: &str) {
        let mnt = mnt.to_str().unwrap();
        if options.is_empty() {
            run(&mut self.cli(&["mount", tenant, mnt]));
        } else {
            run(&mut self.cli(&["mount", "-o", options, tenant, mnt]));
        }
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
        Self::new_with(name, tenant, "[cache]\nbudget = \"2G\"\n")
    }

    /// [`Self::new`] with the daemon's `config`.
    pub fn new_with(name: &str, tenant: &str, config: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("tenantfs-bench-{name}-"))
            .tempdir_in("/var/tmp")
            .unwrap();
        let (host, mnt) = (tmp.path().join("host"), tmp.path().join("mnt"));
        fs::create_dir_all(&host).unwrap();
        fs::create_dir_all(&mnt).unwrap();
        let daemon = Daemon::start_with(&tmp.path().join("daemon"), config, &[tenant]);
        Self {
            daemon,
            host,
            mnt,
            tmp,
        }
    }
}

/// Two tenants, `a` and `b`, of one daemon with `config`, each mounted with its options,
/// under one temporary directory in /var/tmp; unmounted and the daemon stopped when dropped.
pub struct TwoTenants {
    pub daemon: Daemon,
    mounts: [PathBuf; 2],
    _tmp: tempfile::TempDir,
}

impl TwoTenants {
    /// `name` names the temporary directory (`tenantfs-bench-NAME-*`).
    pub fn new(name: &str, config: &str, options: [&str; 2]) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("tenantfs-bench-{name}-"))
            .tempdir_in("/var/tmp")
            .unwrap();
        let daemon = Daemon::start_with(&tmp.path().join("daemon"), config, &["a", "b"]);
        let mounts = ["a", "b"].map(|t| tmp.path().join(format!("m{t}")));
        for ((tenant, mnt), opts) in ["a", "b"].iter().zip(&mounts).zip(options) {
            fs::create_dir_all(mnt).unwrap();
            daemon.mount_with(tenant, mnt, opts);
        }
        Self {
            daemon,
            mounts,
            _tmp: tmp,
        }
    }

    /// Tenant `a`'s (0) or `b`'s (1) mount.
    pub fn mount(&self, i: usize) -> &Path {
        &self.mounts[i]
    }
}

impl Drop for TwoTenants {
    fn drop(&mut self) {
        for mnt in &self.mounts {
            let _ = self.daemon.cli(&["umount", mnt.to_str().unwrap()]).output();
        }
    }
}

/// Writes `mib` MiB of noise to `path`, and reads it once (into the cache, if it fits).
pub fn lay_out(path: &Path, mib: usize) {
    use std::io::{Read, Write};
    let mut rng = super::Rng::new(mib as u64);
    let piece: Vec<u8> = (0..1 << 20).map(|_| rng.below(256) as u8).collect();
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..mib {
        let mut p = piece.clone();
        p[..8].copy_from_slice(&(i as u64).to_le_bytes());
        f.write_all(&p).unwrap();
    }
    f.sync_all().unwrap();
    let mut back = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back.len(), mib << 20);
}

/// Runs `a` and `b` at once: their (IOPS, p99 us).
pub fn side_by_side(mut a: Command, mut b: Command) -> [(f64, f64); 2] {
    let ta = std::thread::spawn(move || super::fio_side(&mut a, "a"));
    let vb = super::fio_side(&mut b, "b");
    let va = ta.join().unwrap();
    [va, vb].map(|v| {
        (
            v["iops"].as_f64().unwrap(),
            v["clat_ns"]["percentile"]["99.000000"]
                .as_f64()
                .unwrap_or(0.0)
                / 1e3,
        )
    })
}

/// A time-based fio job on `file` (`size`) for `secs` with O_DIRECT and JSON output, doing
/// `pattern` (its `--rw`, `--bs`, `--ioengine`, ...).
pub fn fio_for(file: &Path, size: &str, secs: u32, pattern: &[&str]) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=bench",
        &format!("--filename={}", file.display()),
        &format!("--size={size}"),
        "--direct=1",
        "--time_based",
        &format!("--runtime={secs}"),
        "--output-format=json",
    ])
    .args(pattern);
    c
}
