//! A stream beside a cached set: tenant a's 256 MiB file is in the host cache (1 GiB
//! budget) and read at random (fio QD1, 4 KiB, O_DIRECT); tenant b of the same daemon reads a
//! 3 GiB file from start to end (1 MiB, O_DIRECT), three times the cache. Rows: a alone; a
//! beside the stream; a just after a stream it sat out (idle while b read), which shows what
//! the stream left of a's set in the cache. Target (the quiet-tenant bound for cached reads):
//! a's IOPS within 10% of alone in both.
//!
//! Where the two fio processes run decides the result: the ring that serves a request is the
//! one of its caller's CPU, so with both callers on one CPU the stream's work and a's share
//! that CPU, and the other CPU idles. The scheduler places them either way from run to run,
//! so each fio is pinned (`--cpus_allowed`): a on CPU 0 always, b on CPU 1 ("another CPU")
//! and then on CPU 0 ("a's CPU").
//!
//! usage: make build && cargo run --release --example bench_scan [-- SECONDS]
//! Needs root, /dev/fuse, fio and two CPUs.

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
    let on = |mut c: Command, cpu: u32| {
        c.arg(format!("--cpus_allowed={cpu}"));
        c
    };
    let a = || on(fio(&qf, "256M", secs, RANDOM), 0);
    let b = |cpu| on(fio(&lf, "3G", secs, STREAM), cpu);
    let (alone, alone_p99) = quiet(a());
    let [(apart, apart_p99), (apart_mib, _)] = side_by_side(a(), b(1));
    let [(shared, shared_p99), (shared_mib, _)] = side_by_side(a(), b(0));
    let (alone_mib, _) = quiet(b(1));
    let (after, after_p99) = quiet(on(fio(&qf, "256M", 3.min(secs), RANDOM), 0));
    println!("Tenant a's cached 4 KiB random reads and tenant b's 3 GiB stream, one daemon, 1 GiB cache, {secs} s:");
    println!();
    println!("| a | IOPS | vs alone | p99 us | p99 vs alone |");
    println!("|---|---:|---:|---:|---:|");
    println!("| alone | {alone:.0} | 1.00x | {alone_p99:.0} | 1.00x |");
    for (row, iops, p99) in [
        ("beside b's stream on another CPU", apart, apart_p99),
        ("beside b's stream on a's CPU", shared, shared_p99),
        ("first 3 s after a stream it sat out", after, after_p99),
    ] {
        println!(
            "| {row} | {iops:.0} | {:.2}x | {p99:.0} | {:.2}x |",
            iops / alone,
            p99 / alone_p99
        );
    }
    println!();
    println!(
        "b's stream: {alone_mib:.0} MiB/s alone; beside a, {apart_mib:.0} on another CPU, \
         {shared_mib:.0} on a's"
    );
}
