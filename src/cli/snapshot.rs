//! A tenant's snapshots, forks and keys: `snapshot create|list|delete`, `tenant restore`,
//! `tenant fork`, `tenant rotate-key`.

use anyhow::{Context, Result};
use tenantfs::control::{ControlError, RefusalCode};
use tenantfs::snapshots::{self, SnapshotInfo};
use tenantfs::tenants;
use tenantfs::units::ByteSize;

use super::{command_stores, daemon_error, print_json, Cli};

/// `ask` of the process that serves tenant `tenant`, if one does; `None` if none does.
fn through_server<R>(
    cli: &Cli,
    tenant: &str,
    ask: impl Fn(&tenantfs::control::Client) -> Result<R, ControlError>,
) -> Result<Option<R>> {
    tenants::info(&cli.data_dir, tenant)?;
    let servers = match cli.serving_processes() {
        Ok(s) => s,
        Err(ControlError::NoServer(_)) => Vec::new(),
        Err(e) => return Err(daemon_error(e)),
    };
    for process in servers {
        match ask(&process) {
            Ok(reply) => return Ok(Some(reply)),
            Err(e)
                if e.refusal()
                    .is_some_and(|r| r.code == RefusalCode::NotServed) => {}
            Err(e) => return Err(daemon_error(e)),
        }
    }
    Ok(None)
}

/// `snapshot create TENANT NAME`: through the process that serves the tenant if one does (a
/// mounted or attached tenant is snapshotted while it runs), else on its store opened here.
pub fn create(cli: &Cli, tenant: &str, name: &str) -> Result<()> {
    if let Some(reply) = through_server(cli, tenant, |p| p.snapshot_create(tenant, name))? {
        let took = std::time::Duration::from_micros(reply.took_us);
        return print_taken(&reply.snapshot, took, true);
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
    let own = snapshots::delete(&cli.data_dir, tenant, name)?;
    println!(
        "deleted snapshot {name} of tenant {tenant}: {} of disk given back (the rest is \
         shared with the tenant or its other snapshots)",
        ByteSize(own)
    );
    Ok(())
}

/// `tenant restore TENANT --snapshot NAME`.
pub fn restore(cli: &Cli, tenant: &str, name: &str) -> Result<()> {
    let s = snapshots::restore(&cli.data_dir, tenant, name)
        .with_context(|| format!("tenant {tenant} was not restored"))?;
    println!(
        "restored tenant {tenant} to snapshot {name} (taken {} UTC); the snapshot is kept",
        utc(s.created_unix)
    );
    Ok(())
}

/// `tenant fork SOURCE NEW [--snapshot NAME]`: through the process that serves SOURCE if one
/// does, else on its store opened here.
pub fn fork(cli: &Cli, source: &str, new: &str, snapshot: Option<&str>) -> Result<()> {
    let context = || format!("tenant {source} was not forked into {new} (nothing was made)");
    let (disk, took, live) =
        match through_server(cli, source, |p| p.tenant_fork(source, new, snapshot))? {
            Some(reply) => (reply.disk_bytes, reply.took_us, true),
            None => {
                let config = cli.load_config()?;
                let data = cli.open_data_dir()?;
                let host = command_stores(&config);
                let open = tenants::open_when_free(&data, &host, source).with_context(context)?;
                let forked =
                    tenantfs::forks::fork(&data, &open, new, snapshot).with_context(context)?;
                let took = forked.took.as_micros() as u64;
                (forked.info.disk_bytes, took, false)
            }
        };
    let from = snapshot.map_or_else(String::new, |s| format!(" as its snapshot {s} holds it"));
    println!(
        "forked tenant {source}{from} into {new}{} in {:.1} ms: {} on disk, nearly all of it \
         shared with {source}; each sees only its own changes from now on",
        if live { " while it is served" } else { "" },
        took as f64 / 1e3,
        ByteSize(disk),
    );
    Ok(())
}

/// `tenant rotate-key NAME`.
pub fn rotate_key(cli: &Cli, name: &str) -> Result<()> {
    let id = match through_server(cli, name, |p| p.rotate_key(name))? {
        Some(reply) => reply.key_id,
        None => {
            let data = cli.open_data_dir()?;
            tenants::rotate_key_closed(&data, name)
                .with_context(|| format!("tenant {name} keeps its key"))?
                .to_hex()
        }
    };
    let (ids, _) = tenants::key_ids(&cli.data_dir, name)?;
    println!(
        "tenant {name}: the files it writes from now on are sealed under key {id}; its ring \
         holds {} keys (older files keep theirs)",
        ids.len()
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
