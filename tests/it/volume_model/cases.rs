//! Hand-written cases for the trickier semantics, and format versioning.

use super::*;

pub(super) fn errno<T: Debug>(r: Result<T, tenantfs::volume::VolumeError>) -> i32 {
    r.expect_err("should have failed").errno()
}

pub(super) fn names(vol: &Volume, dir: u64) -> Vec<Vec<u8>> {
    vol.readdir(dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

#[test]
fn unlinked_file_stays_usable_until_forget() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "orphan");
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    let data = noise(1, 10_000);
    vol.write(f.ino, 0, &data).unwrap();
    vol.setxattr(f.ino, b"user.k", b"v", XattrMode::Any)
        .unwrap();
    vol.unlink(ROOT_INO, b"f").unwrap();

    assert_eq!(errno(vol.lookup(ROOT_INO, b"f")), libc::ENOENT);
    assert!(vol.readdir(ROOT_INO).unwrap().is_empty());
    let attr = vol.getattr(f.ino).unwrap();
    assert_eq!((attr.nlink, attr.size), (0, 10_000));
    // Still open: readable, writable, with its xattrs; but it cannot be linked back.
    assert_eq!(vol.read(f.ino, 0, 20_000).unwrap(), data);
    vol.write(f.ino, 10_000, b"tail").unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().size, 10_004);
    assert_eq!(vol.getxattr(f.ino, b"user.k").unwrap(), b"v");
    assert_eq!(errno(vol.link(f.ino, ROOT_INO, b"g")), libc::ENOENT);

    vol.forget(f.ino).unwrap();
    assert_eq!(errno(vol.getattr(f.ino)), libc::ENOENT);
    assert_eq!(errno(vol.read(f.ino, 0, 10)), libc::ENOENT);
    assert_eq!(errno(vol.write(f.ino, 0, b"x")), libc::ENOENT);
    assert_eq!(errno(vol.getxattr(f.ino, b"user.k")), libc::ENOENT);
    assert_eq!(errno(vol.listxattr(f.ino)), libc::ENOENT);
    vol.forget(f.ino).unwrap(); // twice is harmless
}

#[test]
fn forget_keeps_inodes_that_still_have_links() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "linked");
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    vol.write(f.ino, 0, b"hello").unwrap();
    assert_eq!(vol.link(f.ino, ROOT_INO, b"g").unwrap().nlink, 2);
    vol.unlink(ROOT_INO, b"f").unwrap();
    vol.forget(f.ino).unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(vol.read(f.ino, 0, 10).unwrap(), b"hello");
    vol.forget(ROOT_INO).unwrap();
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 2);
    // The last link goes: now forget frees it.
    vol.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(vol.read(f.ino, 0, 10).unwrap(), b"hello");
    vol.forget(f.ino).unwrap();
    assert_eq!(errno(vol.getattr(f.ino)), libc::ENOENT);
}

