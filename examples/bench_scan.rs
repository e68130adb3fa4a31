//! A stream beside a cached set: tenant a's 256 MiB file is in the host cache (1 GiB
//! budget) and read at random (fio QD1, 4 KiB, O_DIRECT); tenant b of the same daemon reads a
//! 3 GiB file from start to end (1 MiB, O_DIRECT), three times the cache. Rows: a alone; a
//! beside the stream; a just after a stream it sat out (idle while b read), which shows what
//! the stream left of a's set in the cache. Target (the quiet-tenant bound for cached reads):
//! a's IOPS within 10% of alone in both.
//!
//! usage: make build && cargo run --release --example bench_scan [-- SECONDS]
//! Needs root, /dev/fuse and fio.

mod common;

use std::process::Command;

use common::daemon::{fio_for as fio, lay_out, side_by_side, TwoTenants};
use common::fio_side;

const RANDOM: &[&str] = &["--rw=randread", "--bs=4k", "--ioengine=psync"];
const STREAM: &[&str] = &["--rw=read", "--bs=1M", "--ioengine=psync"];

/// (IOPS, p99 us) of fio job `c`.
fn quiet(mut c: Command) -> (f64, f64) {
    let v = fio_side(&mut c, "a");
    let p99 = v["clat_ns"]["percentile"]["99.000000"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e3;
    (v["iops"].as_f64().unwrap(), p99)
}

fn main() {
    let secs: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let d = TwoTenants::new("scan", "[cache]\nbudget = \"1G\"\n", ["", ""]);
    let (qf, lf) = (d.mount(0).join("f"), d.mount(1).join("f"));
    lay_out(&lf, 3072);
    lay_out(&qf, 256);
    let a = || fio(&qf, "256M", secs, RANDOM);
    let b = || fio(&lf, "3G", secs, STREAM);
    let (alone, alone_p99) = quiet(a());
    let [(beside, beside_p99), (stream_iops, _)] = side_by_side(a(), b());
    let (_, _) = quiet(fio(&lf, "3G", secs, STREAM));
    let (after, after_p99) = quiet(fio(&qf, "256M", 3.min(secs), RANDOM));
    println!("Tenant a's cached 4 KiB random reads and tenant b's 3 GiB stream, one daemon, 1 GiB cache, {secs} s:");
    println!();
    println!("| a | IOPS | vs alone | p99 us | p99 vs alone |");
    println!("|---|---:|---:|---:|---:|");
    println!("| alone | {alone:.0} | 1.00x | {alone_p99:.0} | 1.00x |");
    for (row, iops, p99) in [
        ("beside b's stream", beside, beside_p99),
        ("first 3 s after a stream it sat out", after, after_p99),
    ] {
        println!(
            "| {row} | {iops:.0} | {:.2}x | {p99:.0} | {:.2}x |",
            iops / alone,
            p99 / alone_p99
        );
    }
    println!();
    println!("b's stream beside a: {stream_iops:.0} MiB/s");
}
