//! Key operations and deletes killed (kill -9) at each of their steps: every tenant of the
//! data dir opens and reads as before, and the same command run again completes. (Tests of
//! `tenants`, kept here: they read and write through `volume`, which uses `tenants`.)

use crate::tenants::*;
use crate::volume::testing::{self, noise, read_file, write_file, TestStore};
use crate::volume::Volume;

const CHILD_ENV: &str = "TENANTFS_TEST_KEYS_CHILD";
const KILL_TEST: &str =
    "forks::key_and_delete_kills::a_rotation_or_delete_killed_at_any_step_leaves_every_tenant_whole";
/// Where the children stop: a rotation of an open tenant and one of a closed tenant, each
/// with its new key in the record and not yet in use; a delete with the tenant's directory
/// renamed aside, not yet removed; a shred with the record zeroed, the files still there.
const STEPS: [(&str, &str); 4] = [
    ("rotate-key", "key-added"),
    ("rotate-key (closed)", "key-added"),
    ("delete", "delete-renamed"),
    ("delete --shred", "shred-keys-gone"),
];

fn open(store: &TestStore, name: &str) -> Volume {
    Volume::open(crate::tenants::open(store.data_dir(), store.store_host(), name).unwrap()).unwrap()
}

/// The command of step `step`, as the child and the rerun run it.
fn run_step(store: &TestStore, step: usize) -> Result<(), TenantError> {
    let data = store.data_dir();
    match step {
        0 => rotate_key(data, open(store, "t").tenant()).map(drop),
        1 => rotate_key_closed(data, "t").map(drop),
        2 => delete(data, "x"),
        _ => delete_shredded(data, "y").map(drop),
    }
}

fn names(store: &TestStore) -> Vec<String> {
    list(store.root())
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect()
}

#[test]
fn a_rotation_or_delete_killed_at_any_step_leaves_every_tenant_whole() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (root, step) = spec.rsplit_once(':').unwrap();
        let step: usize = step.parse().unwrap();
        let store = TestStore::existing(std::path::Path::new(root));
        testing::park_at_failpoint(STEPS[step].1, 1);
        testing::say("KEYS start");
        let done = run_step(&store, step);
        testing::say(&format!("KEYS done {done:?}"));
        return;
    }
    let store = TestStore::new();
    let (data, host) = (store.data_dir(), store.store_host());
    let big = noise(4 << 20, 11);
    {
        let vol = store.open();
        write_file(&vol, b"big", &big);
        vol.fsync().unwrap();
    }
    for other in ["x", "y"] {
        create(data, host, other, None).unwrap();
        let vol = open(&store, other);
        write_file(&vol, b"mine", other.as_bytes());
        vol.fsync().unwrap();
    }
    for (step, (command, point)) in STEPS.into_iter().enumerate() {
        let spec = format!("{}:{step}", store.root().display());
        let seen = testing::killed_where_parked(KILL_TEST, (CHILD_ENV, &spec), "KEYS ");
        assert!(
            seen.len() == 1 && seen[0].ends_with("KEYS start"),
            "{command}: the child did not park at {point}: {seen:?}"
        );
        let keys_before = key_ids(store.root(), "t").unwrap().0.len();
        let gone = match step {
            2 => Some("x"),
            3 => Some("y"),
            _ => None,
        };
        if let Some(gone) = gone {
            assert!(
                !names(&store).iter().any(|n| n == gone),
                "{command}: {gone} is still listed after the kill"
            );
        }
        let left_aside = || {
            std::fs::read_dir(store.root().join("tenants"))
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with('.'))
        };
        assert_eq!(
            left_aside(),
            step == 2,
            "{command}: what the kill left aside"
        );
        if step == 3 {
            let e = info(store.root(), "y").unwrap_err().to_string();
            assert!(e.contains("delete y --shred` again"), "{command}: {e}");
        }
        run_step(&store, step).unwrap_or_else(|e| panic!("{command} run again: {e}"));
        assert!(!left_aside(), "{command}: the rerun left a directory aside");
        if let Some(gone) = gone {
            assert!(!store.root().join("tenants").join(gone).exists());
        }
        let vol = store.open();
        assert!(
            read_file(&vol, b"big").unwrap() == big,
            "{command}: t reads differently after the kill and the rerun"
        );
        let keys = key_ids(store.root(), "t").unwrap().0.len();
        let rotations = usize::from(step < 2);
        assert_eq!(
            keys,
            keys_before + rotations,
            "{command}: the rerun's key is the one more in t's ring"
        );
        write_file(&vol, format!("after {step}").as_bytes(), &big[..5000]);
        vol.fsync().unwrap();
    }
    assert_eq!(names(&store), ["t"]);
    // What a create killed on its way leaves (the daemon's start removes it), beside one of a
    // live process (this one's: not removed).
    let tenants = store.root().join("tenants");
    let (dead, live) = (
        tenants.join(".creating-z-4194305"),
        tenants.join(format!(".creating-z-{}", std::process::id())),
    );
    std::fs::create_dir_all(dead.join("db")).unwrap();
    std::fs::create_dir(&live).unwrap();
    assert_eq!(remove_leftovers(data).unwrap(), 1);
    assert!(!dead.exists() && live.exists());
    let vol = store.open();
    for step in 0..STEPS.len() {
        assert_eq!(
            read_file(&vol, format!("after {step}").as_bytes()).unwrap(),
            &big[..5000]
        );
    }
}