#[test]
fn orphans_are_purged_at_reopen() {
    let t = TestHost::new(DirectIo::Auto);
    let mut orphans = Vec::new();
    {
        let vol = open_volume(&t, "purge");
        let keeper = vol
            .mknod(ROOT_INO, b"keeper", FileKind::File, 0o644, OWNER, 0)
            .unwrap();
        vol.write(keeper.ino, 0, b"kept").unwrap();
        // Unlinked while open.
        let f = vol
            .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
            .unwrap();
        vol.write(f.ino, 0, &noise(2, 9000)).unwrap();
        vol.setxattr(f.ino, b"user.k", b"v", XattrMode::Any)
            .unwrap();
        vol.unlink(ROOT_INO, b"f").unwrap();
        // Removed while open.
        let d = vol.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
        vol.setxattr(d.ino, b"user.k", b"v", XattrMode::Any)
            .unwrap();
        vol.rmdir(ROOT_INO, b"d").unwrap();
        // Replaced by a rename while open.
        let v = vol
            .mknod(ROOT_INO, b"v", FileKind::File, 0o644, OWNER, 0)
            .unwrap();
        vol.write(v.ino, 5000, b"victim").unwrap();
        vol.rename(ROOT_INO, b"keeper", ROOT_INO, b"v", RenameMode::Replace)
            .unwrap();
        assert_eq!(vol.getattr(v.ino).unwrap().nlink, 0);
        assert_eq!(vol.read(v.ino, 5000, 10).unwrap(), b"victim");
        orphans.extend([f.ino, d.ino, v.ino]);
    }
    let vol = open_volume(&t, "purge");
    for &o in &orphans {
        assert_eq!(errno(vol.getattr(o)), libc::ENOENT, "orphan {o}");
        assert_eq!(errno(vol.read(o, 0, 10)), libc::ENOENT, "orphan {o}");
        vol.forget(o).unwrap();
    }
    assert_eq!(names(&vol, ROOT_INO), vec![b"v".to_vec()]);
    let kept = vol.lookup(ROOT_INO, b"v").unwrap();
    assert_eq!(vol.read(kept.ino, 0, 10).unwrap(), b"kept");
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 2);
    // Numbers of purged inodes may be handed out again: nothing of the old inode shows.
    let max = *orphans.iter().max().unwrap();
    for i in 0..=orphans.len() {
        let name = format!("new{i}");
        let n = if i % 2 == 0 {
            vol.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, OWNER, 0)
                .unwrap()
        } else {
            vol.mkdir(ROOT_INO, name.as_bytes(), 0o755, OWNER).unwrap()
        };
        assert_eq!(n.size, 0);
        assert!(vol.listxattr(n.ino).unwrap().is_empty(), "ino {}", n.ino);
        if n.kind == FileKind::File {
            vol.setattr(
                n.ino,
                &SetAttr {
                    size: Some(20_000),
                    ..SetAttr::default()
                },
            )
            .unwrap();
            assert!(vol.read(n.ino, 0, 20_000).unwrap().iter().all(|&b| b == 0));
        } else {
            assert!(vol.readdir(n.ino).unwrap().is_empty());
        }
        if n.ino > max {
            break;
        }
    }
}

#[test]
fn removed_directory_takes_no_new_entries() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "deaddir");
    let d = vol.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    vol.rmdir(ROOT_INO, b"d").unwrap();
    assert_eq!(vol.getattr(d.ino).unwrap().nlink, 0);
    assert_eq!(
        errno(vol.mknod(d.ino, b"x", FileKind::File, 0o644, OWNER, 0)),
        libc::ENOENT
    );
    assert_eq!(errno(vol.mkdir(d.ino, b"x", 0o755, OWNER)), libc::ENOENT);
    assert_eq!(errno(vol.symlink(d.ino, b"x", b"t", OWNER)), libc::ENOENT);
    assert_eq!(errno(vol.link(f.ino, d.ino, b"x")), libc::ENOENT);
    for mode in [RenameMode::Replace, RenameMode::NoReplace] {
        assert_eq!(
            errno(vol.rename(ROOT_INO, b"f", d.ino, b"x", mode)),
            libc::ENOENT
        );
    }
    assert!(vol.readdir(d.ino).unwrap().is_empty());
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(names(&vol, ROOT_INO), vec![b"f".to_vec()]);
    vol.forget(d.ino).unwrap();
    assert_eq!(errno(vol.getattr(d.ino)), libc::ENOENT);
    assert_eq!(errno(vol.readdir(d.ino)), libc::ENOENT);
}

#[test]
fn empty_writes_and_reads() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "empty");
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    // A zero-length write past the end writes nothing and leaves the size alone.
    assert_eq!(vol.write(f.ino, 5000, b"").unwrap(), 0);
    assert_eq!(vol.getattr(f.ino).unwrap().size, 0);
    vol.write(f.ino, 100, &noise(3, 3 * BS as usize)).unwrap();
    assert_eq!(vol.write(f.ino, 50_000, b"").unwrap(), 0);
    assert_eq!(vol.getattr(f.ino).unwrap().size, 100 + 3 * BS);
    // Zero-length reads anywhere, including offset 0 of a multi-block file.
    for off in [0, 1, BS - 1, BS, BS + 1, 3 * BS, 100 + 3 * BS, 60_000] {
        assert!(
            vol.read(f.ino, off, 0).unwrap().is_empty(),
            "read({off}, 0)"
        );
    }
    // Zero-length fallocate is EINVAL, as fallocate(2) says.
    assert_eq!(
        errno(vol.fallocate(f.ino, 0, 0, Fallocate::PunchHole)),
        libc::EINVAL
    );
}

