//! Tests of a tenant's store checkpointed (`TenantDb::checkpoint`) and opened in the place of
//! the tenant's store: the volume it holds is the one at the checkpoint, and the two stores
//! go their own ways afterwards while sharing the files neither changes.

use std::os::unix::fs::MetadataExt;

use super::extent_gc::{collect_extent_files, Occasion};
use super::{FileKind, Owner, TestStore, Volume, ROOT_INO};

fn file(vol: &Volume, name: &[u8]) -> u64 {
    let owner = Owner { uid: 0, gid: 0 };
    vol.mknod(ROOT_INO, name, FileKind::File, 0o644, owner, 0)
        .unwrap()
        .ino
}

fn read_all(vol: &Volume, name: &[u8]) -> Option<Vec<u8>> {
    let attr = vol.lookup(ROOT_INO, name).ok()?;
    Some(vol.read(attr.ino, 0, attr.size as u32).unwrap())
}

/// Bytes of `len` from `seed`, different for each seed.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed | 1).collect()
}

/// A checkpoint taken of a volume with small files and bulk data (extent files) holds what
/// was written before it; the volume then rewrites its bulk data, deletes a file, makes
/// another and collects its extent files, and neither side sees the other's changes: the
/// checkpoint opened as the tenant reads the old state (and takes writes of its own), the
/// store it was taken of reads the new one.
#[test]
fn a_checkpoint_opens_as_the_store_it_was_and_both_go_their_own_ways() {
    let store = TestStore::new();
    let tenant = store.root().join("tenants").join("t");
    let (db, cp, aside) = (tenant.join("db"), tenant.join("cp"), tenant.join("aside"));
    let (small, big, new_big) = (b"small file".to_vec(), bytes(8 << 20, 3), bytes(8 << 20, 7));
    let write = |vol: &Volume, ino: u64, data: &[u8]| {
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            vol.write(ino, (i << 20) as u64, piece).unwrap();
        }
    };
    {
        let vol = store.open();
        assert_eq!(vol.tenant().db().path(), db.as_path());
        vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
        let a = file(&vol, b"a");
        vol.write(a, 0, &small).unwrap();
        write(&vol, file(&vol, b"big"), &big);
        vol.fsync().unwrap();
        vol.tenant().db().checkpoint(&cp).unwrap();
        let err = vol.tenant().db().checkpoint(&cp).unwrap_err().to_string();
        assert!(err.contains("a checkpoint is there already"), "{err}");
        let linked = std::fs::read_dir(cp.join("extents")).unwrap().count();
        assert!(linked >= 3, "the 8 MiB's extent files linked: {linked}");
        let mut shared_tables = 0;
        for e in std::fs::read_dir(&cp).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let links = e.metadata().unwrap().nlink();
            if name.ends_with(".log") || name.starts_with("MANIFEST") || name == "CURRENT" {
                assert_eq!(links, 1, "{name} is the checkpoint's own");
            }
            // (A compaction may have taken the store's name of a table since.)
            shared_tables += usize::from(name.ends_with(".sst") && links == 2);
        }
        assert!(shared_tables > 0, "table files shared with the store");
        write(&vol, vol.lookup(ROOT_INO, b"big").unwrap().ino, &new_big);
        vol.unlink(ROOT_INO, b"a").unwrap();
        vol.write(file(&vol, b"c"), 0, b"after").unwrap();
        vol.fsync().unwrap();
        collect_extent_files(vol.tenant(), &vol.inodes, 0, Occasion::Rolled).unwrap();
    }
    let after = |vol: &Volume| {
        assert_eq!(read_all(vol, b"a"), None);
        assert!(read_all(vol, b"big").unwrap() == new_big);
        assert_eq!(read_all(vol, b"c").unwrap(), b"after");
    };
    after(&store.open());
    std::fs::rename(&db, &aside).unwrap();
    std::fs::rename(&cp, &db).unwrap();
    {
        let vol = store.open();
        assert_eq!(read_all(&vol, b"a").unwrap(), small);
        assert!(read_all(&vol, b"big").unwrap() == big);
        assert_eq!(read_all(&vol, b"c"), None);
        vol.write(file(&vol, b"d"), 0, b"checkpoint's own").unwrap();
        vol.fsync().unwrap();
    }
    std::fs::rename(&db, &cp).unwrap();
    std::fs::rename(&aside, &db).unwrap();
    let vol = store.open();
    after(&vol);
    assert_eq!(read_all(&vol, b"d"), None);
}

