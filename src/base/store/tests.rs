//! The base store against real packs and a real encrypted index: record migration, short
//! blocks stored as fragments (dense, read back, damage confined to one fragment, gc that
//! keeps a slot while any fragment in it lives, a kill -9 while fragments wait for their
//! slot).

use super::*;
use crate::base::pack::{FRAGMENT_MAX, HEADER_LEN};
use crate::volume::testing;

fn no_progress(_: Progress) {}

/// The migration of version-1 records recounts `unique_bytes` from the index exactly as
/// the import counted it: partial last blocks, a duplicate block, a hole.
#[test]
fn migration_counts_unique_bytes_as_the_import_did() {
    let f = Fixture::new();
    let (data, host) = (&f.data, &f.host);
    let src = f.dir.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    let block = vec![7u8; 4096];
    let a = [block.as_slice(), &[0u8; 4096], &[3u8; 10]].concat();
    std::fs::write(src.join("a"), &a).unwrap();
    std::fs::write(src.join("d/b"), [block.as_slice(), &[9u8; 33]].concat()).unwrap();
    std::fs::write(src.join("d/c"), vec![5u8; 5000]).unwrap();
    let store = BaseStore::open(data, host).unwrap();
    store.import("m", &src, 4096, &mut |_| {}).unwrap();
    let record = store.record("m").unwrap().unwrap();
    let counted = record.unique_bytes.unwrap();
    assert_eq!(
        counted,
        4096 + 10 + 33 + 5000,
        "the repeated block counts once"
    );
    assert_eq!(store.unique_bytes_of(&record).unwrap(), counted);
    // A version-1 record (no unique_bytes) is migrated when the store opens.
    let mut old = record.clone();
    old.format_version = 1;
    old.unique_bytes = None;
    let mut b = store.index.batch();
    store.put_record(&mut b, &old);
    store.index.write(b).unwrap();
    drop(store);
    let store = BaseStore::open(data, host).unwrap();
    let migrated = store.record("m").unwrap().unwrap();
    assert_eq!(migrated.format_version, FORMAT_VERSION);
    assert_eq!(migrated.unique_bytes, Some(counted));
}

struct Fixture {
    _tmp: Option<tempfile::TempDir>,
    /// The data dir is `data` in it.
    dir: PathBuf,
    data: DataDir,
    host: StoreHost,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("tenantfs-base-store-")
            .tempdir_in("/var/tmp")
            .unwrap();
        Self::at(tmp.path().to_owned(), Some(tmp))
    }

    /// The data dir in `dir`, made if it is not there.
    fn at(dir: PathBuf, tmp: Option<tempfile::TempDir>) -> Self {
        let root = dir.join("data");
        if !root.exists() {
            DataDir::init(&root, None).unwrap();
        }
        let data = DataDir::open(&root, None).unwrap();
        Self {
            _tmp: tmp,
            dir,
            data,
            host: StoreHost::builder().build(),
        }
    }

    fn store(&self) -> BaseStore {
        BaseStore::open(&self.data, &self.host).unwrap()
    }

    fn pack(&self) -> PathBuf {
        self.data.root().join("base/packs/pack-000001.tfp")
    }
}

/// `files` files of 1 to 600 bytes (`seed` makes their content), each ending in a non-zero
/// byte; returns their paths and contents.
fn small_files(dir: &std::path::Path, seed: u64, files: u64) -> Vec<(PathBuf, Vec<u8>)> {
    std::fs::create_dir_all(dir).unwrap();
    (0..files)
        .map(|i| {
            // (`noise` takes odd seeds.)
            let seed = (seed * 100_000 + i) * 2 + 1;
            let n = (testing::noise(2, seed)[1] as usize * 7) % 600 + 1;
            let mut bytes = testing::noise(n, seed);
            *bytes.last_mut().unwrap() |= 1;
            let path = dir.join(format!("f{i:05}"));
            std::fs::write(&path, &bytes).unwrap();
            (path, bytes)
        })
        .collect()
}

/// Every block of `content` reads back from `store`, zero-padded to the block size.
fn reads_back(store: &BaseStore, content: &[u8]) {
    for chunk in content.chunks(4096) {
        let mut block = chunk.to_vec();
        block.resize(4096, 0);
        if block.iter().all(|&b| b == 0) {
            continue;
        }
        let h = *blake3::hash(&block).as_bytes();
        assert_eq!(store.read_block(&h).unwrap(), block);
    }
}