#[test]
fn rename_and_link_errors_follow_linux() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "rename");
    let a = vol.mkdir(ROOT_INO, b"a", 0o755, OWNER).unwrap();
    let b = vol.mkdir(a.ino, b"b", 0o755, OWNER).unwrap();
    let f = vol
        .mknod(a.ino, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    let e = vol.mkdir(ROOT_INO, b"e", 0o755, OWNER).unwrap();
    let g = vol
        .mknod(ROOT_INO, b"g", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    use RenameMode::*;
    // Into its own subtree, either way round.
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"a", b.ino, b"x", Replace)),
        libc::EINVAL
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"a", a.ino, b"x", Replace)),
        libc::EINVAL
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"a", b.ino, b"x", NoReplace)),
        libc::EINVAL
    );
    // Over an ancestor: ENOTEMPTY, whatever the source is (EINVAL for exchange).
    for name in [&b"f"[..], b"b"] {
        for mode in [Replace, NoReplace, Exchange] {
            let want = match mode {
                Replace => libc::ENOTEMPTY,
                NoReplace => libc::EEXIST,
                Exchange => libc::EINVAL,
            };
            assert_eq!(
                errno(vol.rename(a.ino, name, ROOT_INO, b"a", mode)),
                want,
                "{name:?} {mode:?}"
            );
        }
    }
    // Type mismatches and non-empty targets.
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"g", ROOT_INO, b"e", Replace)),
        libc::EISDIR
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"e", ROOT_INO, b"g", Replace)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"e", ROOT_INO, b"a", Replace)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"x", ROOT_INO, b"g", Exchange)),
        libc::ENOENT
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"g", ROOT_INO, b"x", Exchange)),
        libc::ENOENT
    );
    // Two names of one inode: rename does nothing, except NoReplace which sees a target.
    vol.link(g.ino, a.ino, b"g2").unwrap();
    for mode in [Replace, Exchange] {
        vol.rename(ROOT_INO, b"g", a.ino, b"g2", mode).unwrap();
    }
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"g", a.ino, b"g2", NoReplace)),
        libc::EEXIST
    );
    assert_eq!(vol.getattr(g.ino).unwrap().nlink, 2);
    assert_eq!(vol.lookup(ROOT_INO, b"g").unwrap().ino, g.ino);
    assert_eq!(vol.lookup(a.ino, b"g2").unwrap().ino, g.ino);
    // Links: an existing name first, then a directory source.
    assert_eq!(errno(vol.link(b.ino, a.ino, b"f")), libc::EEXIST);
    assert_eq!(errno(vol.link(b.ino, ROOT_INO, b"new")), libc::EPERM);
    // A directory over an empty one, across parents: the link counts follow.
    vol.rename(a.ino, b"b", ROOT_INO, b"e", Replace).unwrap();
    assert_eq!(vol.getattr(e.ino).unwrap().nlink, 0);
    assert_eq!(vol.getattr(b.ino).unwrap().parent, ROOT_INO);
    assert_eq!(vol.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 4); // a, e (now b), + 2
                                                         // Exchange a directory and a file across parents.
    vol.rename(ROOT_INO, b"e", a.ino, b"f", Exchange).unwrap();
    assert_eq!(vol.getattr(b.ino).unwrap().parent, a.ino);
    assert_eq!(vol.getattr(a.ino).unwrap().nlink, 3);
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(vol.lookup(ROOT_INO, b"e").unwrap().ino, f.ino);
}

