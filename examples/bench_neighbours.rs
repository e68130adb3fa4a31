//! A quiet tenant beside a loud one, both of one daemon: the quiet tenant's IOPS and p99
//! alone and beside the loud one, as ratios. Quiet: fio QD1 4 KiB O_DIRECT random reads (or
//! fsync'd random writes), 1 job. Loud: 1 MiB sequential writes flat out, or 4 KiB random
//! writes at QD16 (libaio). Targets: with the quiet tenant's file in the host cache, IOPS drop
//! <= 10% and p99 <= 2x alone beside either; with its reads from the disk (a 1 GiB file
//! through a 256 MiB cache) or its writes fsync'd, drop <= 25% and p99 <= 2x.
//!
//! usage: make build && cargo run --release --example bench_neighbours [-- SECONDS [OPTIONS [CASES]]]
//! OPTIONS: mount options for both tenants (e.g. `weight=100`; `-` for none); CASES: the
//! rows to run, numbered from 1 (e.g. `3,4`; all by default).
//! Needs root, /dev/fuse and fio.

mod common;

use common::daemon::{fio_for as fio, lay_out, side_by_side, TwoTenants};

const QUIET_READ: &[&str] = &["--rw=randread", "--bs=4k", "--ioengine=psync"];
const QUIET_FSYNC: &[&str] = &["--rw=randwrite", "--bs=4k", "--ioengine=psync", "--fsync=1"];
const LOUD_STREAM: &[&str] = &["--rw=write", "--bs=1M", "--ioengine=psync"];
const LOUD_RANDOM: &[&str] = &[
    "--rw=randwrite",
    "--bs=4k",
    "--ioengine=libaio",
    "--iodepth=16",
];
/// Something for fio to do while the quiet tenant runs alone: nothing, in a second.
const IDLE: &[&str] = &["--rw=read", "--bs=4k", "--ioengine=psync", "--rate_iops=1"];

/// One row: what the quiet tenant does, what the loud one does.
struct Case {
    quiet: &'static str,
    quiet_job: &'static [&'static str],
    loud: &'static str,
    loud_job: &'static [&'static str],
    from_disk: bool,
}

impl Case {
    fn new(
        quiet: &'static str,
        quiet_job: &'static [&'static str],
        loud: &'static str,
        loud_job: &'static [&'static str],
        from_disk: bool,
    ) -> Self {
        Case {
            quiet,
            quiet_job,
            loud,
            loud_job,
            from_disk,
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let options = args.next().filter(|o| o != "-").unwrap_or_default();
    let only: Option<Vec<usize>> = args
        .next()
        .map(|c| c.split(',').filter_map(|n| n.parse().ok()).collect());
    println!("Quiet tenant a beside loud tenant b, one daemon, {secs} s each:");
    println!();
    println!(
        "| quiet a | loud b | a alone IOPS | a beside IOPS | drop | a alone p99 us | a beside \
         p99 us | p99 ratio | b IOPS | target |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let cases = [
        Case::new(
            "cached reads",
            QUIET_READ,
            "1 MiB writes",
            LOUD_STREAM,
            false,
        ),
        Case::new(
            "cached reads",
            QUIET_READ,
            "4 KiB writes QD16",
            LOUD_RANDOM,
            false,
        ),
        Case::new(
            "reads from disk",
            QUIET_READ,
            "1 MiB writes",
            LOUD_STREAM,
            true,
        ),
        Case::new(
            "fsync'd writes",
            QUIET_FSYNC,
            "1 MiB writes",
            LOUD_STREAM,
            false,
        ),
        Case::new(
            "fsync'd writes",
            QUIET_FSYNC,
            "4 KiB writes QD16",
            LOUD_RANDOM,
            false,
        ),
    ];
    for Case {
        quiet,
        quiet_job,
        loud,
        loud_job,
        from_disk,
    } in cases
        .into_iter()
        .enumerate()
        .filter(|(n, _)| only.as_ref().is_none_or(|o| o.contains(&(n + 1))))
        .map(|(_, c)| c)
    {
        // From the disk: a 1 GiB file through a 256 MiB cache; else 256 MiB in a 1 GiB one.
        let (budget, size, mib, target) = if from_disk {
            ("256M", "1G", 1024, "<= 25%, <= 2x")
        } else if quiet_job == QUIET_FSYNC {
            ("1G", "256M", 256, "<= 25%, <= 2x")
        } else {
            ("1G", "256M", 256, "<= 10%, <= 2x")
        };
        let config = format!("[cache]\nbudget = \"{budget}\"\n");
        let run = |loud_job: &[&str]| {
            let d = TwoTenants::new("neighbours", &config, [&options, &options]);
            let (qf, lf) = (d.mount(0).join("f"), d.mount(1).join("f"));
            // The loud tenant's file first: the quiet one's, read back last, is what the cache
            // holds.
            lay_out(&lf, 1024);
            lay_out(&qf, mib);
            side_by_side(
                fio(&qf, size, secs, quiet_job),
                fio(&lf, "1G", secs, loud_job),
            )
        };
        let [(alone, alone_p99), _] = run(IDLE);
        let [(beside, beside_p99), (loud_iops, _)] = run(loud_job);
        println!(
            "| {quiet} | {loud} | {alone:.0} | {beside:.0} | {:.1}% | {alone_p99:.0} | \
             {beside_p99:.0} | {:.2}x | {loud_iops:.0} | {target} |",
            (1.0 - beside / alone) * 100.0,
            beside_p99 / alone_p99
        );
    }
}
