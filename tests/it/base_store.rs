//! Base images against real packs and a real encrypted host index: dedup across bases and
//! within a tree, raw images, a flipped byte in a pack, deletion and reference counts, and a
//! kill -9 in the middle of an import.

use crate::common;
use crate::common::mount::Host;

use std::path::Path;
use std::time::Duration;

use common::{noise, TestHost};
use tenantfs::base::{BaseError, BaseStore, SourceKind};
use tenantfs::store::DirectIo;

const BS: u32 = 4096;

fn no_progress(_: tenantfs::base::Progress) {}

fn store(t: &TestHost) -> BaseStore {
    BaseStore::open(&t.data, &t.host).unwrap()
}

/// A tree of `files` files of `blocks` distinct 4 KiB blocks each (seeded by `seed`).
fn tree(dir: &Path, seed: u64, files: u64, blocks: usize) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for f in 0..files {
        let name = if f % 2 == 0 {
            format!("f{f}")
        } else {
            format!("sub/f{f}")
        };
        std::fs::write(dir.join(name), noise(seed * 1000 + f, blocks * BS as usize)).unwrap();
    }
}

#[test]
fn the_same_tree_twice_stores_nothing_new() {
    let t = TestHost::new(DirectIo::Auto);
    let src = t.tmp.path().join("src");
    tree(&src, 1, 6, 5);
    let s = store(&t);
    let a = s.import("alpha", &src, BS, &mut no_progress).unwrap();
    assert_eq!(
        (a.files, a.logical_bytes, a.unique_bytes),
        (8, 30 * 4096, 30 * 4096)
    );
    let before = s.list().unwrap().host;
    assert_eq!(before.stored_bytes, 30 * 4096);
    let b = s.import("beta", &src, BS, &mut no_progress).unwrap();
    assert_eq!(b.unique_bytes, 30 * 4096);
    let after = s.list().unwrap();
    assert_eq!(
        after.host.stored_bytes, before.stored_bytes,
        "the second import stored bytes"
    );
    assert_eq!(after.host.pack_bytes, before.pack_bytes);
    assert_eq!(after.host.logical_bytes, 2 * 30 * 4096);
    let names: Vec<_> = after.bases.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert!(s.verify().unwrap().is_clean());
    let e = s.import("alpha", &src, BS, &mut no_progress).unwrap_err();
    assert!(matches!(e, BaseError::Exists(_)), "{e}");
}

#[test]
fn shared_blocks_count_once_and_holes_not_at_all() {
    let t = TestHost::new(DirectIo::Auto);
    let src = t.tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 8 blocks, all the same; a copy of that file; a file of 3 blocks with a hole between.
    let block = noise(5, BS as usize);
    let same: Vec<u8> = block
        .iter()
        .copied()
        .cycle()
        .take(8 * BS as usize)
        .collect();
    std::fs::write(src.join("a"), &same).unwrap();
    std::fs::write(src.join("b"), &same).unwrap();
    let mut holey = noise(6, 3 * BS as usize);
    holey[BS as usize..2 * BS as usize].fill(0);
    std::fs::write(src.join("c"), &holey).unwrap();
    let s = store(&t);
    let info = s.import("dup", &src, BS, &mut no_progress).unwrap();
    assert_eq!(info.logical_bytes, 19 * 4096);
    assert_eq!(
        info.unique_bytes,
        3 * 4096,
        "one shared block + two of c, the hole not stored"
    );
    assert!(info.unique_bytes < info.logical_bytes);
    assert_eq!(s.list().unwrap().host.stored_bytes, 3 * 4096);
    let h = *blake3::hash(&block).as_bytes();
    assert_eq!(s.read_block(&h).unwrap(), block);
}

