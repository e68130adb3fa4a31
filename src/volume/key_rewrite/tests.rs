//! A tenant's store rewritten under its writing key: afterwards no file of it opens under
//! the keys it had before (its fork, which holds them, tries), every byte reads as it was,
//! the fork that shares its old files still reads them, and a rewrite killed after its moves
//! (before they are durable) leaves the store whole and a second run finishes it.

use std::path::Path;

use crate::store::{file_opens_under, files_under_other_keys};
use crate::volume::testing::{self, noise, read_file, write_file, TestStore};
use crate::volume::{FileKind, Owner, Volume, ROOT_INO};

const KILL_TEST: &str =
    "volume::key_rewrite::tests::a_rewrite_killed_after_its_moves_loses_nothing_and_a_rerun_finishes_it";
const CHILD_ENV: &str = "TENANTFS_REWRITE_CHILD";

/// Bulk data (extent files, rolled at 3 MiB; written twice, the first round's files pooled
/// by a collection), 4 KiB writes (blob files) and small files (table files), all synced and
/// flushed; what each file holds.
fn fill(vol: &Volume) -> Vec<(Vec<u8>, Vec<u8>)> {
    vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
    let mut files = vec![(b"bulk".to_vec(), noise(8 << 20, 1))];
    write_file(vol, b"bulk", &noise(8 << 20, 9));
    let ino = vol.lookup(ROOT_INO, b"bulk").unwrap().ino;
    for (i, piece) in files[0].1.chunks(1 << 20).enumerate() {
        vol.write(ino, (i << 20) as u64, piece).unwrap();
    }
    vol.fsync().unwrap();
    use super::super::extent_gc::{collect_extent_files, Occasion};
    collect_extent_files(vol.tenant(), &vol.inodes, 0, Occasion::Rolled).unwrap();
    assert!(
        !vol.tenant().db().extent_files().pooled().is_empty(),
        "the first round's files are pooled"
    );
    let blocks = noise(1 << 20, 2);
    let owner = Owner { uid: 0, gid: 0 };
    let ino = vol
        .mknod(ROOT_INO, b"blocks", FileKind::File, 0o644, owner, 0)
        .unwrap()
        .ino;
    for (i, block) in blocks.chunks(4096).enumerate() {
        vol.write(ino, (i * 4096) as u64, block).unwrap();
    }
    files.push((b"blocks".to_vec(), blocks));
    for i in 0..200u64 {
        let name = format!("small-{i}").into_bytes();
        write_file(vol, &name, &noise(300, i));
        files.push((name, noise(300, i)));
    }
    vol.fsync().unwrap();
    vol.tenant().db().flush().unwrap();
    files
}

fn reads_as(vol: &Volume, files: &[(Vec<u8>, Vec<u8>)]) -> bool {
    files
        .iter()
        .all(|(name, data)| read_file(vol, name).as_ref() == Some(data))
}

/// The sealed store files of tenant `name` that open under `ring`.
fn opening_under(root: &Path, name: &str, ring: &crate::crypto::Keyring) -> usize {
    let db = root.join("tenants").join(name).join("db");
    let (_, writing) = ring.ids();
    // Every sealed file, whatever its key: those "under other keys" than one no file has.
    let none = crate::crypto::KeyId::generate().unwrap();
    assert_ne!(none, writing);
    files_under_other_keys(&db, none)
        .unwrap()
        .iter()
        .filter(|p| file_opens_under(ring, p).is_ok())
        .count()
}

#[test]
fn a_rewrite_leaves_no_file_under_an_older_key_and_every_byte_as_it_was() {
    let store = TestStore::with_cache(16 << 20);
    let (data, root) = (store.data_dir(), store.root().to_owned());
    let vol = store.open();
    let files = fill(&vol);
    // The fork holds the tenant's keys until now and shares its files; the tenant moves to a
    // new key with it.
    // (A fork as `forks::fork` makes one: a checkpoint of the open store.)
    let checkpoint = |db: &Path| vol.tenant().db().checkpoint(db).map_err(Into::into);
    crate::tenants::create_fork(data, vol.tenant(), "f", None, checkpoint).unwrap();
    let fork = crate::tenants::open(data, store.store_host(), "f").unwrap();
    let db = vol.tenant().db().path().to_owned();
    let (_, writing) = vol.tenant().keys().ids();
    let before = files_under_other_keys(&db, writing).unwrap();
    assert!(
        before.len() >= 5,
        "tables, blobs and extent files: {before:?}"
    );
    assert!(opening_under(&root, "t", fork.keys()) >= 5);

    let done = vol.rewrite_under_writing_key().unwrap();
    assert!(done.left.is_empty(), "{:?}", done.left);
    assert!(done.moved_bytes >= 8 << 20, "{done:?}");
    assert!(done.extent_files >= 3, "{done:?}");
    assert!(files_under_other_keys(&db, writing).unwrap().is_empty());
    assert_eq!(
        opening_under(&root, "t", fork.keys()),
        0,
        "a file of the tenant opens under the keys it had before the rewrite"
    );
    assert!(reads_as(&vol, &files));
    // It goes on writing; reopened, it reads the same.
    write_file(&vol, b"after", b"written after the rewrite");
    vol.fsync().unwrap();
    drop(vol);
    let vol = store.open();
    assert!(reads_as(&vol, &files));
    assert_eq!(
        read_file(&vol, b"after").unwrap(),
        b"written after the rewrite"
    );
    // The fork's files (the tenant's old ones, under their old keys) are untouched.
    assert!(reads_as(&Volume::open(fork).unwrap(), &files));
    // Nothing left to do: a second run moves nothing.
    let again = vol.rewrite_under_writing_key().unwrap();
    assert_eq!((again.moved_bytes, again.left.len()), (0, 0), "{again:?}");
}

#[test]
fn a_rewrite_killed_after_its_moves_loses_nothing_and_a_rerun_finishes_it() {
    if let Ok(root) = std::env::var(CHILD_ENV) {
        let store = TestStore::existing(Path::new(&root));
        let vol = store.open();
        crate::tenants::rotate_key(store.data_dir(), vol.tenant()).unwrap();
        testing::park_at_failpoint("rewrite-moved", 1);
        testing::say("REWRITE start");
        let done = vol.rewrite_under_writing_key().map(drop);
        testing::say(&format!("REWRITE done {done:?}"));
        return;
    }
    let store = TestStore::new();
    let files = fill(&store.open());
    let spec = store.root().display().to_string();
    let seen = testing::killed_where_parked(KILL_TEST, (CHILD_ENV, &spec), "REWRITE ");
    assert!(
        seen.len() == 1 && seen[0].ends_with("REWRITE start"),
        "the child did not park inside its rewrite: {seen:?}"
    );
    let vol = store.open();
    assert!(reads_as(&vol, &files), "a byte changed after the kill");
    let done = vol.rewrite_under_writing_key().unwrap();
    assert!(done.left.is_empty(), "{:?}", done.left);
    assert!(
        done.moved_bytes >= 8 << 20,
        "the killed run's moves were lost: {done:?}"
    );
    assert!(reads_as(&vol, &files));
}