const CHILD_ENV: &str = "TENANTFS_TEST_CHECKPOINT_CHILD";
const KILL_TEST: &str =
    "volume::checkpoints::a_checkpoint_killed_at_any_step_leaves_the_store_whole_and_a_rerun_completes";
/// Where the children stop: RocksDB's checkpoint made, extent files not linked; everything
/// staged, not renamed into place.
const PARK: [&str; 2] = ["checkpoint-rocksdb-done", "checkpoint-staged"];

/// A checkpoint killed (kill -9) after RocksDB's part, or with everything staged but not in
/// place, leaves no checkpoint (only its staging directory) and the store reading as
/// before; a checkpoint made afterwards replaces the staging directory and opens as the
/// store.
#[test]
fn a_checkpoint_killed_at_any_step_leaves_the_store_whole_and_a_rerun_completes() {
    let store_at = |root: &std::path::Path| root.join("tenants").join("t");
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (root, point) = spec.rsplit_once(':').unwrap();
        let store = TestStore::existing(std::path::Path::new(root));
        let vol = store.open();
        super::testing::park_at_failpoint(PARK[point.parse::<usize>().unwrap()], 1);
        super::testing::say("CHECKPOINT start");
        let done = vol
            .tenant()
            .db()
            .checkpoint(&store_at(store.root()).join("cp"));
        super::testing::say(&format!("CHECKPOINT done {done:?}"));
        return;
    }
    let store = TestStore::new();
    let big = bytes(4 << 20, 5);
    {
        let vol = store.open();
        let ino = file(&vol, b"big");
        for (i, piece) in big.chunks(1 << 20).enumerate() {
            vol.write(ino, (i << 20) as u64, piece).unwrap();
        }
        vol.write(file(&vol, b"small"), 0, b"small").unwrap();
        vol.fsync().unwrap();
    }
    let dir = store_at(store.root());
    for (point, name) in PARK.into_iter().enumerate() {
        let spec = format!("{}:{point}", store.root().display());
        let seen =
            super::testing::killed_where_parked(KILL_TEST, (CHILD_ENV, &spec), "CHECKPOINT ");
        assert!(
            seen.len() == 1 && seen[0].ends_with("CHECKPOINT start"),
            "{name}: the child did not park inside its checkpoint: {seen:?}"
        );
        assert!(!dir.join("cp").exists(), "{name}: a checkpoint in place");
        assert!(dir.join("cp.staging").exists(), "{name}: no staging left");
        let vol = store.open();
        assert!(
            read_all(&vol, b"big").unwrap() == big,
            "{name}: the store changed"
        );
    }
    {
        let vol = store.open();
        vol.tenant().db().checkpoint(&dir.join("cp")).unwrap();
        vol.write(
            vol.lookup(ROOT_INO, b"big").unwrap().ino,
            0,
            &[0u8; 1 << 20],
        )
        .unwrap();
        vol.fsync().unwrap();
    }
    assert!(!dir.join("cp.staging").exists());
    std::fs::rename(dir.join("db"), dir.join("aside")).unwrap();
    std::fs::rename(dir.join("cp"), dir.join("db")).unwrap();
    let vol = store.open();
    assert!(read_all(&vol, b"big").unwrap() == big);
    assert_eq!(read_all(&vol, b"small").unwrap(), b"small");
}
