//! Every byte RocksDB writes for a tenant is encrypted; a wrong key changes nothing; a damaged
//! SST never returns wrong data. Each runs with direct I/O and with the buffered fallback forced.

use crate::common;

use common::{contains, files_under, noise, snapshot, TestHost};
use tenantfs::data_dir::{DataDir, DataDirError};
use tenantfs::store::{DirectIo, Family, StoreError};
use tenantfs::tenants::{self, TenantError};

const MARKER: &[u8] = b"TENANTFS-PLAINTEXT-MARKER-7f3a9c";

fn value(i: u64) -> Vec<u8> {
    let mut v = MARKER.to_vec();
    v.extend_from_slice(&i.to_be_bytes());
    v.extend(noise(i, 4000));
    v
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

fn hundred_mib_leaves_no_plaintext(mode: DirectIo) {
    let t = TestHost::new(mode);
    tenants::create(&t.data, &t.host, "alpha", None).unwrap();
    let n = (100u64 << 20) / 4048;
    {
        let tenant = tenants::open(&t.data, &t.host, "alpha").unwrap();
        assert_eq!(tenant.db().direct_io(), mode == DirectIo::Auto);
        let db = tenant.db();
        for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
            let mut batch = db.batch();
            for &i in chunk {
                batch.put(Family::Extents, &key(i), &value(i));
            }
            batch.put(Family::Meta, b"last", &chunk[chunk.len() - 1].to_be_bytes());
            db.write(batch).unwrap();
        }
        db.sync().unwrap();
        db.flush().unwrap();
        db.compact().unwrap();
    }

    let (mut seen_sst, mut seen_blob) = (false, false);
    let mut total = 0u64;
    for path in files_under(&t.root) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            !name.starts_with("LOG"),
            "RocksDB info log written: {path:?}"
        );
        seen_sst |= name.ends_with(".sst");
        seen_blob |= name.ends_with(".blob");
        let bytes = std::fs::read(&path).unwrap();
        total += bytes.len() as u64;
        assert!(!contains(&bytes, MARKER), "plaintext marker in {path:?}");
        for plain in [&b"BytewiseComparator"[..], b"rocksdb.", b"key-0000"] {
            assert!(
                !contains(&bytes, plain),
                "RocksDB plaintext {plain:?} in {path:?}"
            );
        }
    }
    assert!(seen_sst, "no SST written");
    assert!(seen_blob, "file data (4 KiB values) not in blob files");
    assert!(total > 90 << 20, "only {total} bytes at rest");

    // Reopen: every value comes back.
    let tenant = tenants::open(&t.data, &t.host, "alpha").unwrap();
    for i in 0..n {
        assert_eq!(
            tenant.db().get(Family::Extents, &key(i)).unwrap().unwrap(),
            value(i)
        );
    }
    assert_eq!(
        tenant.db().get(Family::Meta, b"last").unwrap().unwrap(),
        (n - 1).to_be_bytes()
    );
}

#[test]
fn hundred_mib_leaves_no_plaintext_direct() {
    hundred_mib_leaves_no_plaintext(DirectIo::Auto);
}

#[test]
fn hundred_mib_leaves_no_plaintext_buffered() {
    hundred_mib_leaves_no_plaintext(DirectIo::Off);
}

#[test]
fn wrong_master_key_fails_and_changes_nothing() {
    let t = TestHost::new(DirectIo::Auto);
    tenants::create(&t.data, &t.host, "alpha", None).unwrap();
    {
        let tenant = tenants::open(&t.data, &t.host, "alpha").unwrap();
        tenant.db().put(Family::Meta, b"k", b"v").unwrap();
        tenant.db().flush().unwrap();
    }
    let before = snapshot(&t.root);

    // A different key file is refused by the data dir's key check.
    let other = t.tmp.path().join("other.key");
    std::fs::write(&other, "11".repeat(32)).unwrap();
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let err = DataDir::open(&t.root, Some(&other))
        .err()
        .expect("wrong key accepted");
    assert!(matches!(err, DataDirError::WrongKey { .. }), "{err}");
    assert!(err.to_string().contains("nothing was changed"), "{err}");

    // A tenant moved under another data dir (another master key) does not open either.
    let root2 = t.tmp.path().join("data2");
    DataDir::init(&root2, Some(&other)).unwrap();
    let data2 = DataDir::open(&root2, Some(&other)).unwrap();
    let moved = data2.tenants_dir().join("alpha");
    let original = t.data.tenants_dir().join("alpha");
    std::fs::rename(&original, &moved).unwrap();
    let err = tenants::open(&data2, &t.host, "alpha")
        .err()
        .expect("opened with wrong key");
    assert!(
        matches!(err, TenantError::WrongKey(ref n) if n == "alpha"),
        "{err}"
    );
    std::fs::rename(&moved, &original).unwrap();

    assert_eq!(snapshot(&t.root), before, "files at rest changed");
    let tenant = tenants::open(&t.data, &t.host, "alpha").unwrap();
    assert_eq!(tenant.db().get(Family::Meta, b"k").unwrap().unwrap(), b"v");
}

