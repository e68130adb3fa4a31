//! Reproduction, at this machine's size, of the published encrypted-RocksDB experiment: a small
//! (8 MiB) block cache over buffered I/O (every hit in the page cache still pays decrypt +
//! decompress + parse) vs a large block cache with direct I/O (a hit is a decoded block).
//!
//! One encrypted data set, three regimes measured one after another in one run:
//!   A  8 MiB block cache, buffered I/O, page cache warm with the whole data set
//!   B  large block cache (default 256 MiB, data several times larger), O_DIRECT
//!   C  block cache larger than the data set, O_DIRECT (the regime the published 37x describes)
//! Workloads: uniform random point reads; 100-entry scans from a random key. Single thread.
//!
//! usage: cargo run --release --example bench_cache_regimes [-- RECORDS SECONDS LARGE_CACHE_MIB]

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Duration;

use common::{fill, key, open, timed, Latencies, Rng};
use tenantfs::crypto::TenantKey;
use tenantfs::store::{DirectIo, Encryption, Family, OpenMode, StoreHost, TenantDb};

const VALUE: usize = 1024;

struct Row {
    regime: &'static str,
    workload: &'static str,
    lat: Latencies,
}

fn run(db: &TenantDb, records: u64, secs: u64, regime: &'static str, rows: &mut Vec<Row>) {
    let mut rng = Rng::new(42);
    let lat = timed(Duration::from_secs(secs), || {
        db.get(Family::Extents, &key(rng.below(records)))
            .unwrap()
            .unwrap();
    });
    rows.push(Row {
        regime,
        workload: "point read",
        lat,
    });
    let lat = timed(Duration::from_secs(secs), || {
        let got = db
            .scan(Family::Extents, &key(rng.below(records)), 100)
            .unwrap();
        assert!(!got.is_empty());
    });
    rows.push(Row {
        regime,
        workload: "scan 100",
        lat,
    });
}

fn warm_page_cache(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "sst") {
            let _ = std::fs::read(e.path()).unwrap();
        }
    }
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().expect("number"));
    let records = args.next().unwrap_or(1_500_000);
    let secs = args.next().unwrap_or(10);
    let large_cache = args.next().unwrap_or(256) << 20;
    let dir = tempfile::Builder::new()
        .prefix("tenantfs-bench-regimes-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let path = dir.path().join("db");
    // One tenant key for the three opens of the same store: each Env takes its key by value,
    // so keep it wrapped, as the tenant registry does, and unwrap it per open.
    let master = tenantfs::crypto::MasterKey::generate().unwrap();
    let wrapped = master
        .wrap_tenant_key("bench", &TenantKey::generate().unwrap())
        .unwrap();
    let tenant_key = || Encryption::of_key(master.unwrap_tenant_key("bench", &wrapped).unwrap());

    eprintln!("building {records} records x {VALUE} B (encrypted, LZ4)");
    {
        let host = StoreHost::builder().block_cache_bytes(64 << 20).build();
        let db = open(&host, &path, tenant_key(), OpenMode::Create);
        fill(&db, records, VALUE);
    }
    let on_disk: u64 = std::fs::read_dir(&path)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let raw = records * (VALUE as u64 + 8);
    eprintln!(
        "data set: {} MiB raw, {} MiB on disk",
        raw >> 20,
        on_disk >> 20
    );

    let mut rows = Vec::new();
    {
        eprintln!("regime A: 8 MiB block cache, buffered I/O, warm page cache");
        let host = StoreHost::builder()
            .block_cache_bytes(8 << 20)
            .direct_io(DirectIo::Off)
            .build();
        let db = open(&host, &path, tenant_key(), OpenMode::Existing);
        warm_page_cache(&path);
        run(&db, records, secs, "A: 8 MiB cache + page cache", &mut rows);
    }
    {
        eprintln!("regime B: {} MiB block cache, O_DIRECT", large_cache >> 20);
        let host = StoreHost::builder()
            .block_cache_bytes(large_cache as usize)
            .build();
        let db = open(&host, &path, tenant_key(), OpenMode::Existing);
        assert!(db.direct_io());
        let mut rng = Rng::new(1);
        timed(Duration::from_secs(secs), || {
            db.get(Family::Extents, &key(rng.below(records))).unwrap();
        });
        run(
            &db,
            records,
            secs,
            "B: large cache (< data) + O_DIRECT",
            &mut rows,
        );
    }
    {
        let cache = (raw * 3 / 2) as usize;
        eprintln!(
            "regime C: {} MiB block cache (holds the data), O_DIRECT",
            cache >> 20
        );
        let host = StoreHost::builder().block_cache_bytes(cache).build();
        let db = open(&host, &path, tenant_key(), OpenMode::Existing);
        for i in 0..records {
            db.get(Family::Extents, &key(i)).unwrap();
        }
        // The cache is charged by slab slot size: check that it really holds the data.
        let st = host.block_cache().stats();
        eprintln!(
            "regime C after warm-up: cache usage {} MiB of {} MiB, {} evictions",
            st.usage_bytes >> 20,
            st.capacity_bytes >> 20,
            st.evictions
        );
        run(&db, records, secs, "C: cache > data + O_DIRECT", &mut rows);
    }

    println!(
        "data set {} MiB raw / {} MiB on disk, {records} records of {VALUE} B, large cache {} MiB, {secs} s per cell, 1 thread",
        raw >> 20,
        on_disk >> 20,
        large_cache >> 20
    );
    println!("| regime | workload | ops/s | p50 us | p99 us | p99.9 us | max us | vs A |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let base: Vec<f64> = rows.iter().take(2).map(|r| r.lat.qps()).collect();
    for (i, r) in rows.iter_mut().enumerate() {
        let qps = r.lat.qps();
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} | {:.2}x |",
            r.regime,
            r.workload,
            qps,
            r.lat.pct(0.5),
            r.lat.pct(0.99),
            r.lat.pct(0.999),
            r.lat.max(),
            qps / base[i % 2]
        );
    }
}
