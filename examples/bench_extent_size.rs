//! How large should a file-data value be? The measurement before variable-length extents
//! (cold streaming was CPU-bound on per-4-KiB-value work).
//!
//! For each value size, a fresh encrypted tenant store (the extents family as tenants use it:
//! BlobDB, O_DIRECT, the host cache on slabs) takes a 1 GiB file as consecutive values,
//! written like the volume's bulk path (256 KiB unlogged batches, then a flush = what fsync
//! does); then the store is reopened on a fresh host cache and the file read in order in
//! 1 MiB multi-gets, cold, then again warm. Reported: MiB/s and the process's CPU seconds
//! per GiB (user + system, all threads) for each phase.
//!
//! usage: cargo run --release --example bench_extent_size [-- MIB]. Needs a filesystem with
//! O_DIRECT under /var/tmp.

mod common;

use std::time::Instant;

use tenantfs::crypto::{MasterKey, TenantKey};
use tenantfs::store::{Encryption, Family, OpenMode, StoreHost, TenantDb};

const SIZES: [usize; 4] = [4 << 10, 16 << 10, 64 << 10, 256 << 10];

fn cpu_seconds() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).unwrap();
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

fn key(index: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&7u64.to_be_bytes());
    k[8..].copy_from_slice(&index.to_be_bytes());
    k
}

/// (MiB/s, CPU seconds per GiB) of `f` moving `bytes`.
fn measure(bytes: u64, f: impl FnOnce()) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_seconds());
    f();
    let gib = bytes as f64 / f64::from(1 << 30);
    (
        bytes as f64 / f64::from(1 << 20) / t.elapsed().as_secs_f64(),
        (cpu_seconds() - c) / gib,
    )
}

fn read_all(db: &TenantDb, values: u64, size: usize) {
    let per_read = ((1 << 20) / size).max(1) as u64;
    let mut got = 0u64;
    let mut i = 0;
    while i < values {
        let keys: Vec<[u8; 16]> = (i..(i + per_read).min(values)).map(key).collect();
        db.multi_get(Family::Extents, &keys, |_, v| got += v.len() as u64)
            .unwrap();
        i += per_read;
    }
    assert_eq!(got, values * size as u64, "every value read back");
}

fn main() {
    let mib: u64 = std::env::args()
        .nth(1)
        .map_or(1024, |s| s.parse().expect("MIB is a number"));
    let bytes = mib << 20;
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-extent-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // The store is opened twice; the tenant key comes from a wrapped copy each time.
    let master = MasterKey::generate().unwrap();
    let wrapped = master
        .wrap_tenant_key("bench", &TenantKey::generate().unwrap())
        .unwrap();
    let tenant_key = || Encryption::of_key(master.unwrap_tenant_key("bench", &wrapped).unwrap());
    println!("value size vs streaming cost: {mib} MiB file, encrypted store, one run");
    println!(
        "| value | write MiB/s | write CPU s/GiB | cold read MiB/s | cold read CPU s/GiB | \
         warm read MiB/s | warm read CPU s/GiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for size in SIZES {
        let path = tmp.path().join(format!("v{size}"));
        let values = bytes / size as u64;
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + size) as u8).collect();
        let w = {
            let host = StoreHost::builder().block_cache_bytes(2 << 30).build();
            let db = TenantDb::open(&host, "bench", &path, tenant_key(), OpenMode::Create).unwrap();
            let per_batch = ((256 << 10) / size).max(1) as u64;
            measure(bytes, || {
                let mut i = 0;
                while i < values {
                    let mut batch = db.batch();
                    for j in i..(i + per_batch).min(values) {
                        batch.put(Family::Extents, &key(j), &data);
                    }
                    db.write_unlogged(batch).unwrap();
                    i += per_batch;
                }
                db.flush().unwrap();
            })
        };
        let host = StoreHost::builder().block_cache_bytes(2 << 30).build();
        let db = TenantDb::open(&host, "bench", &path, tenant_key(), OpenMode::Existing).unwrap();
        let cold = measure(bytes, || read_all(&db, values, size));
        let warm = measure(bytes, || read_all(&db, values, size));
        println!(
            "| {} KiB | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} |",
            size >> 10,
            w.0,
            w.1,
            cold.0,
            cold.1,
            warm.0,
            warm.1
        );
    }
}
