//! The store's blob cache keys, against a real encrypted store reopened.

use super::*;

/// A blob value's cache key names its file by the id in the file's header once the
/// store's Env has opened or written it (RocksDB's key of the session before that), in
/// every session of the store: RocksDB's keys have the shape `BlobCacheKeys` turns back
/// into a file number and offset.
#[test]
fn blob_values_are_cached_under_their_files_id_in_every_session() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let host = StoreHost::builder().block_cache_bytes(8 << 20).build();
    let Encryption::Tenant(ring) =
        Encryption::of_key(crate::crypto::TenantKey::generate().unwrap())
    else {
        unreachable!()
    };
    let path = dir.path().join("db");
    let open = |mode| TenantDb::open(&host, "t", &path, Encryption::Tenant(ring.clone()), mode);
    let db = open(OpenMode::Create).unwrap();
    assert_eq!(db.blob_cache_key_for(7, 4096).len(), 16, "no blob file yet");
    db.put(Family::Extents, b"k", &[5u8; 4096]).unwrap();
    db.flush().unwrap();
    let blob = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "blob"))
        .expect("a blob file");
    let number: u64 = blob.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    let header = std::fs::read(&blob).unwrap();
    let id = super::super::file_key::file_id(&header[..super::super::FILE_HEADER_LEN]);
    let id = id.unwrap();
    let check = |db: &TenantDb| {
        assert_eq!(db.get(Family::Extents, b"k").unwrap().unwrap(), [5u8; 4096]);
        for offset in [0, 4096, 1 << 33] {
            let k = db.blob_cache_key_for(number, offset);
            assert_eq!(k.len(), 28);
            assert_eq!(&k[..4], b"tfb\0");
            assert_eq!(&k[4..20], &id);
            assert_eq!(&k[20..], &offset.to_be_bytes());
        }
        assert_eq!(db.blob_cache_key_for(number + 1, 0).len(), 16);
    };
    check(&db);
    drop(db);
    // Reopened (a new session): the file's id is learned once its reader opens it.
    check(&open(OpenMode::Existing).unwrap());
}
