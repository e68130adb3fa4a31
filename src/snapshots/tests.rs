//! Snapshots of a real tenant store: taken, restored (again and again: a snapshot never
//! changes), deleted (only its own disk comes back), and killed at each step.

use std::path::Path;

use super::*;
use crate::volume::testing::{self, noise, read_file, write_file, TestStore};
use crate::volume::ROOT_INO;

fn tenant_dir(root: &Path) -> std::path::PathBuf {
    root.join("tenants").join("t")
}

#[test]
fn a_snapshot_restores_what_was_written_before_it_as_often_as_asked() {
    let store = TestStore::new();
    let root = store.root().to_owned();
    let (small, big, new_big) = (b"small".to_vec(), noise(8 << 20, 1), noise(8 << 20, 2));
    {
        let vol = store.open();
        vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
        write_file(&vol, b"a", &small);
        write_file(&vol, b"big", &big);
        vol.fsync().unwrap();
        let taken = create(&root, vol.tenant(), "s1").unwrap();
        assert_eq!(
            (taken.info.tenant.as_str(), taken.info.name.as_str()),
            ("t", "s1")
        );
        assert!(
            taken.info.own_bytes < taken.info.disk_bytes / 10,
            "its files are the store's: {:?}",
            taken.info
        );
        let again = create(&root, vol.tenant(), "s1").unwrap_err().to_string();
        assert!(again.contains("has a snapshot s1 already"), "{again}");
        let bad = create(&root, vol.tenant(), "../x").unwrap_err().to_string();
        assert!(bad.contains("invalid snapshot name"), "{bad}");
        // The tenant goes on: its bulk data rewritten, a file gone, another made.
        let ino = vol.lookup(ROOT_INO, b"big").unwrap().ino;
        for (i, piece) in new_big.chunks(1 << 20).enumerate() {
            vol.write(ino, (i << 20) as u64, piece).unwrap();
        }
        vol.unlink(ROOT_INO, b"a").unwrap();
        write_file(&vol, b"c", b"after");
        vol.fsync().unwrap();
    }
    let listed = list(&root, Some("t")).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "s1");
    let unknown = restore(&root, "t", "s2").unwrap_err().to_string();
    assert!(unknown.contains("has no snapshot s2"), "{unknown}");
    for round in 0..2 {
        restore(&root, "t", "s1").unwrap();
        let vol = store.open();
        assert_eq!(read_file(&vol, b"a").unwrap(), small, "round {round}");
        assert!(read_file(&vol, b"big").unwrap() == big, "round {round}");
        assert_eq!(read_file(&vol, b"c"), None, "round {round}");
        // Writes after a restore are the tenant's, never the snapshot's.
        write_file(&vol, b"d", &noise(4 << 20, 3));
        vol.fsync().unwrap();
    }
    let dir = tenant_dir(&root);
    for leftover in ["db.restoring", "db.replaced", "tenant.json.restoring"] {
        assert!(!dir.join(leftover).exists(), "{leftover} left");
    }
    let before = crate::fs_util::tree_usage(&dir).total;
    let own = delete(&root, "t", "s1").unwrap();
    let after = crate::fs_util::tree_usage(&dir).total;
    assert_eq!(before - after, own, "only its own files' disk came back");
    assert!(list(&root, None).unwrap().is_empty());
    let vol = store.open();
    assert_eq!(
        read_file(&vol, b"a").unwrap(),
        small,
        "the tenant keeps what it shared"
    );
    assert!(read_file(&vol, b"big").unwrap() == big);
}

/// Bulk data written and not synced (it skips the WAL: only a memtable holds it) is in a
/// snapshot taken after it, as every write before the call is: the checkpoint flushes
/// rather than copy the WALs then.
/// A table file at the filesystem's link limit (ext4: 65,000 links; a base's template gets
/// there with enough tenants) is copied into a snapshot instead of linked, and the snapshot
/// restores.
#[test]
fn a_table_file_at_the_link_limit_is_copied_into_a_snapshot() {
    let store = TestStore::new();
    let root = store.root().to_owned();
    let vol = store.open();
    write_file(&vol, b"a", b"small");
    vol.fsync().unwrap();
    vol.tenant().db().flush().unwrap();
    let db = vol.tenant().db().path().to_owned();
    let table = std::fs::read_dir(&db)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sst"))
        .unwrap();
    let links = root.join("links");
    std::fs::create_dir(&links).unwrap();
    for n in 0.. {
        match std::fs::hard_link(&table, links.join(n.to_string())) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EMLINK) => break,
            Err(e) => panic!("{e}"),
        }
        if n == 100_000 {
            tracing::warn!(dir = %root.display(), "skipped: no link limit here");
            return;
        }
    }
    create(&root, vol.tenant(), "s").unwrap();
    let name = table.file_name().unwrap();
    let copies: Vec<_> = walk(&tenant_dir(&root).join("snapshots"))
        .into_iter()
        .filter(|p| p.file_name() == Some(name))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&copies[0]).unwrap().nlink(), 1, "a copy");
    drop(vol);
    std::fs::remove_dir_all(&links).unwrap();
    restore(&root, "t", "s").unwrap();
    let vol = store.open();
    assert_eq!(read_file(&vol, b"a").unwrap(), b"small");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_snapshot_holds_bulk_data_written_before_it_and_not_synced() {
    let store = TestStore::new();
    let root = store.root().to_owned();
    let big = noise(4 << 20, 7);
    {
        let vol = store.open();
        write_file(&vol, b"small", b"logged");
        vol.fsync().unwrap();
        write_file(&vol, b"big", &big);
        create(&root, vol.tenant(), "s").unwrap();
    }
    restore(&root, "t", "s").unwrap();
    let vol = store.open();
    assert_eq!(read_file(&vol, b"small").unwrap(), b"logged");
    assert!(
        read_file(&vol, b"big").unwrap() == big,
        "the unsynced bulk data"
    );
}

