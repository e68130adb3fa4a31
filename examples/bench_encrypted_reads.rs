//! Point reads from an encrypted store vs a plaintext store, block-cache regime (the data set
//! fits in the block cache, which is warm). Both stores are open at once and measured in
//! alternating rounds, so machine noise hits both alike. Target: encrypted/plaintext >= 0.95.
//!
//! usage: cargo run --release --example bench_encrypted_reads [-- RECORDS ROUNDS SECONDS]

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use common::{fill, key, open, timed, Rng};
use tenantfs::crypto::TenantKey;
use tenantfs::store::{Encryption, Family, OpenMode, StoreHost};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().expect("number"));
    let records = args.next().unwrap_or(200_000);
    let rounds = args.next().unwrap_or(5);
    let secs = args.next().unwrap_or(3);
    let len = 1024;
    let dir = tempfile::Builder::new()
        .prefix("tenantfs-bench-enc-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // 1 GiB cache: the whole data set (~200 MiB of blocks) stays cached.
    let host = StoreHost::builder().block_cache_bytes(1 << 30).build();
    eprintln!("building {records} records of {len} B in each store");
    let enc = open(
        &host,
        &dir.path().join("enc"),
        Encryption::of_key(TenantKey::generate().unwrap()),
        OpenMode::Create,
    );
    fill(&enc, records, len);
    let plain = open(
        &host,
        &dir.path().join("plain"),
        Encryption::PlaintextForBenchmarks,
        OpenMode::Create,
    );
    fill(&plain, records, len);
    // Warm the cache with every block of both stores.
    for db in [&enc, &plain] {
        for i in 0..records {
            db.get(Family::Extents, &key(i)).unwrap().unwrap();
        }
    }
    eprintln!(
        "block cache usage after warm-up: {} MiB",
        host.block_cache_usage() >> 20
    );

    let mut rng = Rng::new(7);
    let (mut enc_ops, mut enc_secs, mut plain_ops, mut plain_secs) = (0u64, 0f64, 0u64, 0f64);
    let mut enc_lat = Vec::new();
    let mut plain_lat = Vec::new();
    for round in 0..rounds {
        // Alternate which store goes first.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for encrypted in order {
            let db = if encrypted { &enc } else { &plain };
            let mut l = timed(Duration::from_secs(secs), || {
                let v = db.get(Family::Extents, &key(rng.below(records))).unwrap();
                assert!(v.is_some());
            });
            if encrypted {
                enc_ops += l.ops;
                enc_secs += l.secs;
                enc_lat.push(l.pct(0.5));
            } else {
                plain_ops += l.ops;
                plain_secs += l.secs;
                plain_lat.push(l.pct(0.5));
            }
        }
    }
    let eq = enc_ops as f64 / enc_secs;
    let pq = plain_ops as f64 / plain_secs;
    println!("| store | point reads/s | p50 us (per round) |");
    println!("|---|---:|---|");
    println!("| plaintext | {pq:.0} | {plain_lat:.2?} |");
    println!("| encrypted | {eq:.0} | {enc_lat:.2?} |");
    println!("| **encrypted / plaintext** | **{:.3}** | |", eq / pq);
}