/// Files whose sizes are not whole blocks, no block twice: UNIQUE is exactly LOGICAL (a last,
/// partial block counts its bytes), STORED is what the blocks take in packs: a slot each, or
/// the bytes of a short last block stored as a fragment. (UNIQUE used to count whole blocks and
/// came out above LOGICAL for a base with no duplicates at all.)
#[test]
fn unique_never_exceeds_logical_without_duplicates() {
    let t = TestHost::new(DirectIo::Auto);
    let src = t.tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let sizes = [1u64, 4095, 4097, 3 * 4096 + 100, 10_000, 123_457];
    let mut stored = 0u64;
    for (i, n) in sizes.iter().enumerate() {
        let content = noise(70 + i as u64, *n as usize);
        for block in content.chunks(BS as usize) {
            // Up to its last non-zero byte: a fragment if that is at most half a page.
            let len = block.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
            stored += if len <= 2048 { len as u64 } else { 4096 };
        }
        std::fs::write(src.join(format!("f{i}")), content).unwrap();
    }
    let s = store(&t);
    let info = s.import("odd", &src, BS, &mut no_progress).unwrap();
    let logical: u64 = sizes.iter().sum();
    assert_eq!(info.logical_bytes, logical);
    assert_eq!(info.unique_bytes, logical);
    let blocks: u64 = sizes.iter().map(|n| n.div_ceil(BS as u64)).sum();
    assert!(stored < blocks * 4096, "some last blocks are fragments");
    assert_eq!(info.stored_bytes, stored);
    let listed = &s.list().unwrap().bases[0];
    assert_eq!(
        (
            listed.logical_bytes,
            listed.unique_bytes,
            listed.stored_bytes
        ),
        (info.logical_bytes, info.unique_bytes, info.stored_bytes)
    );
}

