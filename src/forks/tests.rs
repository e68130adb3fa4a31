//! Forks of a real tenant store: the fork holds the source as it was, each side sees only its
//! own writes, neither opens a file the other writes afterwards (its header names a key the
//! other's ring lacks), the fork outlives its source, and a fork killed at any step leaves no
//! fork and the source whole.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::*;
use crate::store::{file_key_id, file_opens_under, FILE_HEADER_LEN};
use crate::volume::testing::{self, noise, read_file, write_file, TestStore};
use crate::volume::{Volume, ROOT_INO};

/// The files of tenant `name`'s store that carry a key header.
fn store_files(root: &Path, name: &str) -> BTreeSet<PathBuf> {
    let db = root.join("tenants").join(name).join("db");
    let mut out = BTreeSet::new();
    for dir in [db.clone(), db.join("extents")] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let m = e.metadata().unwrap();
            if m.is_file() && m.len() >= FILE_HEADER_LEN as u64 {
                out.insert(e.path());
            }
        }
    }
    out
}

/// The WALs and MANIFESTs of tenant `name`'s store, with their sizes.
fn appended_files(root: &Path, name: &str) -> Vec<(PathBuf, u64)> {
    store_files(root, name)
        .into_iter()
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("MANIFEST-") || n.ends_with(".log")
        })
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p, len)
        })
        .collect()
}

fn open(store: &TestStore, name: &str) -> Volume {
    let t = crate::tenants::open(store.data_dir(), store.store_host(), name).unwrap();
    Volume::open(t).unwrap()
}

/// Forks back to back of a source whose WAL is large enough that each checkpoint flushes
/// (its MANIFEST edits made while the limits are lowered for the move to a new key): no WAL
/// or MANIFEST under a key the forks hold gets another byte, and once the source has flushed,
/// its MANIFEST limit is RocksDB's default again.
#[test]
fn a_source_appends_to_no_file_under_its_old_keys_after_forks_back_to_back() {
    let store = TestStore::new();
    let (data, root) = (store.data_dir(), store.root().to_owned());
    let vol = store.open();
    let more = |from: u32| {
        for i in from..from + 400 {
            write_file(
                &vol,
                format!("small-{i}").as_bytes(),
                &noise(1024, u64::from(i)),
            );
        }
    };
    more(0);
    fork(data, vol.tenant(), "f", None).unwrap();
    fork(data, vol.tenant(), "g", None).unwrap();
    let writing = crate::tenants::key_ids(&root, "t").unwrap().1;
    let old: Vec<_> = appended_files(&root, "t")
        .into_iter()
        .filter(|(p, _)| file_key_id(p).unwrap() != Some(writing))
        .collect();
    assert!(old.len() >= 2, "{old:?}");
    more(400);
    vol.fsync().unwrap();
    vol.tenant().db().flush().unwrap();
    for (path, len) in &old {
        if let Ok(m) = std::fs::metadata(path) {
            assert_eq!(m.len(), *len, "{} grew after the forks", path.display());
        }
    }
    assert!(appended_files(&root, "t")
        .iter()
        .any(|(p, _)| p.to_string_lossy().contains("MANIFEST-")
            && file_key_id(p).unwrap() == Some(writing)));
    assert_eq!(vol.tenant().db().manifest_size_limit(), 1 << 30);
    let g = open(&store, "g");
    assert_eq!(read_file(&g, b"small-399").unwrap(), noise(1024, 399));
    assert_eq!(read_file(&g, b"small-400"), None);
}

