//! A tenant's snapshots: `snapshot create|list|delete`, `tenant restore`.

use anyhow::{Context, Result};
use tenantfs::control::{ControlError, RefusalCode};
use tenantfs::snapshots::{self, SnapshotInfo};
use tenantfs::tenants;
use tenantfs::units::ByteSize;

use super::{command_stores, daemon_error, print_json, Cli};

/// `snapshot create TENANT NAME`: through the process that serves the tenant if one does (a
/// mounted or attached tenant is snapshotted while it runs), else on its store opened here.
pub fn create(cli: &Cli, tenant: &str, name: &str) -> Result<()> {
    tenants::info(&cli.data_dir, tenant)?;
    let servers = match cli.serving_processes() {
        Ok(s) => s,
        Err(ControlError::NoServer(_)) => Vec::new(),
        Err(e) => return Err(daemon_error(e)),
    };
    for process in servers {
        match process.snapshot_create(tenant, name) {
            Ok(reply) => {
                let took = std::time::Duration::from_micros(reply.took_us);
                return print_taken(&reply.snapshot, took, true);
            }
            Err(e)
                if e.refusal()
                    .is_some_and(|r| r.code == RefusalCode::NotServed) => {}
            Err(e) => return Err(daemon_error(e)),
        }
    }
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let host = command_stores(&config);
    let taken = snapshots::create_closed(&data, &host, tenant, name)
        .with_context(|| format!("no snapshot {name} of tenant {tenant} was taken"))?;
    print_taken(&taken.info, taken.took, false)
}

fn print_taken(s: &SnapshotInfo, took: std::time::Duration, live: bool) -> Result<()> {
    println!(
        "took snapshot {} of tenant {}{} in {:.1} ms: {} on disk of its own, {} shared with \
         the tenant",
        s.name,
        s.tenant,
        if live { " while it is served" } else { "" },
        took.as_secs_f64() * 1e3,
        ByteSize(s.own_bytes),
        ByteSize(s.disk_bytes - s.own_bytes),
    );
    Ok(())
}

/// `snapshot list [TENANT] [--json]`.
pub fn list(cli: &Cli, tenant: Option<&str>, json: bool) -> Result<()> {
    let list = snapshots::list(&cli.data_dir, tenant)?;
    if json {
        return print_json(&list);
    }
    if list.is_empty() {
        match tenant {
            Some(t) => println!("tenant {t} has no snapshots"),
            None => println!("no snapshots in {}", cli.data_dir.display()),
        }
        return Ok(());
    }
    println!(
        "{:<32} {:<32} {:<20} {:>14} {:>14}",
        "TENANT", "SNAPSHOT", "CREATED (UTC)", "DISK BYTES", "OWN BYTES"
    );
    for s in list {
        println!(
            "{:<32} {:<32} {:<20} {:>14} {:>14}",
            s.tenant,
            s.name,
            utc(s.created_unix),
            s.disk_bytes,
            s.own_bytes
        );
    }
    Ok(())
}

/// `snapshot delete TENANT NAME`.
pub fn delete(cli: &Cli, tenant: &str, name: &str) -> Result<()> {
    let gone = snapshots::delete(&cli.data_dir, tenant, name)?;
    println!(
        "deleted snapshot {name} of tenant {tenant}: {} of disk given back (the rest is \
         shared with the tenant or its other snapshots)",
        ByteSize(gone.own_bytes)
    );
    Ok(())
}

/// `tenant restore TENANT --snapshot NAME`.
pub fn restore(cli: &Cli, tenant: &str, name: &str) -> Result<()> {
    let s = snapshots::restore(&cli.data_dir, tenant, name)
        .with_context(|| format!("tenant {tenant} was not restored (nothing was changed)"))?;
    println!(
        "restored tenant {tenant} to snapshot {name} (taken {} UTC); the snapshot is kept",
        utc(s.created_unix)
    );
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS` of a Unix time, in UTC.
fn utc(unix: u64) -> String {
    let (days, secs) = (unix / 86_400, unix % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(super::utc(1_795_794_032), "2026-11-27 15:40:32");
    }
}
