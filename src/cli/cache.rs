//! `tenantfs cache stats|release|budget`: the host cache of every process serving mounts of
//! this data dir (the daemon and each foreground mount), summed or split over them.

use anyhow::Result;
use tenantfs::control::replies::CacheReport;
use tenantfs::units::ByteSize;

use super::{print_json, Cli};

/// `cache stats --json`: the processes' numbers summed, and each process's report.
#[derive(serde::Serialize)]
struct CacheTotals {
    budget_bytes: u64,
    ceiling_bytes: u64,
    used_bytes: u64,
    resident_bytes: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    released_bytes: u64,
    mapped_bytes: u64,
    process_rss_bytes: u64,
    processes: Vec<CacheReport>,
}

impl CacheTotals {
    fn of(processes: Vec<CacheReport>) -> Self {
        let sum = |f: fn(&CacheReport) -> u64| processes.iter().map(f).sum();
        Self {
            budget_bytes: sum(|r| r.cache.budget_bytes),
            ceiling_bytes: sum(|r| r.ceiling_bytes),
            used_bytes: sum(|r| r.cache.used_bytes),
            resident_bytes: sum(|r| r.cache.resident_bytes),
            hits: sum(|r| r.cache.hits),
            misses: sum(|r| r.cache.misses),
            evictions: sum(|r| r.cache.evictions),
            released_bytes: sum(|r| r.cache.released_bytes),
            mapped_bytes: sum(|r| r.cache.mapped_bytes),
            process_rss_bytes: sum(|r| r.process_rss_bytes.unwrap_or(0)),
            processes,
        }
    }
}

fn reports(cli: &Cli) -> Result<Vec<CacheReport>> {
    let mut each = Vec::new();
    for p in cli.serving_processes()? {
        each.push(p.cache_stats()?);
    }
    Ok(each)
}

pub fn stats(cli: &Cli, json: bool) -> Result<()> {
    let each = reports(cli)?;
    if json {
        return print_json(&CacheTotals::of(each));
    }
    let size = |b: u64| ByteSize(b).rounded();
    for r in &each {
        let c = &r.cache;
        println!(
            "{} (pid {}): budget {} (ceiling {}), used {}, resident {}, process RSS {}",
            r.server,
            r.pid,
            size(c.budget_bytes),
            size(r.ceiling_bytes),
            size(c.used_bytes),
            size(c.resident_bytes),
            size(r.process_rss_bytes.unwrap_or(0)),
        );
        println!(
            "  hits {}, misses {}, evictions {}, released {}",
            c.hits,
            c.misses,
            c.evictions,
            size(c.released_bytes)
        );
        if let Some(d) = r.governor.as_ref().and_then(|g| g.last_decision.as_deref()) {
            println!("  governor: {d}");
        }
    }
    Ok(())
}

/// Releases `size` split over the serving processes in proportion to what their caches hold.
pub fn release(cli: &Cli, size: ByteSize) -> Result<()> {
    let processes = cli.serving_processes()?;
    let mut used = Vec::new();
    for p in &processes {
        used.push(p.cache_stats()?.cache.used_bytes);
    }
    let total: u64 = used.iter().sum::<u64>().max(1);
    let mut released = 0;
    for (p, u) in processes.iter().zip(&used) {
        let bytes = (size.0 as u128 * *u as u128 / total as u128) as u64;
        released += p.cache_release(bytes)?.released_bytes;
    }
    println!(
        "released {} of cache memory to the kernel (asked {})",
        ByteSize(released),
        size
    );
    Ok(())
}

/// Sets one host budget, shared equally by the serving processes.
pub fn budget(cli: &Cli, size: ByteSize) -> Result<()> {
    let processes = cli.serving_processes()?;
    let n = processes.len() as u64;
    for p in &processes {
        p.cache_budget(size.0 / n)?;
    }
    if n == 1 {
        println!("cache budget set to {size}");
    } else {
        println!(
            "cache budget set to {size}: {} for each of {n} serving processes",
            ByteSize(size.0 / n)
        );
    }
    Ok(())
}
