//! With direct I/O on, reading a tenant's whole data set twice leaves its SST files (almost)
//! absent from the page cache, as measured by fincore(1) (mincore(2) under the hood); a full
//! disk never turns direct I/O off.

mod common;
#[path = "common/mount.rs"]
mod mount;

use std::path::Path;
use std::process::Command;

use common::{files_under, noise, TestHost};
use tenantfs::store::{DirectIo, Family};
use tenantfs::tenants;

/// (resident bytes, size) of a file in the page cache.
fn residency(path: &Path) -> (u64, u64) {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "--output", "RES,SIZE"])
        .arg(path)
        .output()
        .expect("fincore (util-linux) is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut it = text.split_whitespace().map(|s| s.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

fn sst_residency(mode: DirectIo) -> (u64, u64) {
    let t = TestHost::new(mode);
    tenants::create(&t.data, &t.host, "reader", None).unwrap();
    let n = 16_000u64; // ~64 MiB of 4 KiB values: larger than the 64 MiB cache with overheads
    {
        let tenant = tenants::open(&t.data, &t.host, "reader").unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut b = tenant.db().batch();
            for &i in chunk {
                b.put(Family::Extents, &i.to_be_bytes(), &noise(i, 4096));
            }
            tenant.db().write(b).unwrap();
        }
        tenant.db().flush().unwrap();
        tenant.db().compact().unwrap();
    }
    let tenant = tenants::open(&t.data, &t.host, "reader").unwrap();
    for _ in 0..2 {
        for i in 0..n {
            let v = tenant.db().get(Family::Extents, &i.to_be_bytes()).unwrap();
            assert_eq!(v.unwrap().len(), 4096);
        }
        assert_eq!(
            tenant
                .db()
                .scan(Family::Extents, b"", usize::MAX)
                .unwrap()
                .len() as u64,
            n
        );
    }
    files_under(&t.root)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "sst" || e == "blob"))
        .map(|p| residency(p))
        .fold((0, 0), |(r, s), (r2, s2)| (r + r2, s + s2))
}

#[test]
fn direct_io_keeps_ssts_out_of_page_cache() {
    let (resident, size) = sst_residency(DirectIo::Auto);
    assert!(
        size > 50 << 20,
        "SSTs and blob files hold only {size} bytes"
    );
    assert!(
        resident * 100 < size,
        "{resident} of {size} SST bytes resident in the page cache (limit 1%)"
    );
}

/// The control: the same workload on buffered I/O does fill the page cache, so the check above
/// measures something.
#[test]
fn buffered_io_fills_page_cache() {
    let (resident, size) = sst_residency(DirectIo::Off);
    assert!(
        resident * 2 > size,
        "buffered reads left only {resident} of {size} bytes resident"
    );
}

/// A data dir on a 64 MiB ext4 of its own: (temp dir, mount guard, filesystem root, data dir
/// root, data dir). Drop the stores first: they are declared after.
fn data_dir_on_small_disk(
    prefix: &str,
) -> (
    tempfile::TempDir,
    mount::FsMount,
    std::path::PathBuf,
    std::path::PathBuf,
    tenantfs::data_dir::DataDir,
) {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("tenantfs-{prefix}-"))
        .tempdir_in("/var/tmp")
        .unwrap();
    let (fs, disk) = mount::small_ext4(tmp.path(), 64 << 20);
    let root = fs.join("data");
    tenantfs::data_dir::DataDir::init(&root, None).unwrap();
    let data = tenantfs::data_dir::DataDir::open(&root, None).unwrap();
    (tmp, disk, fs, root, data)
}

/// Fills the filesystem holding `dir`: a file of 1 MiB writes, then 4 KiB ones, until ENOSPC.
fn fill(dir: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    for chunk in [1 << 20, 4096] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write_all(&buf).and_then(|()| f.sync_all()) {
                Ok(()) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", dir.display()),
            }
        }
    }
}

/// On a full filesystem the probe still finds O_DIRECT (the write probe has no room; an aligned
/// read of a store file answers instead), and opening or creating a store (RocksDB writes a new
/// WAL and MANIFEST at open) fails with a clear "no space" error: a full disk is never a reason
/// to fall back to buffered I/O.
#[test]
fn a_full_disk_keeps_direct_io() {
    let (_tmp, _disk, fs, root, data) = data_dir_on_small_disk("fulldio");
    let host = || tenantfs::store::StoreHost::builder().build(); // each with no probe memory
    tenants::create(&data, &host(), "a", None).unwrap();
    fill(&fs);
    let db = root.join("tenants/a/db");
    match tenantfs::store::direct_io::probe(&db).unwrap() {
        tenantfs::store::direct_io::Support::Supported => {}
        other => panic!("a full disk made the probe answer {other:?}"),
    }
    for err in [
        tenants::open(&data, &host(), "a")
            .err()
            .expect("no room to open"),
        tenants::create(&data, &host(), "b", None).expect_err("no room to create"),
    ] {
        let text = err.to_string();
        assert!(
            text.contains("no space left") && text.contains("free space"),
            "unclear error: {text}"
        );
    }
}

/// A store whose background flush fails on a full disk is reported by RocksDB's listener (the
/// shim's `HealthListener` on the store's options; nothing on the write path saw an error):
/// read-only, with the space it needs. Once that space is free, `try_resume` (RocksDB's
/// `DB::Resume` through the shim) makes it take writes again.
#[test]
fn a_full_disk_stops_a_store_until_it_is_resumed() {
    use tenantfs::store::{Family, StoreState, TenantDb};
    let (_tmp, _disk, fs, _root, data) = data_dir_on_small_disk("fullstore");
    let host = tenantfs::store::StoreHost::builder().build();
    tenants::create(&data, &host, "full", None).unwrap();
    let tenant = tenants::open(&data, &host, "full").unwrap();
    let db = tenant.db();
    // The WAL now has a preallocated step with room for a small write.
    db.put(Family::Meta, b"first", b"1").unwrap();
    fill(&fs);
    db.put(Family::Meta, b"second", b"2").unwrap();
    assert_eq!(db.state(), StoreState::Writable);
    assert!(db.flush().is_err(), "a flush on a full disk succeeded");
    let StoreState::NoSpace { .. } = db.state() else {
        panic!("the listener did not report the stop: {:?}", db.state())
    };
    assert!(db.put(Family::Meta, b"third", b"3").is_err());
    assert!(!db.try_resume(), "resumed with no space free");
    let StoreState::NoSpace {
        needs_free_bytes, ..
    } = db.state()
    else {
        panic!("{:?}", db.state())
    };
    assert!(needs_free_bytes >= 2 << 20, "{needs_free_bytes}");
    std::fs::remove_file(fs.join("filler")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !db.try_resume() {
        assert!(
            std::time::Instant::now() < deadline,
            "never resumed: {:?}",
            db.state()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(db.state(), StoreState::Writable);
    db.put(Family::Meta, b"third", b"3").unwrap();
    db.flush().unwrap();
    let check = |db: &TenantDb| {
        for (k, v) in [(&b"first"[..], b"1"), (b"second", b"2"), (b"third", b"3")] {
            assert_eq!(db.get(Family::Meta, k).unwrap().as_deref(), Some(&v[..]));
        }
    };
    check(db);
    // The WAL whose creation failed leaves nothing that stops the next open.
    drop(tenant);
    let tenant = tenants::open(&data, &host, "full").unwrap();
    check(tenant.db());
}
