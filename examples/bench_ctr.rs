//! Bulk AES-256-CTR throughput on one core, through the same `FileCipher::apply` the store's
//! shim calls once per RocksDB read/write buffer. For comparison, the same bytes done in one
//! call per 16-byte block (what RocksDB's generic `BlockAccessCipherStream` would do).
//!
//! usage: cargo run --release --example bench_ctr [-- SECONDS_PER_CASE]

use std::time::{Duration, Instant};

use tenantfs::crypto::FileCipher;

fn measure(per_case: Duration, buf: &mut [u8], mut op: impl FnMut(u64, &mut [u8])) -> f64 {
    // warm-up
    op(0, buf);
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut offset = 4096u64;
    while start.elapsed() < per_case {
        for _ in 0..16 {
            op(offset, buf);
            offset += buf.len() as u64;
            bytes += buf.len() as u64;
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(2.0);
    let per_case = Duration::from_secs_f64(secs);
    let cipher = FileCipher::new(&[0x42; 32], &[0x17; 16]);
    println!(
        "aes: {}",
        if std::is_x86_feature_detected!("aes") {
            "AES-NI available"
        } else {
            "no AES-NI (software)"
        }
    );
    println!("| buffer | bulk GB/s | per-16-byte-call GB/s | bulk / per-block |");
    println!("|---:|---:|---:|---:|");
    for size in [4096usize, 65536, 1 << 20] {
        let mut buf = vec![0xa5u8; size];
        let bulk = measure(per_case, &mut buf, |off, b| cipher.apply(off, b));
        let per_block = measure(per_case, &mut buf, |off, b| {
            for (i, chunk) in b.chunks_mut(16).enumerate() {
                cipher.apply(off + 16 * i as u64, chunk);
            }
        });
        println!(
            "| {} KiB | {bulk:.2} | {per_block:.2} | {:.1}x |",
            size / 1024,
            bulk / per_block
        );
    }
}