/// A store written in the old data format (a leading tag byte on every extent value) is
/// refused with a message that names the tenant, the format and what to do, and left as is.
#[test]
fn a_store_of_the_old_data_format_is_refused() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "old");
    let a = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    vol.write(a.ino, 0, &noise(1, 3 * BS as usize)).unwrap();
    drop(vol);
    let old_meta = {
        let tenant = tenants::open(&t.data, &t.host, "old").unwrap();
        let mut meta = 1u32.to_be_bytes().to_vec();
        meta.extend_from_slice(&(BS as u32).to_be_bytes());
        tenant
            .db()
            .put(tenantfs::store::Family::Meta, b"volume", &meta)
            .unwrap();
        meta
    };
    let err = Volume::open(tenants::open(&t.data, &t.host, "old").unwrap())
        .err()
        .expect("an old-format store opened");
    assert!(
        matches!(err, tenantfs::volume::VolumeError::Format { found: 1, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    for part in [
        "tenant old",
        "data format 1",
        "reads formats 2 to 5",
        "copy the files out",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg:?}");
    }
    // Refused, not changed: the record is still the old one.
    let tenant = tenants::open(&t.data, &t.host, "old").unwrap();
    assert_eq!(
        tenant
            .db()
            .get(tenantfs::store::Family::Meta, b"volume")
            .unwrap()
            .unwrap(),
        old_meta
    );
}

/// Extent keys of `name`'s store: (block keys, chunk keys).
pub(super) fn extent_key_counts(vol: &Volume) -> (usize, usize) {
    let (mut blocks, mut chunks) = (0, 0);
    vol.tenant()
        .db()
        .keys(tenantfs::store::Family::Extents, &[], &[0xff; 17], |k| {
            match k.len() {
                16 => blocks += 1,
                17 => chunks += 1,
                n => panic!("an extent key of {n} bytes"),
            }
            true
        })
        .unwrap();
    (blocks, chunks)
}

/// Whole aligned 64 KiB runs are stored as one chunk value each; smaller writes into them
/// (which go over them, then are folded into them), holes punched into them, a block of zeros
/// written into them and truncation through them read back exactly, and lseek finds the holes
/// exactly, before and after a reopen.
#[test]
fn chunks_take_writes_holes_and_truncation() {
    const CHUNK: u64 = 16 * BS;
    let t = TestHost::new(DirectIo::Auto);
    let mut vol = open_volume(&t, "chunks");
    let ino = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap()
        .ino;
    let mut model = noise(7, 16 * CHUNK as usize);
    vol.write(ino, 0, &model).unwrap();
    assert_eq!(extent_key_counts(&vol), (0, 16), "1 MiB in 16 chunk values");
    let check = |vol: &Volume, model: &[u8], what: &str| {
        let got = vol.read(ino, 0, model.len() as u32 + 10).unwrap();
        assert!(got == model, "{what}: contents differ from the model");
        for at in [0, BS + 3, CHUNK - 1, 5 * CHUNK + 100] {
            let got = vol.read(ino, at, 6000).unwrap();
            let want =
                &model[(at as usize).min(model.len())..(at as usize + 6000).min(model.len())];
            assert!(got == want, "{what}: 6000 bytes at {at} differ");
        }
    };
    let write = |vol: &Volume, model: &mut Vec<u8>, at: u64, data: &[u8]| {
        vol.write(ino, at, data).unwrap();
        let end = at as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[at as usize..end].copy_from_slice(data);
    };
    // A block over a chunk, part of a block over a chunk (read, patch, write).
    write(&vol, &mut model, 2 * BS, &noise(8, BS as usize));
    write(&vol, &mut model, CHUNK + 1000, &noise(9, 100));
    check(&vol, &model, "blocks written into chunks");
    assert_eq!(
        extent_key_counts(&vol),
        (2, 16),
        "the blocks go over the chunks until they are folded"
    );
    vol.fold_now();
    check(&vol, &model, "blocks written into chunks, folded");
    assert_eq!(
        extent_key_counts(&vol),
        (0, 16),
        "the blocks over the two chunks are merged into them"
    );
    // A block of zeros in chunk 2: a hole, found by SEEK_HOLE exactly.
    write(&vol, &mut model, 2 * CHUNK + 3 * BS, &vec![0; BS as usize]);
    check(&vol, &model, "zero block");
    assert_eq!(vol.seek_hole(ino, 2 * CHUNK).unwrap(), 2 * CHUNK + 3 * BS);
    assert_eq!(
        vol.seek_data(ino, 2 * CHUNK + 3 * BS).unwrap(),
        2 * CHUNK + 4 * BS
    );
    // A hole punched inside chunk 3 and across chunks 5 and 6 (whole), zeroes inside chunk 7.
    vol.fallocate(ino, 3 * CHUNK + BS, 2 * BS, Fallocate::PunchHole)
        .unwrap();
    model[(3 * CHUNK + BS) as usize..(3 * CHUNK + 3 * BS) as usize].fill(0);
    vol.fallocate(ino, 5 * CHUNK, 2 * CHUNK, Fallocate::PunchHole)
        .unwrap();
    model[(5 * CHUNK) as usize..(7 * CHUNK) as usize].fill(0);
    vol.fallocate(
        ino,
        7 * CHUNK + 10,
        300,
        Fallocate::ZeroRange { keep_size: true },
    )
    .unwrap();
    model[(7 * CHUNK + 10) as usize..(7 * CHUNK + 310) as usize].fill(0);
    check(&vol, &model, "holes");
    assert_eq!(vol.seek_hole(ino, 3 * CHUNK).unwrap(), 3 * CHUNK + BS);
    assert_eq!(
        vol.seek_data(ino, 3 * CHUNK + BS).unwrap(),
        3 * CHUNK + 3 * BS
    );
    assert_eq!(vol.seek_hole(ino, 4 * CHUNK).unwrap(), 5 * CHUNK);
    assert_eq!(vol.seek_data(ino, 5 * CHUNK).unwrap(), 7 * CHUNK);
    // A chunk rewritten whole drops the blocks that overlaid it.
    write(&vol, &mut model, 0, &noise(10, CHUNK as usize));
    write(&vol, &mut model, CHUNK, &noise(11, 2 * CHUNK as usize));
    check(&vol, &model, "chunks rewritten");
    // Truncation mid-chunk, then growth: the cut-off bytes read as zeros.
    let cut = 9 * CHUNK + 5000;
    vol.setattr(
        ino,
        &SetAttr {
            size: Some(cut),
            ..Default::default()
        },
    )
    .unwrap();
    model.truncate(cut as usize);
    write(&vol, &mut model, 12 * CHUNK, &noise(12, 100));
    check(&vol, &model, "truncated and grown");
    assert_eq!(vol.seek_hole(ino, 9 * CHUNK).unwrap(), 9 * CHUNK + 2 * BS);
    drop(vol);
    vol = open_volume(&t, "chunks");
    check(&vol, &model, "after reopen");
    // (Chunk 2's hole was written over whole.)
    assert_eq!(vol.seek_hole(ino, 2 * CHUNK).unwrap(), 3 * CHUNK + BS);
    assert_eq!(vol.seek_hole(ino, 9 * CHUNK).unwrap(), 9 * CHUNK + 2 * BS);
}

/// A store of data format 2 (block keys only) is taken over: its files read as before and its
/// version becomes the current one, so an older tenantfs will not open it. Formats 3 and 4
/// (chunk values with one checksum) read as they are. A newer format is refused.
#[test]
fn a_store_of_format_2_is_migrated_and_a_newer_one_refused() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "two");
    let a = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    let data = noise(3, 3 * BS as usize + 17);
    for (i, piece) in data.chunks(BS as usize).enumerate() {
        vol.write(a.ino, i as u64 * BS, piece).unwrap();
    }
    drop(vol);
    let set_format = |format: u32| {
        let tenant = tenants::open(&t.data, &t.host, "two").unwrap();
        let mut meta = format.to_be_bytes().to_vec();
        meta.extend_from_slice(&(BS as u32).to_be_bytes());
        tenant
            .db()
            .put(tenantfs::store::Family::Meta, b"volume", &meta)
            .unwrap();
    };
    let format = || {
        let tenant = tenants::open(&t.data, &t.host, "two").unwrap();
        let v = tenant
            .db()
            .get(tenantfs::store::Family::Meta, b"volume")
            .unwrap()
            .unwrap();
        u32::from_be_bytes(v[..4].try_into().unwrap())
    };
    set_format(2);
    let vol = open_volume(&t, "two");
    assert!(vol.read(a.ino, 0, 1 << 20).unwrap() == data);
    drop(vol);
    assert_eq!(format(), 5, "the version was not moved on");
    // Format 3 (no extent files) reads as it is, too.
    set_format(3);
    let vol = open_volume(&t, "two");
    assert!(vol.read(a.ino, 0, 1 << 20).unwrap() == data);
    drop(vol);
    assert_eq!(format(), 5, "the version was not moved on from 3");
    // Format 4 (chunk values with one checksum) reads as it is.
    set_format(4);
    let vol = open_volume(&t, "two");
    assert!(vol.read(a.ino, 0, 1 << 20).unwrap() == data);
    drop(vol);
    assert_eq!(format(), 5, "the version was not moved on from 4");
    set_format(6);
    let err = Volume::open(tenants::open(&t.data, &t.host, "two").unwrap())
        .err()
        .expect("a newer-format store opened");
    let msg = err.to_string();
    for part in [
        "tenant two",
        "data format 6",
        "newer tenantfs",
        "reads formats 2 to 5",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg:?}");
    }
    assert_eq!(format(), 6, "a refused store was changed");
}
