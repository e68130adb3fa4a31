//! 50 tenants from one base, each reading the same 256 MiB of base files in one process: the
//! host block cache holds that data once (its numbers and the process's RSS show about
//! 256 MiB, not 50 times that), and every read is right.
//!
//! In one process through the library (the host daemon that serves many mounts from one
//! process is issue 6); the mount path is covered by tests/base_tenants.rs.

use crate::common;

use std::sync::Arc;

use common::noise;

use tenantfs::base::{BaseBlockReader, BaseStore};
use tenantfs::cache::{process_rss_bytes, HostCache};
use tenantfs::data_dir::DataDir;
use tenantfs::store::StoreHost;
use tenantfs::volume::{Volume, ROOT_INO};

const MIB: u64 = 1 << 20;
const FILES: u64 = 64;
const FILE_BYTES: u64 = 4 * MIB;
const TENANTS: usize = 50;

#[test]
fn fifty_tenants_share_one_cached_copy_of_their_base() {
    // It bounds the RSS growth of the process: measured with no other test beside it.
    crate::alone_in_a_process!("fifty_tenants_share_one_cached_copy_of_their_base");
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-shared-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().join("data");
    DataDir::init(&root, None).unwrap();
    let data = DataDir::open(&root, None).unwrap();
    let cache = Arc::new(HostCache::new(512 * MIB));
    let host = StoreHost::builder()
        .block_cache(cache.rocksdb().clone())
        .write_buffer_bytes(16 << 20)
        .build();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut hashes = Vec::new();
    for f in 0..FILES {
        let bytes = noise(f, FILE_BYTES as usize);
        hashes.push(blake3::hash(&bytes));
        std::fs::write(src.join(format!("f{f:02}")), bytes).unwrap();
    }
    let base = BaseStore::open(&data, &host).unwrap();
    base.import("img", &src, 4096, &mut |_| {}).unwrap();
    for t in 0..TENANTS {
        base.create_tenant(&data, &host, &format!("t{t:02}"), "img")
            .unwrap();
    }
    drop(base);
    let reader = Arc::new(BaseBlockReader::new(&data, Some(cache.clone())).unwrap());
    let volumes: Vec<Volume> = (0..TENANTS)
        .map(|t| {
            let tenant = tenantfs::tenants::open(&data, &host, &format!("t{t:02}")).unwrap();
            Volume::open(tenant).unwrap().with_base(reader.clone())
        })
        .collect();
    let rss_before = process_rss_bytes().unwrap();
    for v in &volumes {
        let entries = v.readdir(ROOT_INO).unwrap();
        assert_eq!(entries.len() as u64, FILES);
        for (i, e) in entries.iter().enumerate() {
            let mut h = blake3::Hasher::new();
            let mut off = 0;
            while off < FILE_BYTES {
                let chunk = v.read(e.ino, off, MIB as u32).unwrap();
                assert_eq!(chunk.len() as u64, MIB);
                h.update(&chunk);
                off += MIB;
            }
            assert_eq!(
                h.finalize(),
                hashes[i],
                "{} of a tenant read wrong",
                e.name.escape_ascii()
            );
        }
    }
    let s = cache.stats();
    let rss_after = process_rss_bytes().unwrap();
    let data_bytes = FILES * FILE_BYTES;
    assert_eq!(s.blocks.entries, data_bytes / 4096, "{s:?}");
    assert!(
        s.blocks.used_bytes >= data_bytes && s.blocks.used_bytes <= data_bytes + data_bytes / 10,
        "block cache holds {} MiB for {} MiB of shared data: {s:?}",
        s.blocks.used_bytes >> 20,
        data_bytes >> 20
    );
    assert_eq!(
        s.blocks.misses,
        data_bytes / 4096,
        "each block read from disk once"
    );
    assert_eq!(s.blocks.hits, (TENANTS as u64 - 1) * data_bytes / 4096);
    let grown = rss_after.saturating_sub(rss_before);
    assert!(
        grown < 2 * data_bytes,
        "RSS grew {} MiB while {TENANTS} tenants read the same {} MiB",
        grown >> 20,
        data_bytes >> 20
    );
    // The rest of the growth is the tenants' own extents (block references, ~69 bytes per
    // block) in the RocksDB cache.
    eprintln!(
        "{TENANTS} tenants x {} MiB: block cache {} MiB, RocksDB cache {} MiB, RSS +{} MiB",
        data_bytes >> 20,
        s.blocks.used_bytes >> 20,
        s.rocksdb.usage_bytes >> 20,
        grown >> 20
    );
}
