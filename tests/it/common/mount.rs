//! Helpers for tests against real FUSE mounts through the real `tenantfs` binary: a data dir in
//! its own temp dir, mount guards that always unmount, loop-device and plain-mount guards, and
//! tree manifests for comparing copies.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tenantfs");

/// Runs `cmd`, returns its output (spawn failures panic with the program name).
pub fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}

fn show(cmd: &Command, out: &Output) -> String {
    format!(
        "{cmd:?}: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, asserts it succeeded, returns stdout.
pub fn check(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(out.status.success(), "{}", show(cmd, &out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd`, asserts it failed, returns stderr.
pub fn check_fails(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(!out.status.success(), "succeeded: {}", show(cmd, &out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `prog args...` as a Command.
pub fn cmd(prog: &str, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args);
    c
}

/// Runs a shell snippet; asserts success; returns stdout.
pub fn sh(script: &str) -> String {
    check(Command::new("sh").args(["-c", script]))
}

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

/// Whether a task's stat line shows it running (not a zombie or dead).
fn task_runs(stat: &str) -> bool {
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.trim_start())
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Whether process `pid` still runs: any of its threads is not yet a zombie. (Its leader turns
/// zombie before the other threads are done; until the last one exits, the process still holds
/// its files and locks. A zombie holds none, and nobody may reap it here.)
pub fn alive(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| task_runs(&s)))
}

pub fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

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
        let mut c = Command::new(BIN);
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

/// A mounted tenant. Dropping it unmounts whatever tenantfs mount is at its path (so two guards
/// for one mountpoint are fine), falling back to a lazy unmount and killing the server.
pub struct Mount {
    data: PathBuf,
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

/// What a tree entry looks like, everything `cp -a` promises to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File {
        perm: u32,
        uid: u32,
        gid: u32,
        nlink: u64,
        size: u64,
        mtime: (i64, i64),
        hash: String,
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Dir {
        perm: u32,
        uid: u32,
        gid: u32,
        mtime: (i64, i64),
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Symlink {
        target: PathBuf,
        uid: u32,
        gid: u32,
        mtime: (i64, i64),
    },
    Fifo {
        perm: u32,
        uid: u32,
        gid: u32,
    },
}

pub fn hash_file(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::io::copy(&mut f, &mut h).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    h.finalize().to_hex().to_string()
}

/// user.* extended attributes of `path` (not following symlinks).
pub fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: `c` is a NUL-terminated path and `names` a buffer of the length passed;
    // llistxattr writes at most that many bytes into it.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name).unwrap();
        let mut value = vec![0u8; 64 * 1024];
        // SAFETY: `c` and `cn` are NUL-terminated; `value` is a buffer of the length
        // passed, which lgetxattr does not write past.
        let len = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cn.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(len >= 0, "getxattr {}", path.display());
        value.truncate(len as usize);
        out.insert(name.to_vec(), value);
    }
    out
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: `c` and `n` are NUL-terminated; setxattr reads `value.len()` bytes of
    // `value`, which it holds.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Every entry under `root` (relative path -> node), `root` itself excluded.
pub fn manifest(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()));
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()));
        let p = e.path();
        let m = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let t = m.file_type();
        let rel = p.strip_prefix(root).unwrap().to_owned();
        let perm = m.mode() & 0o7777;
        let mtime = (m.mtime(), m.mtime_nsec());
        let node = if t.is_symlink() {
            Node::Symlink {
                target: std::fs::read_link(&p).unwrap(),
                uid: m.uid(),
                gid: m.gid(),
                mtime,
            }
        } else if t.is_dir() {
            walk(root, &p, out);
            Node::Dir {
                perm,
                uid: m.uid(),
                gid: m.gid(),
                mtime,
                xattrs: xattrs(&p),
            }
        } else if t.is_file() {
            Node::File {
                perm,
                uid: m.uid(),
                gid: m.gid(),
                nlink: m.nlink(),
                size: m.len(),
                mtime,
                hash: hash_file(&p),
                xattrs: xattrs(&p),
            }
        } else if t.is_fifo() {
            Node::Fifo {
                perm,
                uid: m.uid(),
                gid: m.gid(),
            }
        } else {
            panic!("unexpected file type at {}", p.display());
        };
        out.insert(rel, node);
    }
}

/// Asserts two manifests are equal, naming the first difference.
pub fn assert_same_tree(want: &BTreeMap<PathBuf, Node>, got: &BTreeMap<PathBuf, Node>, what: &str) {
    for (p, n) in want {
        match got.get(p) {
            None => panic!("{what}: {} missing", p.display()),
            Some(g) => assert_eq!(g, n, "{what}: {} differs", p.display()),
        }
    }
    for p in got.keys() {
        assert!(want.contains_key(p), "{what}: unexpected {}", p.display());
    }
}

/// Bytes of `path` that hold data, by walking SEEK_DATA/SEEK_HOLE.
pub fn data_bytes(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let fd = f.as_raw_fd();
    let size = f.metadata().unwrap().len() as i64;
    let mut total = 0u64;
    let mut pos = 0i64;
    while pos < size {
        // SAFETY: lseek takes a descriptor and integers; `fd` is open while `f` lives.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "SEEK_DATA: {e}");
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        assert!(
            hole > data,
            "SEEK_HOLE from {data} gave {hole}: {}",
            std::io::Error::last_os_error()
        );
        total += (hole - data) as u64;
        pos = hole;
    }
    total
}

/// Writes `data` to a new file and fsyncs it.
pub fn write_synced(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// fsync on a directory.
pub fn sync_dir(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
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
    let _ = std::fs::remove_file(notify);
    let listener = std::os::unix::net::UnixDatagram::bind(notify).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let child = h
        .cmd()
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

/// Sends one JSON request line to the control socket at `socket` as uid/gid 65534 (python3
/// through setpriv) and returns the response line: what a non-root client gets.
pub fn request_as_nobody(socket: &Path, request: &str) -> String {
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); \
         s.sendall({:?}.encode() + b'\\n'); print(s.makefile().readline())",
        socket.to_str().unwrap(),
        request
    );
    check(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/python3",
        "-c",
        &script,
    ]))
}