#[test]
fn raw_image_is_one_file_of_its_blocks() {
    let t = TestHost::new(DirectIo::Auto);
    let img = t.tmp.path().join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap(); // sparse: mostly holes
    use std::os::unix::fs::FileExt;
    let data = noise(9, 10 * BS as usize);
    f.write_all_at(&data, 1 << 20).unwrap();
    f.write_all_at(&data, 40 << 20).unwrap(); // the same 10 blocks again
    drop(f);
    let s = store(&t);
    let info = s.import("img", &img, BS, &mut no_progress).unwrap();
    assert_eq!(info.kind, SourceKind::Image);
    assert_eq!((info.files, info.logical_bytes), (1, 64 << 20));
    assert_eq!(info.unique_bytes, 10 * 4096);
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn a_flipped_byte_in_a_pack_fails_that_block_only() {
    let t = TestHost::new(DirectIo::Auto);
    let src = t.tmp.path().join("src");
    tree(&src, 3, 2, 4);
    let s = store(&t);
    s.import("base", &src, BS, &mut no_progress).unwrap();
    drop(s);
    let pack = t.root.join("base/packs/pack-000001.tfp");
    let mut bytes = std::fs::read(&pack).unwrap();
    let slot = 5;
    bytes[4096 + slot * 4096 + 100] ^= 0x40;
    std::fs::write(&pack, &bytes).unwrap();
    let s = store(&t);
    let r = s.verify().unwrap();
    assert_eq!((r.blocks, r.bad.len(), r.missing), (8, 1, 0), "{r:?}");
    assert!(
        r.bad[0].contains("slot 5") && r.bad[0].contains("damaged"),
        "{r:?}"
    );
    // Every other block still reads, and the damaged one never returns bytes.
    let mut ok = 0;
    for f in 0..2u64 {
        let name = if f % 2 == 0 {
            format!("f{f}")
        } else {
            format!("sub/f{f}")
        };
        let content = std::fs::read(src.join(name)).unwrap();
        for chunk in content.chunks(BS as usize) {
            let h = *blake3::hash(chunk).as_bytes();
            match s.read_block(&h) {
                Ok(b) => {
                    assert_eq!(b, chunk);
                    ok += 1;
                }
                Err(e) => assert!(matches!(e, BaseError::BlockCorrupt { .. }), "{e}"),
            }
        }
    }
    assert_eq!(ok, 7);
}

#[test]
fn delete_releases_only_unshared_blocks() {
    let t = TestHost::new(DirectIo::Auto);
    let (a, b) = (t.tmp.path().join("a"), t.tmp.path().join("b"));
    tree(&a, 1, 2, 4); // 8 blocks
    tree(&b, 1, 1, 4); // the first 4 of them
    std::fs::write(b.join("own"), noise(77, 2 * BS as usize)).unwrap(); // + 2 of its own
    let s = store(&t);
    s.import("a", &a, BS, &mut no_progress).unwrap();
    s.import("b", &b, BS, &mut no_progress).unwrap();
    assert_eq!(s.list().unwrap().host.stored_bytes, 10 * 4096);
    let disk_before = s.list().unwrap().host.pack_bytes;
    s.delete("a").unwrap();
    let l = s.list().unwrap();
    assert_eq!(l.host.stored_bytes, 6 * 4096, "b's blocks stay");
    assert_eq!(l.host.pack_bytes, disk_before, "delete alone frees no disk");
    let gc = s.gc(&mut no_progress).unwrap();
    assert_eq!((gc.live_blocks, gc.garbage_slots), (6, 4), "{gc:?}");
    assert_eq!(gc.reclaimed_bytes, 4 * 4096, "{gc:?}");
    assert_eq!(s.list().unwrap().host.pack_bytes, disk_before - 4 * 4096);
    let again = s.gc(&mut no_progress).unwrap();
    assert_eq!(again.reclaimed_bytes, 0, "gc twice is harmless: {again:?}");
    assert_eq!(l.bases.len(), 1);
    assert!(s.verify().unwrap().is_clean());
    assert!(matches!(s.delete("a").unwrap_err(), BaseError::Unknown(_)));
    s.delete("b").unwrap();
    assert_eq!(s.list().unwrap().host.stored_bytes, 0);
    s.gc(&mut no_progress).unwrap();
    assert_eq!(
        s.list().unwrap().host.pack_bytes,
        4096,
        "only the append pack's header is left"
    );
    // The same tree again after its blocks were dropped: stored again, readable.
    s.import("a", &a, BS, &mut no_progress).unwrap();
    assert_eq!(s.list().unwrap().host.stored_bytes, 8 * 4096);
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn kill9_during_import_leaves_a_store_that_opens_and_verifies() {
    let h = Host::new("basekill");
    let src = h.root().join("big");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..24u64 {
        std::fs::write(src.join(format!("f{i}")), noise(i, 16 << 20)).unwrap();
    }
    h.ok(&[
        "base",
        "import",
        "small",
        h.root().join("big").join("f0").to_str().unwrap(),
    ]);
    let mut child = h
        .cmd()
        .args(["base", "import", "big"])
        .arg(&src)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Let it write some packs and index batches (64 MiB of its 384), then kill it mid-way.
    let packs = h.data.join("base/packs");
    let pack_bytes = || -> u64 {
        std::fs::read_dir(&packs)
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    let before = pack_bytes();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pack_bytes() < before + (64 << 20) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the import ended before writing 64 MiB"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the import makes no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the import finished too soon to test"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let list: serde_json::Value = serde_json::from_str(&h.ok(&["base", "list", "--json"])).unwrap();
    let names: Vec<_> = list["bases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].clone())
        .collect();
    assert_eq!(
        names,
        ["small"],
        "the interrupted import was rolled back: {list}"
    );
    assert_eq!(
        list["host"]["stored_bytes"].as_u64(),
        Some(16 << 20),
        "{list}"
    );
    let out = h.ok(&["base", "verify"]);
    assert!(out.contains("all intact"), "{out}");
    // The interrupted import's slots are garbage: gc gives them back, and everything still
    // verifies.
    let out = h.ok(&["base", "gc"]);
    assert!(!out.contains(" 0 garbage slots"), "{out}");
    assert!(h.ok(&["base", "verify"]).contains("all intact"));
    // And it can be imported again.
    h.ok(&["base", "import", "big", src.to_str().unwrap()]);
    let list: serde_json::Value = serde_json::from_str(&h.ok(&["base", "list", "--json"])).unwrap();
    assert_eq!(
        list["host"]["stored_bytes"].as_u64(),
        Some(24 << 24),
        "{list}"
    );
}

#[test]
fn a_tenant_whose_graft_was_interrupted_refuses_to_open() {
    use tenantfs::store::Family;
    use tenantfs::volume::{Volume, VolumeError};
    let t = TestHost::new(DirectIo::Auto);
    let src = t.tmp.path().join("src");
    tree(&src, 4, 2, 2);
    let s = store(&t);
    s.import("b", &src, BS, &mut no_progress).unwrap();
    s.create_tenant(&t.data, &t.host, "ok", "b").unwrap();
    let v = Volume::open(tenantfs::tenants::open(&t.data, &t.host, "ok").unwrap()).unwrap();
    assert_eq!(
        v.readdir(tenantfs::volume::ROOT_INO).unwrap().len(),
        2,
        "f0 and sub"
    );
    drop(v);
    // What a crash between the graft's first and last batch leaves: the marker.
    let tenant = tenantfs::tenants::open(&t.data, &t.host, "ok").unwrap();
    tenant.db().put(Family::Meta, b"grafting", b"b").unwrap();
    let e = Volume::open(tenant).err().unwrap();
    assert!(matches!(e, VolumeError::Incomplete { .. }), "{e}");
    assert!(
        e.to_string().contains("delete it and create it again"),
        "{e}"
    );
    // Unknown base: nothing is created.
    let e = s
        .create_tenant(&t.data, &t.host, "nope", "missing")
        .unwrap_err();
    assert!(matches!(e, BaseError::Unknown(_)), "{e}");
    assert!(tenantfs::tenants::list(&t.root)
        .unwrap()
        .iter()
        .all(|i| i.name != "nope"));
}

/// Tenants from a base are copies of its template: built once, at the first tenant, and
/// shared (each tenant's ring holds its key, marked as its base's, so a shred of one names no
/// other tenant of the base as a holder). A damaged template record is refused by name and
/// path; deleting it makes the next create build it again. A base deleted and imported again
/// under its name gets a new template: its tenants hold the new tree.
#[test]
fn tenants_start_as_copies_of_one_template_built_once() {
    use tenantfs::volume::{Volume, ROOT_INO};
    let t = TestHost::new(DirectIo::Auto);
    let (one, two) = (t.tmp.path().join("one"), t.tmp.path().join("two"));
    tree(&one, 5, 3, 1);
    tree(&two, 6, 5, 1);
    let s = store(&t);
    s.import("b", &one, BS, &mut no_progress).unwrap();
    let template = t.root.join("base/templates/b");
    assert!(
        !template.exists(),
        "built at the first tenant, not at the import"
    );
    s.create_tenant(&t.data, &t.host, "t1", "b").unwrap();
    let record = std::fs::read(template.join("template.json")).unwrap();
    s.create_tenant(&t.data, &t.host, "t2", "b").unwrap();
    assert_eq!(
        std::fs::read(template.join("template.json")).unwrap(),
        record,
        "the second tenant built the template again"
    );
    let names = |tenant: &str| -> Vec<Vec<u8>> {
        let open = tenantfs::tenants::open(&t.data, &t.host, tenant).unwrap();
        let mut names: Vec<_> = Volume::open(open)
            .unwrap()
            .readdir(ROOT_INO)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names("t1"),
        [b"f0".to_vec(), b"f2".to_vec(), b"sub".to_vec()]
    );
    assert_eq!(names("t2"), names("t1"));
    let holders = tenantfs::tenants::delete_shredded(&t.data, "t2").unwrap();
    assert!(
        holders.is_empty(),
        "t1 holds only the base's key: {holders:?}"
    );

    std::fs::write(template.join("template.json"), b"{").unwrap();
    let e = s.create_tenant(&t.data, &t.host, "t3", "b").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("the template of base b") && text.contains("delete that directory"),
        "{text}"
    );
    assert!(
        tenantfs::tenants::info(&t.root, "t3").is_err(),
        "a tenant was made"
    );
    std::fs::remove_dir_all(&template).unwrap();
    s.create_tenant(&t.data, &t.host, "t3", "b").unwrap();
    assert_eq!(names("t3"), names("t1"));

    for name in ["t1", "t3"] {
        tenantfs::tenants::delete(&t.data, name).unwrap();
    }
    s.delete("b").unwrap();
    assert!(!template.exists(), "the template outlived its base");
    s.import("b", &two, BS, &mut no_progress).unwrap();
    s.create_tenant(&t.data, &t.host, "t4", "b").unwrap();
    let want: Vec<Vec<u8>> = [
        b"f0".to_vec(),
        b"f2".to_vec(),
        b"f4".to_vec(),
        b"sub".to_vec(),
    ]
    .into();
    assert_eq!(names("t4"), want);
}
