//! Weights between busy tenants of one daemon (`-o weight=N`): two tenants, each with fio
//! doing 4 KiB O_DIRECT random reads of a cached 256 MiB file with two jobs (both saturate
//! the 2-CPU host), run at once; each tenant's share of the IOPS, for weights 100:300 (target
//! 25% +- 5% and 75% +- 5%), 100:100 (50% each) and no weights at all (the queue not engaged:
//! what the kernel's scheduler gives). Then the check that sharing gives nothing away: a QD1
//! tenant reading a 1 GiB file through a 256 MiB cache (its reads wait on the disk) beside a
//! tenant reading its cached file with two jobs, with and without weights: the cached tenant
//! must keep its IOPS (a tenant slowed by its own disk reads must not hold the other to its
//! pace).
//!
//! usage: make build && cargo run --release --example bench_weights [-- REPEATS SECONDS]
//! Needs root, /dev/fuse and fio.

mod common;

use std::path::Path;
use std::process::Command;

use common::daemon::TwoTenants;
use common::daemon::{lay_out, side_by_side};
use common::median;

/// fio 4 KiB random reads of `file` (`size`) with `jobs` jobs for `secs`.
fn fio(file: &Path, size: &str, jobs: u32, secs: u32) -> Command {
    let jobs = format!("--numjobs={jobs}");
    let pattern = [
        "--bs=4k",
        "--rw=randread",
        "--ioengine=psync",
        &jobs,
        "--group_reporting",
    ];
    common::daemon::fio_for(file, size, secs, &pattern)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let repeats: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let secs: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);

    println!("Two busy tenants, 4 KiB random reads of a cached 256 MiB file, 2 jobs each, {secs} s, {repeats} runs:");
    println!();
    println!(
        "| weights a : b | a's share of IOPS (runs) | median | target | total IOPS (median) |"
    );
    println!("|---|---|---:|---:|---:|");
    for (label, opts, target) in [
        ("100 : 300", ["weight=100", "weight=300"], "25% +- 5%"),
        ("100 : 100", ["weight=100", "weight=100"], "50% +- 5%"),
        ("none (queue not engaged)", ["", ""], "-"),
    ] {
        let (mut shares, mut totals) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            let d = TwoTenants::new("weights", "[cache]\nbudget = \"1G\"\n", opts);
            for i in 0..2 {
                lay_out(&d.mount(i).join("f"), 256);
            }
            let [(a, _), (b, _)] = side_by_side(
                fio(&d.mount(0).join("f"), "256M", 2, secs),
                fio(&d.mount(1).join("f"), "256M", 2, secs),
            );
            shares.push(a / (a + b));
            totals.push(a + b);
        }
        let runs: Vec<String> = shares
            .iter()
            .map(|s| format!("{:.1}%", s * 100.0))
            .collect();
        println!(
            "| {label} | {} | {:.1}% | {target} | {:.0} |",
            runs.join(", "),
            median(shares) * 100.0,
            median(totals)
        );
    }

    println!();
    println!("Sharing gives nothing away: a, QD1 4 KiB random reads of a 1 GiB file through a 256 MiB cache (from the disk); b, 2 jobs on its cached 64 MiB file; {secs} s, {repeats} runs, medians:");
    println!();
    println!("| weights | a IOPS | a p99 us | b IOPS | b p99 us |");
    println!("|---|---:|---:|---:|---:|");
    for (label, opts) in [
        ("none", ["", ""]),
        ("100 : 100", ["weight=100", "weight=100"]),
    ] {
        let mut rows = Vec::new();
        for _ in 0..repeats {
            let d = TwoTenants::new("weights", "[cache]\nbudget = \"256M\"\n", opts);
            lay_out(&d.mount(0).join("f"), 1024);
            lay_out(&d.mount(1).join("f"), 64);
            rows.push(side_by_side(
                fio(&d.mount(0).join("f"), "1G", 1, secs),
                fio(&d.mount(1).join("f"), "64M", 2, secs),
            ));
        }
        let col = |t: usize, k: usize| {
            median(
                rows.iter()
                    .map(|r| if k == 0 { r[t].0 } else { r[t].1 })
                    .collect(),
            )
        };
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} | {:.0} |",
            col(0, 0),
            col(0, 1),
            col(1, 0),
            col(1, 1)
        );
    }
}