#[test]
fn a_fork_holds_its_source_and_each_side_reads_only_what_it_writes() {
    let store = TestStore::new();
    let (data, root) = (store.data_dir(), store.root().to_owned());
    let (small, big, new_big) = (b"small".to_vec(), noise(8 << 20, 1), noise(8 << 20, 2));
    let source_writing;
    {
        let vol = store.open();
        vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
        write_file(&vol, b"a", &small);
        write_file(&vol, b"big", &big);
        vol.fsync().unwrap();
        let (first, _) = crate::tenants::key_ids(&root, "t").unwrap();
        let forked = fork(data, vol.tenant(), "f", None).unwrap();
        assert_eq!(forked.info.name, "f");
        // The source's WAL and MANIFEST at the fork: none of them gets another byte (the
        // memtable switch started a new WAL; the flush behind it starts a new MANIFEST).
        let writing_now = crate::tenants::key_ids(&root, "t").unwrap().1;
        let at_fork: Vec<_> = appended_files(&root, "t")
            .into_iter()
            .filter(|(p, _)| file_key_id(p).unwrap() != Some(writing_now))
            .collect();
        assert!(!at_fork.is_empty());
        let again = fork(data, vol.tenant(), "f", None).unwrap_err().to_string();
        assert!(again.contains("already exists"), "{again}");
        let (ids, writing) = crate::tenants::key_ids(&root, "t").unwrap();
        let (fork_ids, fork_writing) = crate::tenants::key_ids(&root, "f").unwrap();
        assert_eq!(ids.len(), first.len() + 1, "the source moved to a new key");
        assert!(
            first.iter().all(|id| fork_ids.contains(id)),
            "the fork reads the source's files"
        );
        assert!(
            !fork_ids.contains(&writing),
            "the fork lacks the source's new key"
        );
        assert!(
            !ids.contains(&fork_writing),
            "the source lacks the fork's key"
        );
        source_writing = writing;
        let before = store_files(&root, "t");
        // The source goes on: bulk data rewritten, a file gone, another made, all flushed.
        let ino = vol.lookup(ROOT_INO, b"big").unwrap().ino;
        for (i, piece) in new_big.chunks(1 << 20).enumerate() {
            vol.write(ino, (i << 20) as u64, piece).unwrap();
        }
        vol.unlink(ROOT_INO, b"a").unwrap();
        write_file(&vol, b"c", b"after the fork");
        vol.fsync().unwrap();
        vol.tenant().db().flush().unwrap();
        for (path, len) in &at_fork {
            if let Ok(m) = std::fs::metadata(path) {
                assert_eq!(m.len(), *len, "{} grew after the fork", path.display());
            }
        }
        // The flushes done, the MANIFEST's size limit is RocksDB's default again.
        assert_eq!(vol.tenant().db().manifest_size_limit(), 1 << 30);
        let fork_ring = crate::tenants::open(data, store.store_host(), "f").unwrap();
        let mut new_files = 0;
        for path in store_files(&root, "t").difference(&before) {
            assert_eq!(
                file_key_id(path).unwrap(),
                Some(writing),
                "{} is under the source's new key",
                path.display()
            );
            let e = file_opens_under(fork_ring.keys(), path).unwrap_err();
            assert!(e.contains("does not hold"), "{}: {e}", path.display());
            new_files += 1;
        }
        assert!(
            new_files >= 3,
            "the source wrote {new_files} files after the fork"
        );
        // The files it goes on appending to, too: its newest MANIFEST and WAL.
        let db = root.join("tenants/t/db");
        for kind in ["MANIFEST-", ".log"] {
            let newest = std::fs::read_dir(&db)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy().into_owned();
                    n.starts_with(kind) || n.ends_with(kind)
                })
                .max()
                .unwrap();
            assert_eq!(file_key_id(&newest).unwrap(), Some(writing), "{kind}");
        }
    }
    let before = store_files(&root, "f");
    {
        let f = open(&store, "f");
        assert_eq!(read_file(&f, b"a").unwrap(), small);
        assert!(read_file(&f, b"big").unwrap() == big);
        assert_eq!(read_file(&f, b"c"), None);
        write_file(&f, b"d", &noise(4 << 20, 3));
        f.fsync().unwrap();
        f.tenant().db().flush().unwrap();
    }
    let (_, fork_writing) = crate::tenants::key_ids(&root, "f").unwrap();
    let source = store.open_tenant();
    for path in store_files(&root, "f").difference(&before) {
        assert_eq!(file_key_id(path).unwrap(), Some(fork_writing));
        assert!(file_opens_under(source.keys(), path).is_err());
    }
    assert_eq!(source.keys().ids().1, source_writing);
    drop(source);
    {
        let vol = store.open();
        assert_eq!(read_file(&vol, b"a"), None);
        assert!(read_file(&vol, b"big").unwrap() == new_big);
        assert_eq!(read_file(&vol, b"d"), None);
    }
    // The source deleted: the fork reads everything it shared.
    crate::tenants::delete(data, "t").unwrap();
    let f = open(&store, "f");
    assert_eq!(read_file(&f, b"a").unwrap(), small);
    assert!(read_file(&f, b"big").unwrap() == big);
    assert!(read_file(&f, b"d").unwrap() == noise(4 << 20, 3));
}