/// Small files and file tails are stored as fragments, several to a slot: the packs take at most
/// twice the small files' bytes beside the whole blocks and the header, `stored_bytes` counts
/// each fragment's bytes, and every block reads back exactly (one at a time and in batches, as a
/// tenant reads them). A tail longer than `FRAGMENT_MAX` keeps a slot of its own.
#[test]
fn short_blocks_are_packed_as_fragments_and_read_back() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    let small = small_files(&src.join("small"), 1, 3000);
    // Tails: 1 byte, FRAGMENT_MAX, FRAGMENT_MAX + 1 (a slot of its own), and a whole block.
    let mut tails = Vec::new();
    for (i, tail) in [1usize, FRAGMENT_MAX, FRAGMENT_MAX + 1, 4096]
        .into_iter()
        .enumerate()
    {
        let mut bytes = testing::noise(4096 + tail, 901 + 2 * i as u64);
        *bytes.last_mut().unwrap() |= 1;
        std::fs::write(src.join(format!("tail{i}")), &bytes).unwrap();
        tails.push(bytes);
    }
    let store = f.store();
    let info = store.import("small", &src, 4096, &mut no_progress).unwrap();
    let small_bytes: u64 = small.iter().map(|(_, b)| b.len() as u64).sum();
    // Whole slots: one per tail file's first block, FRAGMENT_MAX + 1's tail, the last file's
    // second.
    let whole = 4 + 1 + 1;
    let fragments_bytes = small_bytes + 1 + FRAGMENT_MAX as u64;
    assert_eq!(info.stored_bytes, whole * 4096 + fragments_bytes);
    let host = store.list().unwrap().host;
    assert_eq!(host.stored_bytes, info.stored_bytes);
    assert!(
        host.pack_bytes <= HEADER_LEN + whole * 4096 + 2 * fragments_bytes,
        "packs take {} bytes for {fragments_bytes} bytes of fragments and {whole} whole blocks",
        host.pack_bytes
    );
    for (_, content) in &small {
        reads_back(&store, content);
    }
    for content in &tails {
        reads_back(&store, content);
    }
    let v = store.verify().unwrap();
    assert!(v.is_clean(), "{v:?}");
    assert_eq!(v.blocks, 3000 + 4 + 4);

    // A tenant of the base reads its files whole: many fragments of one page in one batch.
    store.create_tenant(&f.data, &f.host, "t", "small").unwrap();
    let tenant = crate::tenants::open(&f.data, &f.host, "t").unwrap();
    let volume =
        crate::base::open_volume(&f.data, tenant, None, crate::volume::Opening::Fresh).unwrap();
    for (path, content) in small.iter().take(200) {
        let rel = path.strip_prefix(&src).unwrap();
        let dir = volume
            .lookup(
                crate::volume::ROOT_INO,
                rel.parent().unwrap().as_os_str().as_encoded_bytes(),
            )
            .unwrap();
        let file = volume
            .lookup(dir.ino, rel.file_name().unwrap().as_encoded_bytes())
            .unwrap();
        assert_eq!(&volume.read(file.ino, 0, 8192).unwrap(), content);
    }
}

/// A flipped byte in one fragment fails that block and no other of its slot; `verify` names it.
#[test]
fn a_flipped_byte_in_a_fragment_fails_that_block_only() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    let small = small_files(&src, 2, 40);
    let store = f.store();
    store.import("b", &src, 4096, &mut no_progress).unwrap();
    // The fragments follow each other in the first slot in import order (names sorted):
    // flip the last byte of the third file's.
    let at: usize = small[..3].iter().map(|(_, b)| b.len()).sum::<usize>() - 1;
    drop(store);
    let mut bytes = std::fs::read(f.pack()).unwrap();
    bytes[HEADER_LEN as usize + at] ^= 0x40;
    std::fs::write(f.pack(), &bytes).unwrap();
    let store = f.store();
    let v = store.verify().unwrap();
    assert_eq!((v.blocks, v.bad.len(), v.missing), (40, 1, 0), "{v:?}");
    let mut damaged = small[2].1.clone();
    damaged.resize(4096, 0);
    assert!(
        v.bad[0].starts_with(&hex::encode(blake3::hash(&damaged).as_bytes())),
        "{v:?}"
    );
    for (i, (_, content)) in small.iter().enumerate() {
        if i != 2 {
            reads_back(&store, content);
        }
    }
    let e = store
        .read_block(blake3::hash(&damaged).as_bytes())
        .unwrap_err();
    assert!(matches!(e, BaseError::BlockCorrupt { .. }), "{e}");
}

