//! Tenants created from a base image, through real mounts: each gets the whole tree at once,
//! changes stay private to the tenant (copy on write), a raw ext4 image base can be
//! loop-mounted, changed and fsck'd in a tenant while the base stays byte-identical, a damaged
//! base block is EIO (never wrong data) with a log line naming it, and a base in use cannot be
//! deleted.

use crate::common;
use crate::common::guards::{FsMount, LoopDev};
use crate::common::mount::Host;
use crate::common::process::{check, output};
use crate::common::trees::{assert_same_tree, hash_file, manifest};

use std::path::Path;
use std::process::Command;

use common::noise;

/// A small real tree: this crate's sources, a multi-block file, a file of one repeated block,
/// a symlink, a sparse file, odd modes.
fn make_source(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    check(
        Command::new("cp")
            .args(["-a", concat!(env!("CARGO_MANIFEST_DIR"), "/src")])
            .arg(dir),
    );
    std::fs::write(dir.join("big.bin"), noise(3, (3 << 20) + 123)).unwrap();
    // One block 16 times (stored once; one read fetches it once for all 16).
    std::fs::write(dir.join("repeat.bin"), noise(5, 4096).repeat(16)).unwrap();
    std::os::unix::fs::symlink("src/lib.rs", dir.join("link")).unwrap();
    let f = std::fs::File::create(dir.join("sparse")).unwrap();
    f.set_len(8 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"end", (8 << 20) - 3).unwrap();
    std::fs::set_permissions(
        dir.join("big.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
}

#[test]
fn tenants_from_one_base_share_it_and_keep_changes_private() {
    let h = Host::new("basetenants");
    let src = h.root().join("source");
    make_source(&src);
    let want = manifest(&src);
    h.ok(&["base", "import", "os", src.to_str().unwrap()]);
    let out = h.ok(&["tenant", "create", "a", "--base", "os"]);
    assert!(out.contains("no data copied"), "{out}");
    h.ok(&["tenant", "create", "b", "--base", "os"]);
    // Each starts as a copy of the base's template: its table files linked (the template
    // and two tenants), a few KiB of its own (MANIFEST, CURRENT, IDENTITY, its record).
    let template = h.data.join("base/templates/os/db");
    let tables: Vec<_> = std::fs::read_dir(&template)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sst"))
        .collect();
    assert!(
        !tables.is_empty(),
        "the template holds the tree in table files"
    );
    for t in &tables {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(t).unwrap().nlink(), 3, "{}", t.display());
    }
    for t in ["a", "b"] {
        let own = common::own_bytes(&h.data.join("tenants").join(t));
        assert!(own <= 64 << 10, "tenant {t} holds {own} bytes of its own");
    }
    let (ma, mb) = (h.dir("ma"), h.dir("mb"));
    let a = h.mount("a", &ma, "");
    let b = h.mount("b", &mb, "");
    assert_same_tree(&want, &manifest(&ma), "tenant a from base");
    assert_same_tree(&want, &manifest(&mb), "tenant b from base");
    // Changes in a: partial overwrite of a base block, append, truncate, new file, delete.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(a.join("big.bin"))
            .unwrap();
        f.write_all_at(b"tenant a was here", 4096 * 100 + 17)
            .unwrap();
    }
    std::fs::write(a.join("src/lib.rs"), b"// replaced\n").unwrap();
    std::fs::remove_file(a.join("link")).unwrap();
    std::fs::rename(a.join("src/store"), a.join("store-moved")).unwrap();
    std::fs::write(a.join("new"), b"only in a").unwrap();
    let after_a = manifest(&ma);
    assert_ne!(after_a, want);
    // b and the base did not change.
    assert_same_tree(&want, &manifest(&mb), "tenant b after a changed");
    h.ok(&["tenant", "create", "c", "--base", "os"]);
    let mc = h.dir("mc");
    let c = h.mount("c", &mc, "");
    assert_same_tree(
        &want,
        &manifest(&mc),
        "a new tenant from the base after a changed",
    );
    // a keeps its changes across a remount.
    a.umount();
    let a = h.mount("a", &ma, "");
    assert_eq!(manifest(&ma), after_a);
    let big = std::fs::read(a.join("big.bin")).unwrap();
    assert_eq!(&big[4096 * 100 + 17..4096 * 100 + 34], b"tenant a was here");
    assert_eq!(
        &big[..4096 * 100],
        &std::fs::read(src.join("big.bin")).unwrap()[..4096 * 100]
    );
    // The base is in use: delete is refused, naming the tenants; list shows them.
    let err = h.fails(&["base", "delete", "os"]);
    assert!(err.contains("used by tenant(s) a, b, c"), "{err}");
    let list: serde_json::Value = serde_json::from_str(&h.ok(&["base", "list", "--json"])).unwrap();
    assert_eq!(
        list["bases"][0]["tenants"],
        serde_json::json!(["a", "b", "c"]),
        "{list}"
    );
    assert!(h.ok(&["base", "verify"]).contains("all intact"));
    // Deleting a tenant frees nothing of the base: its blocks are still the base's and b's.
    drop(a);
    h.ok(&["tenant", "delete", "a"]);
    let gc = h.ok(&["base", "gc"]);
    assert!(gc.contains(" 0 garbage slots"), "{gc}");
    assert_same_tree(
        &want,
        &manifest(&mb),
        "tenant b after a was deleted and gc ran",
    );
    drop((b, c));
    for t in ["b", "c"] {
        h.ok(&["tenant", "delete", t]);
    }
    h.ok(&["base", "delete", "os"]);
    assert!(
        !h.data.join("base/templates/os").exists(),
        "the template outlived its base"
    );
    // Now nothing holds the blocks: gc gives the disk space back.
    let stored = |h: &Host| -> u64 {
        let l: serde_json::Value =
            serde_json::from_str(&h.ok(&["base", "list", "--json"])).unwrap();
        l["host"]["pack_bytes"].as_u64().unwrap()
    };
    let before = stored(&h);
    let gc = h.ok(&["base", "gc"]);
    assert!(before - stored(&h) >= 3 << 20, "gc freed too little: {gc}");
    let err = h.fails(&["tenant", "create", "d", "--base", "os"]);
    assert!(err.contains("no base named os"), "{err}");
}

