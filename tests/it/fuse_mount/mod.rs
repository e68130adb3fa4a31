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

mod at_rest;
mod kernel_rules;
mod posix;
mod random;
mod workloads;

pub(super) const MIB: usize = 1 << 20;

pub(super) fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with what real trees have: this crate's sources, deep dirs, many small files, a few
/// multi-MiB files, a sparse file, symlinks (relative, absolute, dangling, to dirs), a hard
/// link, a fifo, odd names and modes, user xattrs.
pub(super) fn make_tree(dir: &Path) {
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

pub(super) fn git(repo: &Path, args: &[&str]) -> String {
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
