//! The memory cgroup the fio tenant and the daemon share, v1 or v2: created, limited,
//! sampled, removed.

use super::*;

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum CgVersion {
    V1,
    V2,
}

pub(super) struct Cgroup {
    pub(super) version: CgVersion,
    pub(super) dir: PathBuf,
}

impl Cgroup {
    pub(super) fn create(limit: u64) -> Cgroup {
        let name = format!("tenantfs-interference-{}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2_controllers = v2_root.join("cgroup.controllers");
        let v2 = fs::read_to_string(&v2_controllers)
            .map(|s| s.split_whitespace().any(|c| c == "memory"))
            .unwrap_or(false);
        let (version, dir) = if v2 {
            // The memory controller must be enabled for the root's children, and the io
            // controller (where the kernel has it) for the cgroup's io.stat and io.max.
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+io");
            (CgVersion::V2, v2_root.join(&name))
        } else {
            let v1 = Path::new("/sys/fs/cgroup/memory");
            assert!(
                v1.join("memory.limit_in_bytes").exists(),
                "no memory cgroup: neither v2 (/sys/fs/cgroup/cgroup.controllers with memory) \
                 nor v1 (/sys/fs/cgroup/memory)"
            );
            (CgVersion::V1, v1.join(&name))
        };
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cg = Cgroup { version, dir };
        match version {
            CgVersion::V1 => cg.write("memory.limit_in_bytes", &limit.to_string()),
            CgVersion::V2 => {
                cg.write("memory.max", &limit.to_string());
                let _ = fs::write(cg.dir.join("memory.swap.max"), "0");
            }
        }
        cg
    }

    /// Limits the cgroup's I/O on the disk that holds `path` (cgroup v2's `io.max`, for
    /// example `riops=2000 wbps=50000000`), and says what it wrote.
    pub(super) fn limit_io(&self, path: &Path, limit: &str) -> String {
        assert!(
            self.version == CgVersion::V2,
            "IO_MAX needs cgroup v2 (io.max); this host mounts v1"
        );
        assert!(
            self.dir.join("io.max").exists(),
            "the kernel has no io.max (the io controller is not available)"
        );
        let dev = nix::sys::stat::stat(path)
            .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
            .st_dev;
        let line = format!(
            "{}:{} {limit}",
            nix::sys::stat::major(dev),
            nix::sys::stat::minor(dev)
        );
        self.write("io.max", &line);
        line
    }

    /// Read requests the cgroup has sent to disks (cgroup v2's `io.stat`; 0 on v1).
    pub(super) fn disk_reads(&self) -> u64 {
        self.read("io.stat")
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("rios=")?.parse::<u64>().ok())
            .sum()
    }

    pub(super) fn write(&self, file: &str, value: &str) {
        let p = self.dir.join(file);
        fs::write(&p, value).unwrap_or_else(|e| panic!("write {value} to {}: {e}", p.display()));
    }

    pub(super) fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    pub(super) fn read_u64(&self, file: &str) -> u64 {
        self.read(file).trim().parse().unwrap_or(0)
    }

    pub(super) fn stat(&self, key: &str) -> u64 {
        self.read("memory.stat")
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
            })
            .unwrap_or(0)
    }

    pub(super) fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Resets the peak counters, where the kernel allows it.
    pub(super) fn reset_peak(&self) {
        match self.version {
            CgVersion::V1 => {
                let _ = fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
            }
            CgVersion::V2 => {
                let _ = fs::write(self.dir.join("memory.peak"), "0");
            }
        }
    }

    pub(super) fn sample(&self) -> MemSample {
        match self.version {
            CgVersion::V1 => MemSample {
                usage: self.read_u64("memory.usage_in_bytes"),
                peak: self.read_u64("memory.max_usage_in_bytes"),
                cache: self.stat("total_cache"),
                rss: self.stat("total_rss"),
                limit_hits: self.read_u64("memory.failcnt"),
            },
            CgVersion::V2 => MemSample {
                usage: self.read_u64("memory.current"),
                peak: self.read_u64("memory.peak"),
                cache: self.stat("file"),
                rss: self.stat("anon"),
                limit_hits: self
                    .read("memory.events")
                    .lines()
                    .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
                    .unwrap_or(0),
            },
        }
    }

    pub(super) fn remove(&self) {
        for _ in 0..50 {
            let pids: Vec<i32> = self
                .read("cgroup.procs")
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            // Only processes this harness started are in the cgroup it created.
            for pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            sleep(Duration::from_millis(100));
        }
        eprintln!("warning: could not remove cgroup {}", self.dir.display());
    }
}

#[derive(Clone, Copy, Default)]
pub(super) struct MemSample {
    pub(super) usage: u64,
    pub(super) peak: u64,
    /// v1 total_cache, v2 file.
    pub(super) cache: u64,
    /// v1 total_rss, v2 anon.
    pub(super) rss: u64,
    /// v1 memory.failcnt, v2 memory.events "max" (cumulative; the runs report the delta
    /// from the warm working set to the end of the fio tenant).
    pub(super) limit_hits: u64,
}