/// Reads keys `0..n` of `tenant`: each returns `want(i)` or fails as corrupt, naming the
/// tenant; never other bytes, never missing. Returns how many failed.
fn reads_failing_as_corrupt(
    tenant: &tenants::Tenant,
    name: &str,
    n: u64,
    want: impl Fn(u64) -> Vec<u8>,
) -> usize {
    let mut failures = 0;
    for i in 0..n {
        match tenant.db().get(Family::Extents, &key(i)) {
            Ok(Some(v)) => assert_eq!(v, want(i), "wrong data for key {i}"),
            Ok(None) => panic!("key {i} silently missing"),
            Err(e) => {
                assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
                assert!(e.to_string().contains(&format!("tenant {name}")), "{e}");
                failures += 1;
            }
        }
    }
    failures
}

fn flipped_sst_byte_never_returns_wrong_data(mode: DirectIo) {
    let t = TestHost::new(mode);
    tenants::create(&t.data, &t.host, "beta", None).unwrap();
    let n = 5000u64;
    {
        let tenant = tenants::open(&t.data, &t.host, "beta").unwrap();
        let mut batch = tenant.db().batch();
        for i in 0..n {
            batch.put(Family::Extents, &key(i), &value(i)[..300]);
        }
        tenant.db().write(batch).unwrap();
        tenant.db().flush().unwrap();
        tenant.db().compact().unwrap();
    }
    let sst: Vec<_> = files_under(&t.root)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "sst"))
        .filter(|p| std::fs::metadata(p).unwrap().len() > 100_000)
        .collect();
    assert_eq!(sst.len(), 1, "{sst:?}");
    let mut bytes = std::fs::read(&sst[0]).unwrap();
    // Inside the body (past the 4 KiB header), in the first data blocks.
    bytes[4096 + 1000] ^= 0x20;
    std::fs::write(&sst[0], &bytes).unwrap();
    // The compaction put the blocks it wrote into the cache (where a read would find the
    // right bytes): the reads below must come from the damaged file.
    t.host.block_cache().release(usize::MAX);

    let tenant = tenants::open(&t.data, &t.host, "beta").unwrap();
    let failures = reads_failing_as_corrupt(&tenant, "beta", n, |i| value(i)[..300].to_vec());
    assert!(failures > 0, "a flipped byte went unnoticed");
    // A scan over the damaged range fails too, naming the tenant.
    let err = tenant
        .db()
        .scan(Family::Extents, b"", n as usize)
        .unwrap_err();
    assert!(
        err.is_corruption() && err.to_string().contains("tenant beta"),
        "{err}"
    );
}

#[test]
fn flipped_sst_byte_never_returns_wrong_data_direct() {
    flipped_sst_byte_never_returns_wrong_data(DirectIo::Auto);
}

#[test]
fn flipped_sst_byte_never_returns_wrong_data_buffered() {
    flipped_sst_byte_never_returns_wrong_data(DirectIo::Off);
}

/// File data lives in blob files: a flipped byte there fails the blob's checksum, never
/// returns other bytes.
fn flipped_blob_byte_never_returns_wrong_data(mode: DirectIo) {
    let t = TestHost::new(mode);
    tenants::create(&t.data, &t.host, "gamma", None).unwrap();
    let n = 500u64;
    {
        let tenant = tenants::open(&t.data, &t.host, "gamma").unwrap();
        let mut batch = tenant.db().batch();
        for i in 0..n {
            batch.put(Family::Extents, &key(i), &value(i));
        }
        tenant.db().write(batch).unwrap();
        tenant.db().flush().unwrap();
    }
    let blobs: Vec<_> = files_under(&t.root)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blob"))
        .collect();
    assert_eq!(blobs.len(), 1, "{blobs:?}");
    let mut bytes = std::fs::read(&blobs[0]).unwrap();
    bytes[4096 + 100_000] ^= 0x04;
    std::fs::write(&blobs[0], &bytes).unwrap();
    // Cached bytes are found again by the store opened anew (keys name files, not stores):
    // the reads below must come from the damaged file.
    t.host.block_cache().release(usize::MAX);

    let tenant = tenants::open(&t.data, &t.host, "gamma").unwrap();
    let failures = reads_failing_as_corrupt(&tenant, "gamma", n, value);
    assert_eq!(failures, 1, "one damaged value, found by its checksum");
}

