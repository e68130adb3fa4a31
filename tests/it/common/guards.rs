//! Guards that always undo what a test set up, even when it fails: a tenant mount (unmounted,
//! its server killed if need be), a loop device, a plain mount; and the mount-table checks
//! they rely on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::process::*;

/// The tenantfs mount at exactly `path`, if any (live or dead).
pub fn tenantfs_mounted(path: &Path) -> bool {
    tenantfs::fuse::find_mount(path)
        .ok()
        .flatten()
        .is_some_and(|m| m.tenant().is_some())
}

/// Any mount at exactly `path`.
pub fn mounted(path: &Path) -> bool {
    tenantfs::fuse::find_mount(path).ok().flatten().is_some()
}

/// A mounted tenant. Dropping it unmounts whatever tenantfs mount is at its path (so two guards
/// for one mountpoint are fine), falling back to a lazy unmount and killing the server.
pub struct Mount {
    pub(super) data: PathBuf,
    pub path: PathBuf,
    pub tenant: String,
    pub pid: u32,
}

impl Mount {
    fn umount_cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env_remove("TENANTFS_LOG")
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--config", "/dev/null", "umount"])
            .arg(&self.path);
        c
    }

    /// `tenantfs umount`: must succeed, leave nothing mounted and the server gone.
    pub fn umount(self) {
        let out = check(&mut self.umount_cmd());
        assert!(out.contains("unmounted"), "{out}");
        assert!(
            !tenantfs_mounted(&self.path),
            "{} still mounted after umount",
            self.path.display()
        );
        assert!(
            wait_gone(self.pid, Duration::from_secs(10)),
            "serving process {} still runs after umount",
            self.pid
        );
    }

    /// kill -9 the serving process and wait until it is gone; the mount stays (dead).
    pub fn kill9(&self) {
        assert!(alive(self.pid));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        assert!(
            wait_gone(self.pid, Duration::from_secs(20)),
            "serving process {} survived SIGKILL",
            self.pid
        );
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !tenantfs_mounted(&self.path) {
            return;
        }
        let ok = self
            .umount_cmd()
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok || tenantfs_mounted(&self.path) {
            eprintln!(
                "cleanup: lazy unmount of {} and SIGKILL to {}",
                self.path.display(),
                self.pid
            );
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            if self.pid != 0 && alive(self.pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                wait_gone(self.pid, Duration::from_secs(10));
            }
        }
    }
}

/// A loop device over a file; detached on drop.
pub struct LoopDev {
    pub dev: String,
    attached: bool,
}

impl LoopDev {
    pub fn attach(file: &Path) -> Self {
        let dev = check(Command::new("losetup").args(["--find", "--show"]).arg(file))
            .trim()
            .to_owned();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        Self {
            dev,
            attached: true,
        }
    }

    pub fn detach(mut self) {
        check(&mut cmd("losetup", &["-d", &self.dev]));
        self.attached = false;
        // Detaching is asynchronous while something (udev, a reader) still holds the device.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/sys/block/{}/loop", self.name())).exists() {
            assert!(
                Instant::now() < deadline,
                "{} still attached after losetup -d",
                self.dev
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        if self.attached {
            let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        }
    }
}

/// A plain (non-tenantfs) mount, e.g. ext4 on a loop device; unmounted on drop.
pub struct FsMount {
    pub path: PathBuf,
    mounted: bool,
}

impl FsMount {
    /// `mount args... path`.
    pub fn mount(args: &[&str], path: &Path) -> Self {
        check(Command::new("mount").args(args).arg(path));
        Self {
            path: path.to_owned(),
            mounted: true,
        }
    }

    pub fn umount(mut self) {
        check(Command::new("umount").arg(&self.path));
        self.mounted = false;
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        if self.mounted && mounted(&self.path) {
            let ok = Command::new("umount")
                .arg(&self.path)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            }
        }
    }
}

/// A fresh ext4 of `bytes` at `<dir>/fs`, loop-mounted from `<dir>/fs.img`: a disk a test can
/// fill. The image lives in `dir`; the mount goes when the guard drops.
pub fn small_ext4(dir: &Path, bytes: u64) -> (PathBuf, FsMount) {
    let img = dir.join("fs.img");
    let fs = dir.join("fs");
    std::fs::create_dir_all(&fs).unwrap();
    std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
    check(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    let guard = FsMount::mount(&["-o", "loop", img.to_str().unwrap()], &fs);
    (fs, guard)
}

/// Lets this kernel serve FUSE over io_uring (root; Linux >= 6.14 with CONFIG_FUSE_IO_URING).
pub fn enable_fuse_uring() {
    let p = tenantfs::fuse::URING_PARAMETER;
    if !tenantfs::fuse::uring_enabled() {
        std::fs::write(p, "Y").unwrap_or_else(|e| panic!("cannot enable {p}: {e}"));
    }
}

/// A running `tenantfs daemon`; killed on drop.
pub struct Daemon(pub std::process::Child);

impl Daemon {
    /// SIGTERM, then the exit status (None if it is still running after `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(st) = self.0.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGTERM: the daemon exits 0 within 30 s with none of `mounts` left mounted.
    pub fn terminate_cleanly(&mut self, mounts: &[&Path]) {
        let st = self
            .terminate(Duration::from_secs(30))
            .expect("daemon did not exit on SIGTERM");
        assert!(st.success(), "daemon exited with {st}");
        for mp in mounts {
            assert!(!tenantfs_mounted(mp), "{} still mounted", mp.display());
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