#[test]
fn a_fork_of_a_snapshot_holds_the_snapshot() {
    let store = TestStore::new();
    let (data, root) = (store.data_dir(), store.root().to_owned());
    let vol = store.open();
    write_file(&vol, b"a", b"at the snapshot");
    vol.fsync().unwrap();
    crate::snapshots::create(&root, vol.tenant(), "s1").unwrap();
    write_file(&vol, b"b", b"after the snapshot");
    vol.fsync().unwrap();
    let e = fork(data, vol.tenant(), "g", Some("s2"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no snapshot s2"), "{e}");
    fork(data, vol.tenant(), "g", Some("s1")).unwrap();
    let g = open(&store, "g");
    assert_eq!(read_file(&g, b"a").unwrap(), b"at the snapshot");
    assert_eq!(read_file(&g, b"b"), None);
    assert_eq!(read_file(&vol, b"b").unwrap(), b"after the snapshot");
}

const CHILD_ENV: &str = "TENANTFS_TEST_FORK_CHILD";
const KILL_TEST: &str =
    "forks::tests::a_fork_killed_at_any_step_leaves_no_fork_and_the_source_whole";
/// Where the children stop: the fork's store staged; the source's new key in its record, not
/// yet in its open ring; the source on its new key, the fork not in place.
const PARK: [&str; 3] = ["fork-staged", "key-added", "fork-rotated"];

/// A fork killed (kill -9) at any step leaves no tenant of the fork's name and the source
/// reading as before; a fork made afterwards completes and holds the source.
#[test]
fn a_fork_killed_at_any_step_leaves_no_fork_and_the_source_whole() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (root, point) = spec.rsplit_once(':').unwrap();
        let store = TestStore::existing(Path::new(root));
        let vol = store.open();
        testing::park_at_failpoint(PARK[point.parse::<usize>().unwrap()], 1);
        testing::say("FORK start");
        let done = fork(store.data_dir(), vol.tenant(), "f", None).map(drop);
        testing::say(&format!("FORK done {done:?}"));
        return;
    }
    let store = TestStore::new();
    let big = noise(4 << 20, 5);
    {
        let vol = store.open();
        write_file(&vol, b"big", &big);
        vol.fsync().unwrap();
    }
    for (point, name) in PARK.into_iter().enumerate() {
        let spec = format!("{}:{point}", store.root().display());
        let seen = testing::killed_where_parked(KILL_TEST, (CHILD_ENV, &spec), "FORK ");
        assert!(
            seen.len() == 1 && seen[0].ends_with("FORK start"),
            "{name}: the child did not park inside its fork: {seen:?}"
        );
        let names: Vec<String> = crate::tenants::list(store.root())
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["t"], "{name}: a half-made fork is listed");
        let vol = store.open();
        assert!(
            read_file(&vol, b"big").unwrap() == big,
            "{name}: the source changed"
        );
    }
    {
        let vol = store.open();
        fork(store.data_dir(), vol.tenant(), "f", None).unwrap();
    }
    assert!(read_file(&open(&store, "f"), b"big").unwrap() == big);
}

/// Every file under `dir`, recursively.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(all_files(&e.path()));
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    out
}

