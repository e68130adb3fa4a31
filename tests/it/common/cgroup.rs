//! A v1 memory cgroup for one test (this machine's controller; v2 is covered by fixtures).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A v1 memory cgroup for one test: processes in it are killed and it is removed on drop.
pub struct Cgroup(pub PathBuf);

impl Cgroup {
    pub fn new(name: &str, limit: u64) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.limit_in_bytes").exists() {
            eprintln!("no cgroup v1 memory controller here; skipped");
            return None;
        }
        let dir = root.join(format!("tenantfs-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        Some(Self(dir))
    }

    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(name)).unwrap()
    }

    pub fn oom_kills(&self) -> u64 {
        self.file("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    /// `sh -c` that moves itself into the cgroup, then execs `prog args...`.
    pub fn command(&self, prog: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
            .arg(&self.0)
            .arg(prog);
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("cleanup: cannot remove cgroup {}", self.0.display());
    }
}