#[test]
fn raw_ext4_image_base_is_loop_mounted_changed_and_fscked_in_a_tenant() {
    let h = Host::new("baseimg");
    let img = h.root().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    check(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    {
        let lo = LoopDev::attach(&img);
        let fsdir = h.dir("fs");
        let fs = FsMount::mount(&[&lo.dev], &fsdir);
        std::fs::write(fsdir.join("hello"), noise(1, 1 << 20)).unwrap();
        fs.umount();
        lo.detach();
    }
    let base_hash = hash_file(&img);
    h.ok(&["base", "import", "disk", img.to_str().unwrap()]);
    h.ok(&["tenant", "create", "vm", "--base", "disk"]);
    let mp = h.dir("mp");
    let m = h.mount("vm", &mp, "");
    let copy = m.join("disk.img");
    assert_eq!(
        hash_file(&copy),
        base_hash,
        "the tenant's image is the base's"
    );
    let lo = LoopDev::attach(&copy);
    let fsdir = h.dir("fs2");
    let fs = FsMount::mount(&[&lo.dev], &fsdir);
    assert_eq!(
        std::fs::read(fsdir.join("hello")).unwrap(),
        noise(1, 1 << 20)
    );
    std::fs::write(fsdir.join("written-in-tenant"), noise(2, 3 << 20)).unwrap();
    fs.umount();
    let fsck = output(Command::new("e2fsck").args(["-fn", &lo.dev]));
    assert!(
        fsck.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    lo.detach();
    assert_ne!(hash_file(&copy), base_hash, "the tenant's copy changed");
    m.umount();
    // The base is byte-identical: a new tenant from it sees the original image.
    h.ok(&["tenant", "create", "vm2", "--base", "disk"]);
    let mp2 = h.dir("mp2");
    let m2 = h.mount("vm2", &mp2, "");
    assert_eq!(hash_file(&m2.join("disk.img")), base_hash);
    assert!(h.ok(&["base", "verify"]).contains("all intact"));
}

#[test]
fn a_damaged_base_block_is_eio_with_a_log_line() {
    let h = Host::new("basebad");
    let src = h.root().join("source");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), noise(4, 8 * 4096)).unwrap();
    h.ok(&["base", "import", "b", src.to_str().unwrap()]);
    h.ok(&["tenant", "create", "t", "--base", "b"]);
    // Flip a byte in slot 2 (the file's third block).
    let pack = h.data.join("base/packs/pack-000001.tfp");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[4096 + 2 * 4096 + 7] ^= 1;
    std::fs::write(&pack, &bytes).unwrap();
    let mp = h.dir("mp");
    let m = h.mount("t", &mp, "");
    let f = std::fs::File::open(m.join("f")).unwrap();
    let mut buf = vec![0u8; 4096];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, noise(4, 8 * 4096)[..4096]);
    let e = f.read_exact_at(&mut buf, 2 * 4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let hash = hex::encode(blake3::hash(&noise(4, 8 * 4096)[2 * 4096..3 * 4096]).as_bytes());
    drop(f);
    m.umount();
    let log = std::fs::read_to_string(h.data.join("tenants/t/mount.log")).unwrap();
    assert!(
        log.contains(&hash) && log.contains("damaged"),
        "no log line naming {hash}: {log}"
    );
    let err = h.fails(&["base", "verify"]);
    assert!(err.contains(&hash), "{err}");
}
