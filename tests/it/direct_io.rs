//! With direct I/O on, reading a tenant's whole data set twice leaves its SST files (almost)
//! absent from the page cache, as measured by fincore(1) (mincore(2) under the hood); a full
//! disk never turns direct I/O off.

use crate::common;
use crate::common::guards::{small_ext4, FsMount};

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
    FsMount,
    std::path::PathBuf,
    std::path::PathBuf,
    tenantfs::data_dir::DataDir,
) {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("tenantfs-{prefix}-"))
        .tempdir_in("/var/tmp")
        .unwrap();
    let (fs, disk) = small_ext4(tmp.path(), 64 << 20);
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

/// Deletes the file `fill` made and waits (up to 10 s) until the store takes writes again.
fn free_filler_and_resume(fs: &Path, db: &tenantfs::store::TenantDb) {
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
    free_filler_and_resume(&fs, db);
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

/// `(key, value)` pairs of odd sizes (3 KiB to 200 KiB, so blob values; their pieces straddle
/// the 1 MiB direct-write buffers and leave partial pages that the next piece rewrites), from
/// a fixed seed, `total` bytes in all.
fn odd_values(total: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::new();
    let mut bytes = 0;
    while bytes < total {
        let len = 3 * 1024 + (next() % (197 * 1024)) as usize;
        let fill = next();
        let value: Vec<u8> = (0..len)
            .map(|i| (fill >> (i % 8 * 8)) as u8 ^ i as u8)
            .collect();
        bytes += len;
        out.push((format!("v{:06}", out.len()).into_bytes(), value));
    }
    out
}

/// Flush and compaction outputs (SST and blob files) are written by the shim's pipelined
/// direct writes (`src/store/pipelined_writes.cc`: encrypted into buffers of their own and
/// written by a thread per file, in order, while the flush goes on). Values of odd sizes,
/// flushed in several memtables, compacted and read back from a reopened store, with the
/// block cache cold: every byte is where it was written.
#[test]
fn pipelined_direct_writes_read_back_after_reopen() {
    let t = TestHost::new(DirectIo::Auto);
    let host = &t.host;
    tenants::create(&t.data, host, "p", None).unwrap();
    let values = odd_values(40 << 20);
    let pipelined = tenantfs::store::layout::pipelined_files();
    {
        let tenant = tenants::open(&t.data, host, "p").unwrap();
        let db = tenant.db();
        assert!(db.direct_io(), "this test is about direct writes");
        for (n, part) in values.chunks(values.len() / 4).enumerate() {
            let mut b = db.batch();
            for (k, v) in part {
                b.put(Family::Extents, k, v);
            }
            db.write_unlogged(b).unwrap();
            db.flush().unwrap();
            if n == 1 {
                db.compact().unwrap();
            }
        }
        let blobs = db.blob_space();
        assert!(
            blobs.bytes >= 40 << 20,
            "the values did not go to blob files: {blobs:?}"
        );
        // 4 flushes (an SST and a blob file each) and a compaction's outputs, at least.
        let files = tenantfs::store::layout::pipelined_files() - pipelined;
        assert!(files >= 8, "only {files} files went through the pipeline");
    }
    let tenant = tenants::open(&t.data, host, "p").unwrap();
    for (k, v) in &values {
        let got = tenant.db().get(Family::Extents, k).unwrap();
        assert!(
            got.as_deref() == Some(&v[..]),
            "value {} ({} bytes) reads back wrong",
            String::from_utf8_lossy(k),
            v.len()
        );
    }
}

/// A flush that runs out of disk in the middle of its blob file: the pipelined writer's
/// failure (on its own thread, after the flush went on) is reported at the file's close, the
/// flush fails, the store stops as out of space, and once space is free it resumes and the
/// values are all there, after a reopen too. A writer that dropped the failure would have let
/// the flush install a truncated blob file.
#[test]
fn a_full_disk_during_a_blob_flush_loses_nothing() {
    let (_tmp, _disk, fs, _root, data) = data_dir_on_small_disk("fullblob");
    let host = tenantfs::store::StoreHost::builder().build();
    tenants::create(&data, &host, "full", None).unwrap();
    let values = odd_values(12 << 20);
    let check = |db: &tenantfs::store::TenantDb| {
        for (k, v) in &values {
            let got = db.get(Family::Extents, k).unwrap();
            assert!(got.as_deref() == Some(&v[..]), "{k:?} reads back wrong");
        }
    };
    {
        let tenant = tenants::open(&data, &host, "full").unwrap();
        let db = tenant.db();
        db.put(Family::Meta, b"first", b"1").unwrap();
        fill(&fs);
        // Room for the blob file's header and its first pieces, not for the whole file.
        let filler = std::fs::OpenOptions::new()
            .write(true)
            .open(fs.join("filler"))
            .unwrap();
        let len = filler.metadata().unwrap().len();
        filler.set_len(len - (3 << 20)).unwrap();
        filler.sync_all().unwrap();
        drop(filler);
        let mut b = db.batch();
        for (k, v) in &values {
            b.put(Family::Extents, k, v);
        }
        db.write_unlogged(b).unwrap();
        assert!(db.flush().is_err(), "a 12 MiB flush into 3 MiB succeeded");
        let tenantfs::store::StoreState::NoSpace { .. } = db.state() else {
            panic!(
                "the failed blob write did not stop the store: {:?}",
                db.state()
            )
        };
        free_filler_and_resume(&fs, db);
        db.flush().unwrap();
        check(db);
    }
    let tenant = tenants::open(&data, &host, "full").unwrap();
    check(tenant.db());
    assert_eq!(
        tenant.db().get(Family::Meta, b"first").unwrap().as_deref(),
        Some(&b"1"[..])
    );
}
