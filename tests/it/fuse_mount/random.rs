//! Long seeded runs of data and namespace operations, applied to a mount and to a
//! reference directory on the host's disk alike, compared step by step.

use super::*;

pub(super) fn fallocate(
    f: &std::fs::File,
    mode: i32,
    offset: u64,
    len: u64,
) -> std::io::Result<()> {
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

pub(super) fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
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
pub(super) fn shape(root: &Path) -> Vec<(std::path::PathBuf, String)> {
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
