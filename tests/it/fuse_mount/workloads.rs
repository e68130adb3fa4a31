//! Real workloads on a mount: fio with verification, durability under kill -9 of the
//! server, clean unmounts on signals, and ext4 on a loop device over a tenant file.

use super::*;

pub(super) fn fio(cwd: &Path, args: &[&str]) {
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
    // ENOTCONN; or ECONNABORTED for a request queued before the kernel finished aborting the
    // connection (the server's io_uring is torn down after its process is gone).
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "{e}"
    );
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

pub(super) fn e2fsck_clean(dev: &str) {
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
    // The sparse file is charged its size, 8 GiB: no reserve, so a build machine with less
    // than that free above the default 5% runs it too.
    let h = Host::new("loop").with_config("[store]\nreserve = \"0\"\n");
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