/// A slot stays while any fragment in it is live: a base that shares a fragment with a deleted one
/// keeps reading it after `gc`; the slot goes when its last fragment does.
#[test]
fn gc_keeps_a_slot_while_any_fragment_in_it_lives() {
    let f = Fixture::new();
    let (a, b) = (f.dir.join("a"), f.dir.join("b"));
    let files = small_files(&a, 3, 50);
    std::fs::create_dir_all(&b).unwrap();
    // b holds one of a's files (the same block: the same fragment) and nothing else.
    std::fs::copy(&files[25].0, b.join("shared")).unwrap();
    let store = f.store();
    store.import("a", &a, 4096, &mut no_progress).unwrap();
    let slots = (store.list().unwrap().host.pack_bytes - HEADER_LEN) / 4096;
    assert!(slots > 1, "a's fragments take {slots} slots");
    store.import("b", &b, 4096, &mut no_progress).unwrap();
    assert_eq!(
        store.list().unwrap().host.pack_bytes,
        HEADER_LEN + slots * 4096,
        "b stored nothing new"
    );
    store.delete("a").unwrap();
    let gc = store.gc(&mut no_progress).unwrap();
    assert_eq!((gc.live_blocks, gc.garbage_slots), (1, slots - 1), "{gc:?}");
    assert_eq!(store.list().unwrap().host.pack_bytes, HEADER_LEN + 4096);
    reads_back(&store, &files[25].1);
    assert!(store.verify().unwrap().is_clean());
    store.delete("b").unwrap();
    let gc = store.gc(&mut no_progress).unwrap();
    assert_eq!(gc.live_blocks, 0, "{gc:?}");
    assert_eq!(store.list().unwrap().host.pack_bytes, HEADER_LEN);
}

const KILL_ENV: &str = "TENANTFS_TEST_BASE_FRAGMENTS_CHILD";
const KILL_TEST: &str = "base::store::tests::an_import_killed_while_fragments_wait_is_rolled_back";

/// An import killed (kill -9) after an index batch that names fragments whose slot was not yet
/// written (their records wait for it) is rolled back at the next open: nothing dangles,
/// `verify` is clean, and the import run again stores and reads every file.
#[test]
fn an_import_killed_while_fragments_wait_is_rolled_back() {
    if let Ok(dir) = std::env::var(KILL_ENV) {
        let f = Fixture::at(PathBuf::from(dir), None);
        testing::park_at_failpoint("base-import-flushed", 1);
        let store = f.store();
        testing::say("FRAGMENTS import");
        let _ = store.import("s", &f.dir.join("src"), 4096, &mut no_progress);
        return;
    }
    let f = Fixture::new();
    let small = small_files(&f.dir.join("src"), 4, 3000);
    let said =
        testing::killed_where_parked(KILL_TEST, (KILL_ENV, f.dir.to_str().unwrap()), "FRAGMENTS");
    assert!(
        said.len() == 1 && said[0].ends_with("FRAGMENTS import"),
        "the child parked after a flush: {said:?}"
    );
    // The child left slots written (full fragment slots, their records in the batch after
    // them) and references and entries of the fragments of the open slot, without records.
    let written = std::fs::metadata(f.pack()).unwrap().len();
    assert!(
        written > HEADER_LEN,
        "the child wrote no slot before it parked"
    );
    let store = f.store();
    assert!(store.list().unwrap().bases.is_empty(), "rolled back");
    let v = store.verify().unwrap();
    assert!(v.is_clean() && v.blocks == 0, "{v:?}");
    store
        .import("s", &f.dir.join("src"), 4096, &mut no_progress)
        .unwrap();
    for (_, content) in &small {
        reads_back(&store, content);
    }
    assert!(store.verify().unwrap().is_clean());
}