/// After `tenant delete --shred`, the tenant's wrapped keys are nowhere in the data dir, and
/// its own files (copies kept aside) open under no ring the data dir holds; its fork, which
/// holds the keys of the files it shares, is named and keeps reading them. A record a shred
/// cut short left zeroed is deleted without a question.
#[test]
fn a_shredded_tenant_leaves_no_key_to_its_own_files_and_its_fork_keeps_its_share() {
    let store = TestStore::new();
    let (data, root) = (store.data_dir(), store.root().to_owned());
    let big = noise(4 << 20, 8);
    {
        let vol = store.open();
        write_file(&vol, b"big", &big);
        vol.fsync().unwrap();
        fork(data, vol.tenant(), "f", None).unwrap();
        write_file(&vol, b"own", &noise(4 << 20, 9));
        vol.fsync().unwrap();
        vol.tenant().db().flush().unwrap();
    }
    let (_, own_key) = crate::tenants::key_ids(&root, "t").unwrap();
    let aside = tempfile::tempdir_in("/var/tmp").unwrap();
    let copies: Vec<PathBuf> = store_files(&root, "t")
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let copy = aside.path().join(i.to_string());
            std::fs::copy(p, &copy).unwrap();
            copy
        })
        .collect();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("tenants/t/tenant.json")).unwrap())
            .unwrap();
    let wrapped: Vec<String> = record["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["wrapped"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(wrapped.len(), 2);

    let holders = crate::tenants::delete_shredded(data, "t").unwrap();
    assert_eq!(holders, ["f"]);
    for path in all_files(&root) {
        let bytes = std::fs::read(&path).unwrap();
        for w in &wrapped {
            assert!(
                !bytes.windows(w.len()).any(|x| x == w.as_bytes()),
                "{} holds a wrapped key of the shredded tenant",
                path.display()
            );
        }
    }
    let f = crate::tenants::open(data, store.store_host(), "f").unwrap();
    let (mut own, mut shared) = (0, 0);
    for copy in &copies {
        if file_key_id(copy).unwrap() == Some(own_key) {
            assert!(file_opens_under(f.keys(), copy).is_err());
            own += 1;
        } else {
            shared += usize::from(file_opens_under(f.keys(), copy).is_ok());
        }
    }
    assert!(own >= 2 && shared >= 1, "own {own}, shared {shared}");
    drop(f);
    assert!(read_file(&open(&store, "f"), b"big").unwrap() == big);

    crate::tenants::create(data, store.store_host(), "z", None).unwrap();
    let z = root.join("tenants/z/tenant.json");
    let len = std::fs::metadata(&z).unwrap().len() as usize;
    std::fs::write(&z, vec![0u8; len]).unwrap();
    let e = crate::tenants::info(&root, "z").unwrap_err().to_string();
    assert!(e.contains("delete z --shred` again"), "{e}");
    let listed: Vec<String> = crate::tenants::list(&root)
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(listed, ["f"], "a tenant being shredded is not listed");
    assert!(crate::tenants::delete_shredded(data, "z")
        .unwrap()
        .is_empty());
    assert!(!root.join("tenants/z").exists());
}

/// Two forks read the same unchanged data of their source: bulk data (extent files), 4 KiB
/// writes (blob values) and small files (values in table files). The second finds it all in
/// the host cache the first filled, and the cache does not grow: the cache keys name the
/// shared files, not the store that reads them. The same store opened again (a dormant
/// mount's wake) likewise finds its blob values.
#[test]
fn forks_reading_the_same_unchanged_data_share_the_host_cache() {
    let store = TestStore::with_cache(64 << 20);
    let (data, host) = (store.data_dir(), store.store_host());
    let (bulk, blocks) = (noise(8 << 20, 3), noise(2 << 20, 4));
    {
        let vol = store.open();
        write_file(&vol, b"bulk", &bulk);
        let ino = vol
            .mknod(
                ROOT_INO,
                b"blocks",
                crate::volume::FileKind::File,
                0o644,
                owner(),
                0,
            )
            .unwrap()
            .ino;
        for (i, block) in blocks.chunks(4096).enumerate() {
            vol.write(ino, (i * 4096) as u64, block).unwrap();
        }
        for i in 0..500u64 {
            write_file(&vol, format!("small-{i}").as_bytes(), &noise(1000, i));
        }
        vol.fsync().unwrap();
        vol.tenant().db().flush().unwrap();
        assert!(
            vol.tenant().db().blob_file_count() > 0,
            "4 KiB writes in blob files"
        );
        fork(data, vol.tenant(), "f1", None).unwrap();
        fork(data, vol.tenant(), "f2", None).unwrap();
    }
    let cache = host.block_cache();
    let read_all = |name: &str| {
        let vol = open(&store, name);
        let misses = cache.stats().misses;
        assert!(read_file(&vol, b"bulk").unwrap() == bulk);
        assert!(read_file(&vol, b"blocks").unwrap() == blocks);
        for i in 0..500u64 {
            let small = read_file(&vol, format!("small-{i}").as_bytes()).unwrap();
            assert!(small == noise(1000, i));
        }
        cache.stats().misses - misses
    };
    cache.release(cache.usage());
    let empty = cache.usage();
    let first_misses = read_all("f1");
    let one_copy = cache.usage() - empty;
    assert!(
        one_copy >= 10 << 20,
        "the first fork's read filled the cache: {one_copy}"
    );
    for name in ["f2", "f1"] {
        let misses = read_all(name);
        let grown = cache.usage() - empty - one_copy;
        // Misses left: a blob file's first value of each store (its id is learned as the
        // file opens), and what a store reads at open before its first read.
        assert!(
            misses * 20 < first_misses,
            "{name} missed {misses} lookups, the first fork {first_misses}"
        );
        assert!(
            grown < one_copy / 20,
            "{name}: the cache grew by {grown} over {one_copy}"
        );
    }
}

fn owner() -> crate::volume::Owner {
    crate::volume::Owner { uid: 0, gid: 0 }
}
