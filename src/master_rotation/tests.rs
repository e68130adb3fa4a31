//! Master key rotations of a data dir with a tenant, its fork and a snapshot: every key moves,
//! the old key opens nothing, the base keys stay the same bytes; and a rotation killed at each
//! step leaves the data dir whole under one key or the other, and a rerun finishes it.

use std::path::{Path, PathBuf};

use super::*;
use crate::base::host_keys::{host_key, HostKey};
use crate::volume::testing::{self, noise, read_file, write_file, TestStore};
use crate::volume::Volume;

/// A data dir with tenant t holding `big`, its fork f, and snapshot s1 of t.
fn populated(big: &[u8]) -> TestStore {
    let store = TestStore::new();
    let vol = store.open();
    write_file(&vol, b"big", big);
    vol.fsync().unwrap();
    crate::forks::fork(store.data_dir(), vol.tenant(), "f", None).unwrap();
    crate::snapshots::create(store.root(), vol.tenant(), "s1").unwrap();
    store
}

fn reads(store: &TestStore, name: &str, big: &[u8]) {
    let t = crate::tenants::open(store.data_dir(), store.store_host(), name).unwrap();
    let vol = Volume::open(t).unwrap();
    assert!(
        read_file(&vol, b"big").unwrap() == big,
        "{name} reads otherwise"
    );
}

/// A copy of the data dir's key file, aside (the rotation replaces it).
fn keep_old_key(root: &Path) -> PathBuf {
    let aside = root.parent().unwrap().join("old.key");
    std::fs::copy(root.join("master.key"), &aside).unwrap();
    aside
}

/// Every sealed key of every tenant record: (tenant, hex), and whether any has a second seal.
fn sealed_keys(root: &Path) -> (Vec<(String, String)>, bool) {
    let (mut keys, mut second) = (Vec::new(), false);
    for e in std::fs::read_dir(root.join("tenants")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read(e.path().join("tenant.json")) else {
            continue;
        };
        let record: serde_json::Value = serde_json::from_slice(&text).unwrap();
        for k in record["keys"].as_array().unwrap() {
            keys.push((name.clone(), k["wrapped"].as_str().unwrap().to_owned()));
            second |= k.get("wrapped_next").is_some();
        }
    }
    (keys, second)
}

/// What must hold once a rotation to the key in `new` finished: the data dir keeps that key,
/// no rotation file is left, no record has a second seal, and no sealed key opens under the
/// old key, which no longer opens the data dir.
fn finished(root: &Path, old: &Path, new: &Path) {
    assert_eq!(
        std::fs::read(root.join("master.key")).unwrap(),
        std::fs::read(new).unwrap()
    );
    for left in [ROTATION_FILE, NEXT_KEY_FILE] {
        assert!(!root.join(left).exists(), "{left} is left");
    }
    let old_key = MasterKey::load(old).unwrap();
    let (keys, second) = sealed_keys(root);
    assert!(!second, "a record keeps a second seal");
    assert!(keys.len() >= 3, "{keys:?}");
    for (tenant, hex_key) in keys {
        let sealed = hex::decode(hex_key).unwrap();
        assert!(
            old_key.unwrap_tenant_key(&tenant, &sealed).is_none(),
            "a key of {tenant} opens under the old master key"
        );
    }
    let base = std::fs::read_to_string(root.join("base/keys.json")).unwrap();
    assert!(!base.contains("wrapped_next"), "{base}");
    match DataDir::open(root, Some(old)) {
        Err(DataDirError::WrongKey { .. }) => {}
        other => panic!("the old key: {:?}", other.map(|_| ())),
    }
}