#[test]
fn flipped_blob_byte_never_returns_wrong_data_direct() {
    flipped_blob_byte_never_returns_wrong_data(DirectIo::Auto);
}

#[test]
fn flipped_blob_byte_never_returns_wrong_data_buffered() {
    flipped_blob_byte_never_returns_wrong_data(DirectIo::Off);
}

#[test]
fn tenant_in_use_cannot_be_opened_twice_or_deleted() {
    let t = TestHost::new(DirectIo::Auto);
    tenants::create(&t.data, &t.host, "gamma", None).unwrap();
    let open = tenants::open(&t.data, &t.host, "gamma").unwrap();
    let err = tenants::open(&t.data, &t.host, "gamma").err().unwrap();
    assert!(matches!(err, TenantError::InUse(_)), "{err}");
    let err = tenants::delete(&t.data, "gamma").unwrap_err();
    assert!(matches!(err, TenantError::InUse(_)), "{err}");
    drop(open);
    tenants::delete(&t.data, "gamma").unwrap();
    assert!(tenants::list(&t.root).unwrap().is_empty());
    let err = tenants::open(&t.data, &t.host, "gamma").err().unwrap();
    assert!(matches!(err, TenantError::Unknown { .. }), "{err}");
}

/// Bulk file data (1 MiB writes) lives in extent files beside the store: they are encrypted
/// like every store file (no plaintext), and a flipped byte in one fails that chunk's checksum
/// as a corruption, never returns other bytes, while the rest of the file reads back.
fn extent_files_hold_no_plaintext_and_detect_damage(mode: DirectIo) {
    use tenantfs::volume::{FileKind, Owner, Volume, VolumeError, ROOT_INO};
    let t = TestHost::new(mode);
    tenants::create(&t.data, &t.host, "delta", None).unwrap();
    let len = 8usize << 20;
    let mut model = Vec::with_capacity(len);
    for i in 0..(len / 4096) as u64 {
        let mut block = MARKER.to_vec();
        block.extend(noise(i, 4096 - MARKER.len()));
        model.extend_from_slice(&block);
    }
    let open = || Volume::open(tenants::open(&t.data, &t.host, "delta").unwrap()).unwrap();
    let ino = {
        let vol = open();
        let owner = Owner { uid: 0, gid: 0 };
        let ino = vol
            .mknod(ROOT_INO, b"bulk", FileKind::File, 0o644, owner, 0)
            .unwrap()
            .ino;
        for (i, piece) in model.chunks(1 << 20).enumerate() {
            vol.write(ino, (i << 20) as u64, piece).unwrap();
        }
        vol.fsync().unwrap();
        ino
    };
    let extent_files: Vec<_> = files_under(&t.root)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "ext"))
        .collect();
    assert!(!extent_files.is_empty(), "no extent file written");
    let mut extent_bytes = 0;
    for path in files_under(&t.root) {
        let bytes = std::fs::read(&path).unwrap();
        assert!(!contains(&bytes, MARKER), "plaintext marker in {path:?}");
        if path.extension().is_some_and(|e| e == "ext") {
            extent_bytes += bytes.len();
        }
    }
    assert!(
        extent_bytes >= len,
        "only {extent_bytes} bytes in extent files"
    );

    // One flipped byte, 100 KiB into the first extent file's body (its second chunk).
    let mut bytes = std::fs::read(&extent_files[0]).unwrap();
    bytes[4096 + 100_000] ^= 0x04;
    std::fs::write(&extent_files[0], &bytes).unwrap();
    // Cached bytes are found again by the store opened anew (keys name files, not stores):
    // the reads below must come from the damaged file.
    t.host.block_cache().release(usize::MAX);
    let vol = open();
    let (mut failed, mut good) = (0, 0);
    for at in (0..len).step_by(64 << 10) {
        match vol.read(ino, at as u64, 64 << 10) {
            Ok(back) => {
                assert!(back == model[at..at + (64 << 10)], "wrong data at {at}");
                good += 1;
            }
            Err(VolumeError::Store(e)) => {
                assert!(e.is_corruption(), "{e}");
                assert!(e.to_string().contains("checksum"), "{e}");
                failed += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(failed, 1, "one damaged chunk, found by its checksum");
    assert_eq!(good, len / (64 << 10) - 1);
}

#[test]
fn extent_files_hold_no_plaintext_and_detect_damage_direct() {
    extent_files_hold_no_plaintext_and_detect_damage(DirectIo::Auto);
}

#[test]
fn extent_files_hold_no_plaintext_and_detect_damage_buffered() {
    extent_files_hold_no_plaintext_and_detect_damage(DirectIo::Off);
}
