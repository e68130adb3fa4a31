//! `tenantfs stats`: the daemon's mounts and attached volumes (operations, bytes, latency, store state) and host
//! numbers.

use anyhow::Result;
use tenantfs::control::replies::MountReport;
use tenantfs::metrics::MountActivity;
use tenantfs::store::StoreState;

use super::{daemon_error, print_json, Cli};

/// Whole MiB, for table cells.
fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

pub fn stats(cli: &Cli, json: bool) -> Result<()> {
    let Some(daemon) = cli.live_daemon()? else {
        anyhow::bail!(
            "the tenantfs daemon is not running on {} (start it with `tenantfs daemon`; \
             without it, `tenantfs cache stats` shows each serving process)",
            cli.socket().display()
        );
    };
    let v = daemon.stats().map_err(daemon_error)?;
    if json {
        return print_json(&v);
    }
    let c = &v.cache;
    println!(
        "daemon pid {}: {} mounts, {} volumes; cache budget {} MiB, used {} MiB, resident {} MiB; RSS {} MiB; hits {}, misses {}",
        v.pid,
        v.mounts.len(),
        v.volumes.len(),
        mib(c.cache.budget_bytes),
        mib(c.cache.used_bytes),
        mib(c.cache.resident_bytes),
        mib(c.process_rss_bytes.unwrap_or(0)),
        c.cache.hits,
        c.cache.misses
    );
    println!(
        "{:<16} {:<32} {:>9} {:>9} {:>9} {:>9} {:>14} {:>14} {:>7}",
        "TENANT",
        "MOUNTPOINT / VOLUME AT",
        "READS",
        "READ MiB",
        "WRITES",
        "WRIT MiB",
        "READ p50/p99",
        "WRITE p50/p99",
        "STATE"
    );
    for m in &v.mounts {
        let place = m.mountpoint.display().to_string();
        let state = match (m.dormant, m.store.as_ref()) {
            (true, _) => "dormant",
            (false, s) => s.map_or("-", StoreState::label),
        };
        row(&m.tenant, &place, &m.activity, state);
    }
    for d in &v.volumes {
        let place = super::volume::attached_at(d);
        let state = d.store.as_ref().map_or("-", StoreState::label);
        row(&d.served.volume, &place, &d.activity, state);
    }
    for w in &v.waiting_volumes {
        println!(
            "configured volume {} ({}) is not attached yet (attempt {}, next in {} s): {}",
            w.volume,
            w.via,
            w.attempts,
            w.next_attempt_in_ms.div_ceil(1000),
            w.error
        );
    }
    for w in &v.waiting_mounts {
        println!(
            "configured mount {} at {} is not mounted yet (attempt {}, next in {} s): {}",
            w.tenant,
            w.mountpoint.display(),
            w.attempts,
            w.next_attempt_in_ms.div_ceil(1000),
            w.error
        );
    }
    for m in &v.mounts {
        if let Some(line) = quota_line(m) {
            println!("{line}");
        }
        if let Some(line) = not_writable(m) {
            println!("{line}");
        }
    }
    Ok(())
}

/// What a tenant with a quota takes of it (`--json` has it for every tenant: `usage`).
fn quota_line(m: &MountReport) -> Option<String> {
    let (quota, usage) = (m.quota?, m.usage?);
    let part = |used: String, limit: Option<String>| match limit {
        Some(limit) => format!("{used} of {limit}"),
        None => used,
    };
    Some(format!(
        "tenant {}: files take {} bytes in {} inodes",
        m.tenant,
        part(usage.bytes.to_string(), quota.bytes.map(|q| q.to_string())),
        part(
            usage.inodes.to_string(),
            quota.inodes.map(|q| q.to_string())
        ),
    ))
}

/// One served tenant's line: a mount at its mountpoint, or a volume at its address.
fn row(tenant: &str, place: &str, activity: &MountActivity, state: &str) {
    let op = |o: &str| activity.ops.get(o).copied().unwrap_or_default();
    let lat = |o: &str| {
        let s = op(o);
        if s.calls == 0 {
            "-".to_string()
        } else {
            format!("<{}/<{} us", s.p50_us_le, s.p99_us_le)
        }
    };
    println!(
        "{:<16} {:<32} {:>9} {:>9} {:>9} {:>9} {:>14} {:>14} {:>7}",
        tenant,
        place,
        op("read").calls,
        mib(activity.read_bytes),
        op("write").calls,
        mib(activity.written_bytes),
        lat("read"),
        lat("write"),
        state
    );
}

/// Why a tenant does not take writes, and when it will again.
fn not_writable(m: &MountReport) -> Option<String> {
    let ago = |since: u64| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().saturating_sub(since))
    };
    let tenant = &m.tenant;
    match m.store.as_ref()? {
        StoreState::NoSpace {
            since_unix,
            free_bytes,
            needs_free_bytes,
            ..
        } => Some(format!(
            "tenant {tenant} is read-only for {} s: its filesystem is full; it takes writes \
             again by itself once {} MiB are free there ({} MiB free when last checked)",
            ago(*since_unix),
            needs_free_bytes.div_ceil(1 << 20),
            mib(*free_bytes)
        )),
        StoreState::Failed { since_unix, detail } => Some(format!(
            "tenant {tenant} stopped taking writes {} s ago ({detail}); remount it",
            ago(*since_unix)
        )),
        StoreState::Writable => None,
    }
}
