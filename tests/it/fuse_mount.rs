//! Real mounts through the real binary: copies of real trees, git, fio with verification,
//! durability under kill -9, clean unmounts on signals, a loop-mounted ext4 on a tenant file,
//! exec and mmap, special files, other users, clear errors, no plaintext at rest, and random
//! data and namespace operations checked against the host's disk. Each test has its own data
//! dir and mountpoints under /var/tmp; every mount, loop device and ext4 mount is undone by a
//! guard, even on panic.

use crate::common;
use crate::common::guards::{mounted, tenantfs_mounted, FsMount, LoopDev};
use crate::common::mount::Host;
use crate::common::process::{check, cmd, output, wait_gone};
use crate::common::trees::{
    assert_same_tree, data_bytes, manifest, set_xattr, sync_dir, write_synced, xattrs, Node,
};
use crate::generators::{data_op, namespace_step, sequence, DataOp, NamespaceOp};

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use tenantfs::volume::{Fallocate, RenameMode};

use common::{contains, files_under, noise, snapshot};

const MIB: usize = 1 << 20;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with what real trees have: this crate's sources, deep dirs, many small files, a few
/// multi-MiB files, a sparse file, symlinks (relative, absolute, dangling, to dirs), a hard
/// link, a fifo, odd names and modes, user xattrs.
fn make_tree(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let manifest_dir = env!("CARGO_MANIFEST_DIR");
    check(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{manifest_dir}/src"))
            .arg(format!("{manifest_dir}/tests"))
            .arg(dir),
    );
    let gen = dir.join("gen");
    for i in 0..400u64 {
        let sub = gen.join(format!("d{}/e{}/f{}", i % 7, i % 5, i % 3));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(
            sub.join(format!("small-{i}.bin")),
            noise(i, (i * 37 % 9000) as usize),
        )
        .unwrap();
    }
    // One big directory: readdir has to continue across many replies.
    let many = gen.join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..3000u64 {
        let name = format!("entry-{i:05}-{}", "x".repeat((i % 200) as usize));
        std::fs::write(many.join(name), noise(i, (i % 64) as usize)).unwrap();
    }
    let deep = (0..24).fold(gen.clone(), |p, i| p.join(format!("level{i}")));
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom.txt"), b"deep\n").unwrap();
    for (i, size) in [3 * MIB + 1, 5 * MIB, 7 * MIB + 4095]
        .into_iter()
        .enumerate()
    {
        std::fs::write(
            gen.join(format!("big-{i}.bin")),
            noise(1000 + i as u64, size),
        )
        .unwrap();
    }
    // Sparse: data, a 6 MiB hole, data, a hole to the end.
    let mut f = std::fs::File::create(gen.join("sparse.img")).unwrap();
    f.write_all(&noise(7, 100_000)).unwrap();
    f.seek(SeekFrom::Start(6 * MIB as u64)).unwrap();
    f.write_all(&noise(8, 5000)).unwrap();
    f.set_len(10 * MIB as u64).unwrap();
    drop(f);
    std::fs::write(gen.join("empty"), b"").unwrap();
    std::fs::create_dir(gen.join("empty-dir")).unwrap();
    std::fs::write(gen.join("name with spaces & ünïcode ☃.txt"), b"odd name\n").unwrap();
    std::fs::write(
        gen.join(format!("{}.long", "n".repeat(250))),
        b"long name\n",
    )
    .unwrap();
    let script = gen.join("run.sh");
    std::fs::write(&script, b"#!/bin/sh\necho hi\n").unwrap();
    chmod(&script, 0o755);
    let secret = gen.join("secret");
    std::fs::write(&secret, b"s\n").unwrap();
    chmod(&secret, 0o600);
    let ro = gen.join("readonly");
    std::fs::write(&ro, b"r\n").unwrap();
    chmod(&ro, 0o444);
    let suid = gen.join("suid");
    std::fs::write(&suid, b"#!/bin/sh\n").unwrap();
    chmod(&suid, 0o4755);
    let private = gen.join("private-dir");
    std::fs::create_dir(&private).unwrap();
    std::fs::write(private.join("inside"), b"i\n").unwrap();
    let sticky = gen.join("sticky-dir");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    std::fs::hard_link(gen.join("big-0.bin"), gen.join("big-0.hardlink")).unwrap();
    std::os::unix::fs::symlink("big-1.bin", gen.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("d1/e1", gen.join("link-dir")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", gen.join("link-abs")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", gen.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("../../gen/big-2.bin", gen.join("d0/e0/link-up")).unwrap();
    nix::unistd::mkfifo(
        &gen.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    set_xattr(&gen.join("secret"), "user.comment", b"a user xattr");
    set_xattr(&gen.join("d2"), "user.dir", &noise(3, 300));
    chmod(&private, 0o700);
}

/// `cp -a` a real tree in and back out: contents, modes, owners, times, links, xattrs are
/// identical; the same after a remount (with the kernel page cache this time).
#[test]
fn copy_tree_in_and_out() {
    let h = Host::new("tree");
    h.create_tenant("t");
    let src = h.root().join("src");
    make_tree(&src);
    let want = manifest(&src);
    assert!(want.len() > 500, "tree too small: {}", want.len());
    let mnt = h.dir("mnt");
    let m = h.mount("t", &mnt, "");
    check(cmd("cp", &["-a"]).arg(&src).arg(mnt.join("tree")));
    assert_same_tree(&want, &manifest(&mnt.join("tree")), "in the mount");
    let out1 = h.root().join("out1");
    check(cmd("cp", &["-a"]).arg(mnt.join("tree")).arg(&out1));
    assert_same_tree(&want, &manifest(&out1), "copied back out");
    // Hard links share the inode inside the mount too.
    let a = std::fs::metadata(mnt.join("tree/gen/big-0.bin")).unwrap();
    let b = std::fs::metadata(mnt.join("tree/gen/big-0.hardlink")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    // The tree is readable by a program that knows nothing of us.
    let diff = check(
        cmd("diff", &["-r", "--no-dereference", "-x", "fifo"])
            .arg(&src)
            .arg(mnt.join("tree")),
    );
    assert!(diff.is_empty(), "{diff}");
    let df = check(cmd("df", &["-P"]).arg(&mnt));
    assert!(df.contains("tenantfs:t"), "{df}");
    // Without a daemon, `tenant list` asks the serving process (other tests' tenants named
    // "t" in other data dirs are mounted meanwhile: they must not show up).
    let list: serde_json::Value =
        serde_json::from_str(&h.ok(&["tenant", "list", "--json"])).unwrap();
    assert_eq!(list[0]["mounts"], serde_json::json!([mnt]), "{list}");
    m.umount();
    let list: serde_json::Value =
        serde_json::from_str(&h.ok(&["tenant", "list", "--json"])).unwrap();
    assert_eq!(list[0]["mounts"], serde_json::json!([]), "{list}");

    let m = h.mount("t", &mnt, "cache=kernel");
    assert_same_tree(&want, &manifest(&mnt.join("tree")), "after remount");
    let out2 = h.root().join("out2");
    check(cmd("cp", &["-a"]).arg(mnt.join("tree")).arg(&out2));
    assert_same_tree(&want, &manifest(&out2), "copied out after remount");
    // Remove it all: nothing is left behind, and the root is empty again.
    check(cmd("rm", &["-rf"]).arg(mnt.join("tree")));
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    m.umount();
    let m = h.mount("t", &mnt, "");
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    m.umount();
}

fn git(repo: &Path, args: &[&str]) -> String {
    check(
        Command::new("git")
            .current_dir(repo)
            .env("HOME", repo.parent().unwrap())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args([
                "-c",
                "user.name=Tenant Test",
                "-c",
                "user.email=tenant@example.com",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args),
    )
}

/// git works inside a mount (lock files, renames, fsync, mmap of packs), and the repository
/// is whole after a remount.
#[test]
fn git_repository() {
    let h = Host::new("git");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let m = h.mount("t", &mnt, "");
    let repo = mnt.join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    check(
        cmd("cp", &["-a"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
            .arg(&repo),
    );
    std::fs::write(repo.join("big.bin"), noise(5, 3 * MIB)).unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    git(&repo, &["mv", "src/main.rs", "src/renamed.rs"]);
    std::fs::write(repo.join("src/lib.rs"), b"// rewritten\n").unwrap();
    git(&repo, &["commit", "-q", "-a", "-m", "second"]);
    git(&repo, &["gc", "-q"]);
    git(&repo, &["fsck", "--full", "--strict"]);
    let log = git(&repo, &["log", "--format=%s"]);
    assert_eq!(log.lines().collect::<Vec<_>>(), ["second", "first"]);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    m.umount();

    let m = h.mount("t", &mnt, "");
    let status = git(&repo, &["status", "--porcelain", "--untracked-files=all"]);
    assert!(status.is_empty(), "dirty after remount:\n{status}");
    git(&repo, &["fsck", "--full", "--strict"]);
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]), head);
    let files = git(&repo, &["ls-files"]);
    assert!(files.lines().any(|l| l == "src/renamed.rs"), "{files}");
    assert_eq!(
        std::fs::read(repo.join("src/lib.rs")).unwrap(),
        b"// rewritten\n"
    );
    // Check out the first commit and back: many files rewritten in place.
    git(&repo, &["checkout", "-q", "HEAD~1"]);
    assert!(repo.join("src/main.rs").exists());
    git(&repo, &["checkout", "-q", "main"]);
    let status = git(&repo, &["status", "--porcelain"]);
    assert!(status.is_empty(), "{status}");
    m.umount();
}

fn fio(cwd: &Path, args: &[&str]) {
    // fio leaves verify state files in its working directory: keep them out of the repo.
    let out = check(
        Command::new("fio")
            .current_dir(cwd)
            .args([
                "--output-format=normal",
                "--ioengine=psync",
                "--direct=1",
                "--verify_state_save=0",
            ])
            .args(args),
    );
    let errs: Vec<_> = out.lines().filter(|l| l.contains("err=")).collect();
    assert!(
        !errs.is_empty() && errs.iter().all(|l| l.contains("err= 0")) && !out.contains("bad"),
        "fio:\n{out}"
    );
}

/// fio with verification: random 4K and 64K writes, and a sequential write verified by a
/// separate read-only pass after a remount.
#[test]
fn fio_verify() {
    let h = Host::new("fio");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let m = h.mount("t", &mnt, "");
    for bs in ["4k", "64k"] {
        let file = format!("--filename={}/fio-{bs}.dat", mnt.display());
        fio(
            h.root(),
            &[
                "--name=v",
                &file,
                "--size=64M",
                "--rw=randwrite",
                &format!("--bs={bs}"),
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
            ],
        );
    }
    // Several jobs at once, and buffered unaligned writes of odd sizes (read-modify-write of
    // partial blocks).
    let dir = format!("--directory={}", mnt.display());
    fio(
        h.root(),
        &[
            "--name=par",
            &dir,
            "--numjobs=4",
            "--size=16M",
            "--rw=randwrite",
            "--bs=8k",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    fio(
        h.root(),
        &[
            "--name=odd",
            &dir,
            "--size=16M",
            "--rw=randwrite",
            "--direct=0",
            "--bsrange=512-20k",
            "--bs_unaligned=1",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    let seq = format!("--filename={}/fio-seq.dat", mnt.display());
    let seq_args = [
        "--name=s",
        &seq,
        "--size=64M",
        "--rw=write",
        "--bs=64k",
        "--verify=crc32c",
        "--verify_fatal=1",
    ];
    let mut write = seq_args.to_vec();
    write.push("--do_verify=0");
    fio(h.root(), &write);
    m.umount();
    let m = h.mount("t", &mnt, "");
    let mut verify = seq_args.to_vec();
    verify.push("--verify_only=1");
    fio(h.root(), &verify);
    assert_eq!(
        std::fs::metadata(mnt.join("fio-seq.dat")).unwrap().len(),
        64 << 20
    );
    m.umount();
}

/// kill -9 of the serving process: the mountpoint is dead, mounting again detaches it, and
/// everything fsync'd (files, renames with a directory fsync) is there.
#[test]
fn durability_under_kill9() {
    let h = Host::new("kill");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let m = h.mount("t", &mnt, "");
    let mut want = Vec::new();
    let d = mnt.join("dir");
    std::fs::create_dir(&d).unwrap();
    for i in 0..40u64 {
        let data = noise(100 + i, (i as usize * 7919) % (300 * 1024) + 1);
        let p = d.join(format!("f{i}"));
        write_synced(&p, &data);
        want.push((p, data));
    }
    let big = noise(99, 9 * MIB + 123);
    write_synced(&mnt.join("big"), &big);
    want.push((mnt.join("big"), big.clone()));
    // Overwrite in place, and extend; fsync.
    let mut patched = big.clone();
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("big"))
            .unwrap();
        f.seek(SeekFrom::Start(4 * MIB as u64 + 17)).unwrap();
        f.write_all(&[0xAB; 10_000]).unwrap();
        patched[4 * MIB + 17..4 * MIB + 17 + 10_000].fill(0xAB);
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(b"tail").unwrap();
        patched.extend_from_slice(b"tail");
        f.sync_all().unwrap();
    }
    want.last_mut().unwrap().1 = patched;
    // Truncate, fsync.
    let t = d.join("f5");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&t)
        .unwrap()
        .set_len(10)
        .unwrap();
    std::fs::File::open(&t).unwrap().sync_all().unwrap();
    want.iter_mut()
        .find(|(p, _)| *p == t)
        .unwrap()
        .1
        .truncate(10);
    // Atomic replace: write a temp file, fsync, rename over, fsync the directory.
    let tmp = d.join(".f7.tmp");
    let new7 = noise(777, 50_000);
    write_synced(&tmp, &new7);
    std::fs::rename(&tmp, d.join("f7")).unwrap();
    sync_dir(&d);
    want.iter_mut().find(|(p, _)| p.ends_with("f7")).unwrap().1 = new7;
    // Move a directory, fsync both parents.
    std::fs::create_dir(mnt.join("moved")).unwrap();
    write_synced(&mnt.join("moved/inner"), b"inner");
    std::fs::rename(mnt.join("moved"), d.join("moved-here")).unwrap();
    sync_dir(&mnt);
    sync_dir(&d);
    want.push((d.join("moved-here/inner"), b"inner".to_vec()));
    std::os::unix::fs::symlink("f1", d.join("sym")).unwrap();
    sync_dir(&d);
    // Not synced: may or may not survive, but must not break anything.
    std::fs::write(mnt.join("unsynced"), noise(5, 70_000)).unwrap();
    // A bulk write (1 MiB requests skip the WAL until fsync) not synced either.
    let bulk = noise(6, 3 * MIB);
    std::fs::write(mnt.join("bulk-unsynced"), &bulk).unwrap();

    m.kill9();
    let e = std::fs::metadata(&mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    assert!(tenantfs_mounted(&mnt), "dead mount vanished from the table");

    let m2 = h.mount("t", &mnt, "");
    for (p, data) in &want {
        let got = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(got == *data, "{} differs after kill -9", p.display());
    }
    assert!(!tmp.exists(), "temp file back after rename");
    assert_eq!(std::fs::read_link(d.join("sym")).unwrap(), Path::new("f1"));
    let names: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 42, "{names:?}");
    // The whole tree is readable (the unsynced file whole or absent, with any size).
    for p in files_under(&mnt) {
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    // The unsynced bulk file, if there: each block what was written or zeros, no other bytes.
    if let Ok(got) = std::fs::read(mnt.join("bulk-unsynced")) {
        assert!(got.len() <= bulk.len());
        for (i, (g, w)) in got.chunks(4096).zip(bulk.chunks(4096)).enumerate() {
            assert!(
                g == &w[..g.len()] || g.iter().all(|&b| b == 0),
                "block {i} of an unsynced bulk write holds other bytes"
            );
        }
    }
    // Still writable after recovery, and it survives a clean remount.
    std::fs::write(d.join("after"), b"after").unwrap();
    m2.umount();
    let m3 = h.mount("t", &mnt, "");
    assert_eq!(std::fs::read(d.join("after")).unwrap(), b"after");
    assert!(std::fs::read(&want[0].0).unwrap() == want[0].1);
    // `tenantfs umount` also clears a dead mount.
    m3.kill9();
    let out = h.ok(&["umount", mnt.to_str().unwrap()]);
    assert!(out.contains("unmounted"), "{out}");
    assert!(!tenantfs_mounted(&mnt));
    assert!(std::fs::metadata(&mnt).unwrap().is_dir());
    let m4 = h.mount("t", &mnt, "");
    assert!(std::fs::read(&want[1].0).unwrap() == want[1].1);
    m4.umount();
    drop(m);
}

/// SIGINT to a foreground mount and SIGTERM to a background server unmount cleanly, with
/// everything written kept.
#[test]
fn signals_unmount_cleanly() {
    let h = Host::new("sig");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let child = h
        .cmd()
        .args(["mount", "--foreground", "t"])
        .arg(&mnt)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let guard = h.guard("t", &mnt, child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !tenantfs_mounted(&mnt) {
        assert!(
            std::time::Instant::now() < deadline,
            "foreground mount never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::write(mnt.join("fg"), b"foreground").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(err.contains("serving tenant t"), "{err}");
    assert!(!tenantfs_mounted(&mnt));
    drop(guard);

    let m = h.mount("t", &mnt, "");
    assert_eq!(std::fs::read(mnt.join("fg")).unwrap(), b"foreground");
    std::fs::write(mnt.join("bg"), b"background").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_gone(m.pid, std::time::Duration::from_secs(20)));
    assert!(!tenantfs_mounted(&mnt), "SIGTERM left the mount behind");
    let m = h.mount("t", &mnt, "");
    assert_eq!(std::fs::read(mnt.join("bg")).unwrap(), b"background");
    m.umount();
}

fn e2fsck_clean(dev: &str) {
    let out = output(Command::new("e2fsck").args(["-fn", dev]));
    assert!(
        out.status.success(),
        "e2fsck -fn {dev}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tenant file as a block device: ext4 on a loop device over an 8 GiB sparse file,
/// fsck-clean and with the same files after a tenant remount; discard (fstrim, punch hole)
/// frees the tenant's extents.
#[test]
fn ext4_on_loop_device() {
    let h = Host::new("loop");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let ext = h.dir("ext4");
    let m = h.mount("t", &mnt, "");
    let img = mnt.join("disk.img");
    check(cmd("truncate", &["-s", "8G"]).arg(&img));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 8 << 30);
    assert_eq!(data_bytes(&img), 0, "a new sparse file holds data");

    let lo = LoopDev::attach(&img);
    check(&mut cmd("mkfs.ext4", &["-q", "-F", &lo.dev]));
    let fs = FsMount::mount(&[&lo.dev], &ext);
    let mut files = Vec::new();
    for (i, size) in [MIB, 4 * MIB + 5, 9 * MIB, 100, 0].into_iter().enumerate() {
        let data = noise(500 + i as u64, size);
        let p = ext.join(format!("file{i}"));
        std::fs::write(&p, &data).unwrap();
        files.push((p, blake3::hash(&data)));
    }
    std::fs::create_dir(ext.join("sub")).unwrap();
    std::fs::write(ext.join("sub/x"), b"x").unwrap();
    check(cmd("sync", &["-f"]).arg(&ext));
    for (p, hash) in &files {
        assert_eq!(blake3::hash(&std::fs::read(p).unwrap()), *hash);
    }
    fs.umount();
    e2fsck_clean(&lo.dev);
    lo.detach();
    m.umount();

    let m = h.mount("t", &mnt, "");
    let lo = LoopDev::attach(&img);
    e2fsck_clean(&lo.dev);
    let fs = FsMount::mount(&[&lo.dev], &ext);
    for (p, hash) in &files {
        let got = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(blake3::hash(&got), *hash, "{} after remount", p.display());
    }
    // Discard: a 32 MiB file written and synced shows up in the image's data; deleted and
    // trimmed, it is gone from it.
    let before = data_bytes(&img);
    std::fs::write(ext.join("victim"), noise(42, 32 * MIB)).unwrap();
    check(cmd("sync", &["-f"]).arg(&ext));
    let with = data_bytes(&img);
    assert!(
        with >= before + 31 * MIB as u64,
        "32 MiB written through ext4, image data {before} -> {with}"
    );
    std::fs::remove_file(ext.join("victim")).unwrap();
    check(cmd("sync", &["-f"]).arg(&ext));
    check(cmd("fstrim", &[]).arg(&ext));
    let after = data_bytes(&img);
    assert!(
        after + 31 * MIB as u64 <= with,
        "fstrim freed too little: image data {before} -> {with} -> {after}"
    );
    fs.umount();
    e2fsck_clean(&lo.dev);
    lo.detach();

    // Punch a hole straight into a tenant file.
    let f = mnt.join("punch.bin");
    let data = noise(9, 8 * MIB);
    std::fs::write(&f, &data).unwrap();
    assert_eq!(data_bytes(&f), 8 * MIB as u64);
    check(
        cmd(
            "fallocate",
            &["--punch-hole", "--offset", "2MiB", "--length", "4MiB"],
        )
        .arg(&f),
    );
    let mut expect = data.clone();
    expect[2 * MIB..6 * MIB].fill(0);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 8 * MIB as u64);
    assert_eq!(data_bytes(&f), 4 * MIB as u64);
    assert!(std::fs::read(&f).unwrap() == expect);
    // Zero range (stays allocated as far as the size goes), preallocation, unsupported modes.
    check(cmd("fallocate", &["-z", "--offset", "7MiB", "--length", "4096"]).arg(&f));
    expect[7 * MIB..7 * MIB + 4096].fill(0);
    assert!(std::fs::read(&f).unwrap() == expect);
    let pre = mnt.join("prealloc");
    check(cmd("fallocate", &["-l", "16MiB"]).arg(&pre));
    assert_eq!(std::fs::metadata(&pre).unwrap().len(), 16 * MIB as u64);
    assert!(std::fs::read(&pre).unwrap().iter().all(|&b| b == 0));
    let out = output(
        cmd(
            "fallocate",
            &["--collapse-range", "--offset", "0", "--length", "1MiB"],
        )
        .arg(&f),
    );
    assert!(!out.status.success(), "collapse-range succeeded");
    assert!(std::fs::read(&f).unwrap() == expect);
    m.umount();
    let m = h.mount("t", &mnt, "");
    assert_eq!(data_bytes(&f), 4 * MIB as u64 - 4096);
    assert!(std::fs::read(&f).unwrap() == expect);
    assert_eq!(std::fs::metadata(&pre).unwrap().len(), 16 * MIB as u64);
    m.umount();
}

const MMAP_PY: &str = r#"
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

fn mmap_roundtrip(mnt: &Path) {
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

const APPEND_PY: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for i in range(1500):
    line = ("%s %06d " % (sys.argv[2], i)).ljust(63, ".") + "\n"
    assert os.write(fd, line.encode()) == 64
os.close(fd)
"#;

const SOCKET_PY: &str = r#"
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

fn as_nobody(script: &str) -> std::process::Output {
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

const MARKER: &[u8] = b"TENANTFS-FUSE-PLAINTEXT-MARKER-4b1d";

/// Data, names, link targets and xattrs written through a mount leave no plaintext under the
/// data dir, neither while mounted (WAL) nor after unmount and a remount.
#[test]
fn no_plaintext_at_rest() {
    let h = Host::new("plain");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let marker = std::str::from_utf8(MARKER).unwrap();
    let scan = |when: &str| {
        let mut n = 0;
        for p in files_under(&h.data) {
            let bytes = std::fs::read(&p).unwrap();
            n += bytes.len();
            assert!(
                !contains(&bytes, MARKER),
                "{when}: plaintext in {}",
                p.display()
            );
        }
        assert!(n > 1 << 20, "{when}: only {n} bytes under the data dir");
    };
    let m = h.mount("t", &mnt, "");
    let mut small = MARKER.to_vec();
    small.extend_from_slice(b" small\n");
    std::fs::write(mnt.join("small.txt"), &small).unwrap();
    let mut big = Vec::new();
    for i in 0..4000u64 {
        big.extend_from_slice(MARKER);
        big.extend(noise(i, 1000));
    }
    let mut f = std::fs::File::create(mnt.join("big.bin")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    std::fs::create_dir(mnt.join(marker)).unwrap();
    std::fs::write(mnt.join(marker).join(format!("{marker}.txt")), &small).unwrap();
    std::os::unix::fs::symlink(marker, mnt.join("link")).unwrap();
    set_xattr(&mnt.join("small.txt"), "user.m", MARKER);
    sync_dir(&mnt);
    scan("while mounted");
    m.umount();
    scan("after umount");
    let m = h.mount("t", &mnt, "");
    assert!(std::fs::read(mnt.join("big.bin")).unwrap() == big);
    assert_eq!(
        std::fs::read_link(mnt.join("link")).unwrap(),
        Path::new(marker)
    );
    assert_eq!(xattrs(&mnt.join("small.txt"))[&b"user.m"[..]], MARKER);
    m.umount();
    scan("after remount");
}

fn fallocate(f: &std::fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate takes a descriptor and three integers; the descriptor is
    // open for as long as `f` is borrowed.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Random writes, reads, truncates, hole punches and zero ranges on files in a mount and on a
/// reference file on the host's disk give the same bytes, in both cache modes and after a
/// remount.
#[test]
fn random_ops_match_reference() {
    use std::os::unix::fs::FileExt;
    let h = Host::new("random");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let reference = h.dir("reference");
    const FILES: usize = 3;
    const SPAN: u64 = 6 << 20;
    for (round, opts) in ["", "cache=kernel"].into_iter().enumerate() {
        let m = h.mount("t", &mnt, opts);
        let open = |dir: &Path, i: usize| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(format!("r{i}")))
                .unwrap()
        };
        let mut pairs: Vec<_> = (0..FILES)
            .map(|i| (open(&mnt, i), open(&reference, i)))
            .collect();
        let steps = sequence(data_op(FILES, SPAN), 5000, 0x5EED_0000 + round as u64);
        for (step, op) in steps.into_iter().enumerate() {
            let ctx = format!("round {round} step {step}: {op:?}");
            let i = match op {
                DataOp::Write { file, .. }
                | DataOp::Read { file, .. }
                | DataOp::Truncate { file, .. }
                | DataOp::Fallocate { file, .. }
                | DataOp::SyncData { file }
                | DataOp::Reopen { file } => file,
            };
            let (a, b) = &pairs[i];
            match op {
                DataOp::Write {
                    offset, data, len, ..
                } => {
                    let data = data.bytes(len as usize);
                    a.write_all_at(&data, offset).unwrap();
                    b.write_all_at(&data, offset).unwrap();
                }
                DataOp::Read { offset, len, .. } => {
                    let mut x = vec![0u8; len as usize];
                    let mut y = vec![0u8; len as usize];
                    let n = a.read_at(&mut x, offset).unwrap();
                    let k = b.read_at(&mut y, offset).unwrap();
                    assert_eq!(n, k, "{ctx}: read lengths");
                    assert!(x[..n] == y[..k], "{ctx}: read differs");
                }
                DataOp::Truncate { size, .. } => {
                    a.set_len(size).unwrap();
                    b.set_len(size).unwrap();
                }
                DataOp::Fallocate {
                    offset, len, mode, ..
                } => {
                    let keep = |k: bool| if k { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
                    let mode = match mode {
                        Fallocate::Allocate { keep_size } => keep(keep_size),
                        Fallocate::PunchHole => {
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
                        }
                        Fallocate::ZeroRange { keep_size } => {
                            libc::FALLOC_FL_ZERO_RANGE | keep(keep_size)
                        }
                    };
                    fallocate(a, mode, offset, len).unwrap();
                    fallocate(b, mode, offset, len).unwrap();
                }
                DataOp::SyncData { .. } => a.sync_data().unwrap(),
                DataOp::Reopen { .. } => {
                    pairs[i] = (open(&mnt, i), open(&reference, i));
                }
            }
            let (a, b) = &pairs[i];
            assert_eq!(
                a.metadata().unwrap().len(),
                b.metadata().unwrap().len(),
                "{ctx}: sizes"
            );
        }
        drop(pairs);
        for i in 0..FILES {
            let name = format!("r{i}");
            assert!(
                std::fs::read(mnt.join(&name)).unwrap()
                    == std::fs::read(reference.join(&name)).unwrap(),
                "round {round}: {name} differs at the end"
            );
        }
        m.umount();
        let m = h.mount("t", &mnt, "");
        for i in 0..FILES {
            let name = format!("r{i}");
            assert!(
                std::fs::read(mnt.join(&name)).unwrap()
                    == std::fs::read(reference.join(&name)).unwrap(),
                "round {round}: {name} differs after remount"
            );
        }
        m.umount();
    }
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let f = std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap();
    let t = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: both paths are NUL-terminated C strings that live to the end of the
    // function; renameat2 only reads them.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The tree under `root` without times (directories' nlink and sizes differ between
/// filesystems, so they are left out too).
fn shape(root: &Path) -> Vec<(std::path::PathBuf, String)> {
    manifest(root)
        .into_iter()
        .map(|(p, n)| {
            let s = match n {
                Node::File {
                    perm, nlink, hash, ..
                } => format!("file {perm:o} {nlink} {hash}"),
                Node::Dir { perm, .. } => format!("dir {perm:o}"),
                Node::Symlink { target, .. } => format!("symlink {}", target.display()),
                Node::Fifo { perm, .. } => format!("fifo {perm:o}"),
            };
            (p, s)
        })
        .collect()
}

/// Random namespace operations (create, write, mkdir, rmdir, unlink, rename in all three
/// modes, link, symlink), some on files still open, give the same results and the same tree in
/// a mount as on the host's disk.
#[test]
fn random_namespace_matches_reference() {
    let h = Host::new("names");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let reference = h.dir("reference");
    const PATHS: [&str; 10] = [
        "a", "b", "c", "d0", "d1", "d0/a", "d0/b", "d1/a", "d0/d1", "d0/d1/a",
    ];
    for (round, opts) in ["", "cache=kernel"].into_iter().enumerate() {
        let m = h.mount("t", &mnt, opts);
        // Open files in both trees (possibly unlinked since), read and written later.
        let mut open: Vec<(std::fs::File, std::fs::File)> = Vec::new();
        let mut succeeded = 0;
        let steps = sequence(namespace_step(PATHS.len()), 3000, 0xA11CE + round as u64);
        for (step, s) in steps.into_iter().enumerate() {
            let (p, q, seed, op) = (PATHS[s.p], PATHS[s.q], s.seed, s.op);
            let run = |root: &Path| -> std::io::Result<()> {
                let (p, q) = (root.join(p), root.join(q));
                match op {
                    NamespaceOp::CreateNew => std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&p)?
                        .write_all(&noise(seed, (seed % 20_000) as usize)),
                    NamespaceOp::Append => std::fs::OpenOptions::new()
                        .append(true)
                        .open(&p)?
                        .write_all(&noise(seed, (seed % 5000) as usize)),
                    NamespaceOp::Mkdir => std::fs::create_dir(&p),
                    NamespaceOp::Rmdir => std::fs::remove_dir(&p),
                    NamespaceOp::Unlink => std::fs::remove_file(&p),
                    NamespaceOp::Rename(RenameMode::Replace) => std::fs::rename(&p, &q),
                    NamespaceOp::Rename(RenameMode::NoReplace) => {
                        renameat2(&p, &q, libc::RENAME_NOREPLACE)
                    }
                    NamespaceOp::Rename(RenameMode::Exchange) => {
                        renameat2(&p, &q, libc::RENAME_EXCHANGE)
                    }
                    NamespaceOp::Link => std::fs::hard_link(&p, &q),
                    NamespaceOp::Symlink => {
                        std::os::unix::fs::symlink(format!("target-{}", seed % 3), &q)
                    }
                    NamespaceOp::Chmod => std::fs::set_permissions(
                        &p,
                        std::fs::Permissions::from_mode(0o600 + (seed % 0o100) as u32),
                    ),
                    NamespaceOp::Open => std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&p)
                        .map(|_| ()),
                }
            };
            let (x, y) = (run(&mnt), run(&reference));
            let ctx = format!("round {round} step {step}: {op:?} {p} -> {q}");
            match (&x, &y) {
                (Ok(()), Ok(())) => succeeded += 1,
                (Err(e), Err(f)) => assert_eq!(e.raw_os_error(), f.raw_os_error(), "{ctx}"),
                _ => panic!("{ctx}: mount {x:?}, reference {y:?}"),
            }
            if op == NamespaceOp::Open && x.is_ok() && open.len() < 8 {
                let o = |r: &Path| {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(r.join(p))
                };
                if let (Ok(a), Ok(b)) = (o(&mnt), o(&reference)) {
                    open.push((a, b));
                }
            }
            if let Some((which, close)) = s.touch_open.filter(|_| !open.is_empty()) {
                use std::os::unix::fs::FileExt;
                let k = which % open.len();
                let data = noise(seed, 3000);
                let off = seed % 30_000;
                open[k].0.write_all_at(&data, off).unwrap();
                open[k].1.write_all_at(&data, off).unwrap();
                let (mut a, mut b) = (Vec::new(), Vec::new());
                (&open[k].0).seek(SeekFrom::Start(0)).unwrap();
                (&open[k].1).seek(SeekFrom::Start(0)).unwrap();
                (&open[k].0).read_to_end(&mut a).unwrap();
                (&open[k].1).read_to_end(&mut b).unwrap();
                assert!(a == b, "{ctx}: open file {k} differs");
                if close {
                    open.swap_remove(k);
                }
            }
            if step % 250 == 249 {
                assert_eq!(shape(&mnt), shape(&reference), "{ctx}: trees differ");
            }
        }
        drop(open);
        assert!(succeeded > 300, "only {succeeded} operations succeeded");
        eprintln!("round {round}: {succeeded} of 3000 operations succeeded");
        assert_eq!(
            shape(&mnt),
            shape(&reference),
            "round {round}: trees differ"
        );
        m.umount();
        let m = h.mount("t", &mnt, "");
        assert_eq!(
            shape(&mnt),
            shape(&reference),
            "round {round}: trees differ after remount"
        );
        m.umount();
    }
}