const CHILD_ENV: &str = "TENANTFS_TEST_SNAPSHOT_CHILD";
const KILL_TEST: &str =
    "snapshots::tests::a_snapshot_or_restore_killed_at_any_step_leaves_the_tenant_whole";
/// Where the children stop: a snapshot staged, not in place; a restore's copy staged, the
/// store not renamed away; the store renamed away, the copy not in its place.
const PARK: [&str; 3] = ["snapshot-staged", "restore-staged", "restore-swapping"];

/// A snapshot killed (kill -9) before it is in place leaves none, and the next one of that
/// name is taken; a restore killed before the tenant's store is renamed away leaves the
/// tenant as it was, and one killed after it leaves the tenant restored, once its lock is
/// taken again; either way a rerun completes.
#[test]
fn a_snapshot_or_restore_killed_at_any_step_leaves_the_tenant_whole() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (root, point) = spec.rsplit_once(':').unwrap();
        let root = Path::new(root);
        let point: usize = point.parse().unwrap();
        let store = TestStore::existing(root);
        testing::park_at_failpoint(PARK[point], 1);
        testing::say("SNAPSHOT start");
        if point == 0 {
            let done = create(root, &store.open_tenant(), "s2").map(|_| ());
            testing::say(&format!("SNAPSHOT done {done:?}"));
        } else {
            let done = restore(root, "t", "s1").map(|_| ());
            testing::say(&format!("SNAPSHOT done {done:?}"));
        }
        return;
    }
    let store = TestStore::new();
    let root = store.root().to_owned();
    let (old, new) = (noise(4 << 20, 5), noise(4 << 20, 6));
    let write = |data: &[u8]| {
        let vol = store.open();
        if vol.lookup(ROOT_INO, b"f").is_ok() {
            vol.unlink(ROOT_INO, b"f").unwrap();
        }
        write_file(&vol, b"f", data);
        vol.fsync().unwrap();
    };
    write(&old);
    create(&root, &store.open_tenant(), "s1").unwrap();
    write(&new);
    let reads = |want: &[u8], what: &str| {
        let vol = store.open();
        assert!(read_file(&vol, b"f").unwrap() == want, "{what}");
    };
    for (point, name) in PARK.into_iter().enumerate() {
        let spec = format!("{}:{point}", root.display());
        let seen = testing::killed_where_parked(KILL_TEST, (CHILD_ENV, &spec), "SNAPSHOT ");
        assert!(
            seen.len() == 1 && seen[0].ends_with("SNAPSHOT start"),
            "{name}: the child did not park inside: {seen:?}"
        );
        match point {
            0 => {
                let names: Vec<String> = list(&root, None)
                    .unwrap()
                    .into_iter()
                    .map(|s| s.name)
                    .collect();
                assert_eq!(names, ["s1"], "{name}: a half-made snapshot is listed");
                reads(&new, name);
                create(&root, &store.open_tenant(), "s2").unwrap();
                let left = std::fs::read_dir(tenant_dir(&root).join("snapshots"))
                    .unwrap()
                    .count();
                assert_eq!(left, 2, "{name}: the killed attempt's directory is left");
            }
            1 => {
                reads(&new, &format!("{name}: the tenant is as it was"));
                restore(&root, "t", "s1").unwrap();
                reads(&old, &format!("{name}: a rerun restores"));
                write(&new);
            }
            _ => reads(
                &old,
                &format!("{name}: the tenant is restored at its next open"),
            ),
        }
        let dir = tenant_dir(&root);
        for leftover in ["db.restoring", "db.replaced", "tenant.json.restoring"] {
            assert!(!dir.join(leftover).exists(), "{name}: {leftover} left");
        }
    }
}
