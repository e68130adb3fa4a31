//! POSIX behaviour through the kernel: special files, appends, exec and mmap, other users'
//! permissions, and clear, harmless errors.

use super::*;

pub(super) const MMAP_PY: &str = r#"
import mmap, os, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    assert m[:5] == b"\x00\x01\x02\x03\x04", m[:5]
    assert m[70000] == 70000 % 251, m[70000]
    m[4090:4110] = b"A" * 20          # across a page boundary
    m[len(m) - 3:] = b"END"
    m.flush()
    m.close()
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    m[100:104] = b"NOFL"              # no msync: close must still write it back
    m.close()
print("mmap ok")
"#;

pub(super) fn mmap_roundtrip(mnt: &Path) {
    let p = mnt.join("mapped.bin");
    let mut data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    let out = check(cmd("python3", &["-c", MMAP_PY]).arg(&p));
    assert_eq!(out.trim(), "mmap ok");
    data[4090..4110].fill(b'A');
    let n = data.len();
    data[n - 3..].copy_from_slice(b"END");
    data[100..104].copy_from_slice(b"NOFL");
    let mut got = Vec::new();
    std::fs::File::open(&p)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_eq!(got.len(), data.len());
    let first = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(
        first.is_none(),
        "mmap writes not read back: first difference at {first:?}"
    );
}

pub(super) const APPEND_PY: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for i in range(1500):
    line = ("%s %06d " % (sys.argv[2], i)).ljust(63, ".") + "\n"
    assert os.write(fd, line.encode()) == 64
os.close(fd)
"#;

pub(super) const SOCKET_PY: &str = r#"
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
cli.connect(path)
conn, _ = srv.accept()
cli.sendall(b"through a socket in the mount")
print(conn.recv(100).decode())
"#;