#[test]
fn the_data_dir_moves_to_the_new_key_and_the_old_one_opens_nothing() {
    let big = noise(3 << 20, 21);
    let store = populated(&big);
    let root = store.root().to_owned();
    let old = keep_old_key(&root);
    let pack = host_key(store.data_dir(), HostKey::Pack).unwrap();
    let index = host_key(store.data_dir(), HostKey::Index).unwrap();
    let new = root.parent().unwrap().join("new.key");
    let (next, made) = new_key_file(&new).unwrap();
    assert!(made);
    let report = rotate_master(store.data_dir(), next, &new).unwrap();
    assert_eq!((report.tenants, report.templates), (2, 0));
    assert_eq!(report.installed, Some(root.join("master.key")));
    assert!(!report.finished_earlier);
    finished(&root, &old, &new);
    // This process goes on under the new key: it opens, creates and rotates.
    reads(&store, "t", &big);
    reads(&store, "f", &big);
    crate::tenants::create(store.data_dir(), store.store_host(), "g", None).unwrap();
    crate::tenants::rotate_key_closed(store.data_dir(), "f").unwrap();
    crate::snapshots::restore(&root, "t", "s1").unwrap_or_else(|e| panic!("{e}"));
    // So does another, with the key the data dir keeps; the base keys are the same bytes.
    let again = TestStore::existing(&root);
    reads(&again, "t", &big);
    reads(&again, "f", &big);
    let same = |a: &crate::crypto::TenantKey, b: &crate::crypto::TenantKey| a.bytes() == b.bytes();
    assert!(same(
        &host_key(again.data_dir(), HostKey::Pack).unwrap(),
        &pack
    ));
    assert!(same(
        &host_key(again.data_dir(), HostKey::Index).unwrap(),
        &index
    ));
    // The same key again changes nothing.
    let (next, _) = new_key_file(&new).unwrap();
    match rotate_master(again.data_dir(), next, &new) {
        Err(RotationError::Same(_)) => {}
        other => panic!("{other:?}"),
    }
}

const CHILD_ENV: &str = "TENANTFS_TEST_ROTATION_CHILD";
const KILL_TEST: &str =
    "master_rotation::tests::a_rotation_killed_at_any_step_leaves_one_key_and_a_rerun_finishes";
/// Where the children stop (failpoint, its nth hit), and whether the rotation had committed
/// there. The data dir holds two tenants: hits 1-2 of `rotation-tenant-resealed` are the
/// second seals, 3-4 the settling.
const STEPS: [(&str, u64, bool); 7] = [
    ("rotation-recorded", 1, false),
    ("rotation-tenant-resealed", 1, false),
    ("rotation-added", 1, false),
    ("rotation-committed", 1, true),
    ("rotation-installed", 1, true),
    ("rotation-tenant-resealed", 3, true),
    ("rotation-settled", 1, true),
];

#[test]
fn a_rotation_killed_at_any_step_leaves_one_key_and_a_rerun_finishes() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (root, step) = spec.rsplit_once(':').unwrap();
        let (point, nth, _) = STEPS[step.parse::<usize>().unwrap()];
        let root = Path::new(root);
        let store = TestStore::existing(root);
        testing::park_at_failpoint(point, nth);
        testing::say("ROTATION start");
        let new = root.parent().unwrap().join("new.key");
        let (next, _) = new_key_file(&new).unwrap();
        let done = rotate_master(store.data_dir(), next, &new).map(drop);
        testing::say(&format!("ROTATION done {done:?}"));
        return;
    }
    let big = noise(1 << 20, 22);
    for (step, (point, nth, committed)) in STEPS.into_iter().enumerate() {
        // (Kept: its temporary directory goes with it.)
        let owner = populated(&big);
        let root = owner.root().to_owned();
        let old = keep_old_key(&root);
        let new = root.parent().unwrap().join("new.key");
        new_key_file(&new).unwrap();
        let spec = format!("{}:{step}", root.display());
        let seen = testing::killed_where_parked(KILL_TEST, (CHILD_ENV, &spec), "ROTATION ");
        assert!(
            seen.len() == 1 && seen[0].ends_with("ROTATION start"),
            "{point} #{nth}: the child did not park there: {seen:?}"
        );
        // The data dir opens, under the old key before the commit and the new one after,
        // and every tenant reads.
        let store = TestStore::existing(&root);
        let check = std::fs::read(root.join("master.check")).unwrap();
        let under = |key: &Path| MasterKey::load(key).unwrap().matches_check_record(&check);
        assert_eq!(
            (under(&old), under(&new)),
            (!committed, committed),
            "{point} #{nth}: the data dir's key"
        );
        reads(&store, "t", &big);
        reads(&store, "f", &big);
        let (next, _) = new_key_file(&new).unwrap();
        let report = rotate_master(store.data_dir(), next, &new)
            .unwrap_or_else(|e| panic!("{point} #{nth}: the rerun: {e}"));
        assert_eq!(report.finished_earlier, committed, "{point} #{nth}");
        finished(&root, &old, &new);
        reads(&TestStore::existing(&root), "t", &big);
    }
}