/// Device nodes, sockets and fifos in a mount work, and O_APPEND writers from several processes
/// never overwrite each other.
#[test]
fn special_files_and_appends() {
    let h = Host::new("special");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let m = h.mount("t", &mnt, "");
    check(
        cmd("mknod", &[])
            .arg(mnt.join("null"))
            .args(["c", "1", "3"]),
    );
    check(
        cmd("mknod", &[])
            .arg(mnt.join("zero"))
            .args(["c", "1", "5"]),
    );
    std::fs::write(mnt.join("null"), b"into the void").unwrap();
    assert!(std::fs::read(mnt.join("null")).unwrap().is_empty());
    let mut z = [1u8; 4096];
    std::fs::File::open(mnt.join("zero"))
        .unwrap()
        .read_exact(&mut z)
        .unwrap();
    assert!(z.iter().all(|&b| b == 0));
    let meta = std::fs::symlink_metadata(mnt.join("null")).unwrap();
    assert_eq!(meta.rdev(), nix::sys::stat::makedev(1, 3));
    let out = check(cmd("python3", &["-c", SOCKET_PY]).arg(mnt.join("sock")));
    assert_eq!(out.trim(), "through a socket in the mount");
    nix::unistd::mkfifo(
        &mnt.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let fifo = mnt.join("fifo");
    let writer = std::thread::spawn(move || std::fs::write(fifo, b"via fifo").unwrap());
    assert_eq!(std::fs::read(mnt.join("fifo")).unwrap(), b"via fifo");
    writer.join().unwrap();

    let log = mnt.join("append.log");
    let procs: Vec<_> = (0..4)
        .map(|p| {
            Command::new("python3")
                .args(["-c", APPEND_PY])
                .arg(&log)
                .arg(format!("writer{p}"))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut p in procs {
        assert!(p.wait().unwrap().success());
    }
    let text = String::from_utf8(std::fs::read(&log).unwrap()).unwrap();
    assert_eq!(text.len(), 4 * 1500 * 64);
    for p in 0..4 {
        let mine: Vec<_> = text
            .lines()
            .filter(|l| l.starts_with(&format!("writer{p} ")))
            .collect();
        assert_eq!(mine.len(), 1500, "writer{p} lost lines");
        for (i, l) in mine.iter().enumerate() {
            assert!(
                l.starts_with(&format!("writer{p} {i:06} ")),
                "out of order: {l}"
            );
            assert_eq!(l.len(), 63);
        }
    }
    m.umount();
    let m = h.mount("t", &mnt, "");
    assert_eq!(std::fs::read(&log).unwrap().len(), 4 * 1500 * 64);
    assert!(std::fs::read(mnt.join("null")).unwrap().is_empty());
    m.umount();
}

/// Programs run from a mount, and shared mmap reads and writes are seen by read(2), with the
/// default direct mode and with the kernel page cache.
#[test]
fn exec_and_mmap() {
    let h = Host::new("exec");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    for opts in ["", "cache=kernel"] {
        let m = h.mount("t", &mnt, opts);
        let ls = mnt.join("bin/ls");
        std::fs::create_dir_all(ls.parent().unwrap()).unwrap();
        std::fs::copy("/bin/ls", &ls).unwrap();
        chmod(&ls, 0o755);
        std::fs::write(mnt.join("bin/hello.sh"), b"#!/bin/sh\necho \"hello $1\"\n").unwrap();
        chmod(&mnt.join("bin/hello.sh"), 0o755);
        let listed = mnt.join(format!("listed{}", opts.len()));
        std::fs::create_dir(&listed).unwrap();
        for name in ["b", "a", "c.txt"] {
            std::fs::write(listed.join(name), name).unwrap();
        }
        let out = check(Command::new(&ls).arg("-1").arg(&listed));
        assert_eq!(out, "a\nb\nc.txt\n", "ls from the mount ({opts})");
        let out = check(Command::new(mnt.join("bin/hello.sh")).arg("world"));
        assert_eq!(out, "hello world\n");
        // Many execs at once: the binary is mapped by several processes.
        let children: Vec<_> = (0..8)
            .map(|_| {
                Command::new(&ls)
                    .arg("/")
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            assert!(c.wait_with_output().unwrap().status.success());
        }
        mmap_roundtrip(&mnt);
        m.umount();
    }
    // And once more after the last remount: what mmap wrote was stored.
    let m = h.mount("t", &mnt, "");
    let got = std::fs::read(mnt.join("mapped.bin")).unwrap();
    assert_eq!(&got[4090..4110], &[b'A'; 20]);
    assert_eq!(&got[100..104], b"NOFL");
    assert_eq!(&got[got.len() - 3..], b"END");
    check(Command::new(mnt.join("bin/ls")).arg("/"));
    m.umount();
}

pub(super) fn as_nobody(script: &str) -> std::process::Output {
    output(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "sh",
        "-c",
        script,
    ]))
}

/// The kernel enforces permissions for other users: a sticky world-writable dir takes their
/// files, root's 0644 file is readable but not writable, sticky forbids deleting it.
#[test]
fn other_users_permissions() {
    let h = Host::new("perm");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let m = h.mount("t", &mnt, "");
    let shared = mnt.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    std::fs::write(shared.join("root-file"), b"root data\n").unwrap();
    chmod(&shared.join("root-file"), 0o644);
    let private = mnt.join("private");
    std::fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let s = shared.display();

    let out = as_nobody(&format!(
        "echo mine > {s}/nobody-file && cat {s}/nobody-file"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"mine\n");
    let meta = std::fs::metadata(shared.join("nobody-file")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));

    let out = as_nobody(&format!("cat {s}/root-file"));
    assert_eq!(out.stdout, b"root data\n");
    let out = as_nobody(&format!("echo more >> {s}/root-file"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(
        std::fs::read(shared.join("root-file")).unwrap(),
        b"root data\n"
    );
    let out = as_nobody(&format!("rm -f {s}/root-file"));
    assert!(
        !out.status.success(),
        "sticky dir let nobody delete root's file"
    );
    assert!(shared.join("root-file").exists());
    let out = as_nobody(&format!("ls {}", private.display()));
    assert!(!out.status.success(), "nobody listed a 0700 root dir");
    let out = as_nobody(&format!("touch {}/x", mnt.display()));
    assert!(!out.status.success(), "nobody wrote into the 0755 root");
    // nobody can chmod its own file, not root's.
    let out = as_nobody(&format!("chmod 600 {s}/nobody-file"));
    assert!(out.status.success());
    assert_eq!(
        std::fs::metadata(shared.join("nobody-file"))
            .unwrap()
            .mode()
            & 0o7777,
        0o600
    );
    let out = as_nobody(&format!("chmod 666 {s}/root-file"));
    assert!(!out.status.success(), "nobody chmodded root's file");
    // Ownership survives a remount.
    m.umount();
    let m = h.mount("t", &mnt, "");
    let meta = std::fs::metadata(shared.join("nobody-file")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (65534, 0o600));
    assert_eq!(std::fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
    m.umount();
}

/// Every mistake is a clear error that changes nothing.
#[test]
fn errors_are_clear_and_harmless() {
    let h = Host::new("err");
    h.create_tenant("t");
    h.create_tenant("u");
    let mnt = h.dir("mnt");
    let mnt2 = h.dir("mnt2");
    let p = |p: &Path| p.to_str().unwrap().to_owned();

    let err = h.fails(&["mount", "nosuch", &p(&mnt)]);
    assert!(
        err.contains("nosuch") && err.contains("tenant list"),
        "{err}"
    );
    assert!(!tenantfs_mounted(&mnt));
    let missing = h.root().join("missing");
    let err = h.fails(&["mount", "t", &p(&missing)]);
    assert!(err.contains("mkdir"), "{err}");
    assert!(!missing.exists(), "the missing mountpoint was created");
    let file = h.root().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let err = h.fails(&["mount", "t", &p(&file)]);
    assert!(err.contains("not a directory"), "{err}");
    let err = h.fails(&["mount", "t", &p(&mnt), "-o", "cache=bogus"]);
    assert!(err.contains("cache=bogus"), "{err}");
    let err = h.fails(&["umount", &p(&mnt)]);
    assert!(err.contains("nothing is mounted"), "{err}");

    // Wrong master key: nothing under the data dir changes.
    let wrong = h.root().join("wrong.key");
    std::fs::write(&wrong, [7u8; 32]).unwrap();
    chmod(&wrong, 0o600);
    let before = snapshot(&h.data);
    let err = h.fails(&["--master-key", &p(&wrong), "mount", "t", &p(&mnt)]);
    assert!(err.contains("not the key"), "{err}");
    assert!(!tenantfs_mounted(&mnt));
    assert!(
        snapshot(&h.data) == before,
        "a wrong key changed the data dir"
    );

    let m = h.mount("t", &mnt, "");
    std::fs::write(mnt.join("keep"), b"keep").unwrap();
    let err = h.fails(&["mount", "t", &p(&mnt2)]);
    assert!(err.contains("in use"), "{err}");
    assert!(!tenantfs_mounted(&mnt2));
    let err = h.fails(&["mount", "u", &p(&mnt)]);
    assert!(err.contains("already mounted"), "{err}");
    let err = h.fails(&["mount", "t", &p(&mnt)]);
    assert!(
        err.contains("already mounted") || err.contains("in use"),
        "{err}"
    );
    let err = h.fails(&["tenant", "delete", "t"]);
    assert!(err.contains("in use"), "{err}");
    // A non-tenantfs mount is not ours to unmount.
    let tmpfs_dir = h.dir("tmpfs");
    let tmpfs = FsMount::mount(&["-t", "tmpfs", "none"], &tmpfs_dir);
    let err = h.fails(&["umount", &p(&tmpfs_dir)]);
    assert!(err.contains("not a tenantfs mount"), "{err}");
    assert!(mounted(&tmpfs_dir));
    tmpfs.umount();
    // A busy mount is refused with the reason, and stays mounted.
    let busy = std::fs::File::open(mnt.join("keep")).unwrap();
    let cwd = Command::new("sleep")
        .arg("30")
        .current_dir(&mnt)
        .spawn()
        .unwrap();
    let out = h.run(&["umount", &p(&mnt)]);
    let mut cwd = cwd;
    let _ = cwd.kill();
    let _ = cwd.wait();
    drop(busy);
    assert!(!out.status.success(), "umount of a busy mount succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("busy"), "{err}");
    // Everything still works after all that.
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"keep");
    m.umount();

    // Read-only mounts refuse changes.
    let m = h.mount("t", &mnt, "ro,cache=kernel");
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"keep");
    let e = std::fs::write(mnt.join("keep"), b"changed").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = std::fs::create_dir(mnt.join("new")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    m.umount();

    // Relative mountpoints, and names the mount table has to escape.
    let spaced = h.dir("with space\tand tab");
    let m = h.mount("t", &spaced, "");
    assert_eq!(std::fs::read(spaced.join("keep")).unwrap(), b"keep");
    m.umount();
    let out = check(h.cmd().current_dir(h.root()).args(["mount", "t", "mnt"]));
    assert!(out.contains("served by pid"), "{out}");
    let rel = h.guard("t", &mnt, 0);
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"keep");
    let out = check(h.cmd().current_dir(h.root()).args(["umount", "./mnt/"]));
    assert!(out.contains("flushed"), "{out}");
    assert!(!tenantfs_mounted(&mnt));
    drop(rel);
    let m = h.mount("u", &mnt2, "");
    m.umount();
    let m = h.mount("t", &mnt2, "");
    assert_eq!(std::fs::read(mnt2.join("keep")).unwrap(), b"keep");
    m.umount();
    h.ok(&["tenant", "delete", "u"]);
}
