//! A tenant's snapshots, forks and keys: `snapshot create|list|delete`, `tenant restore`,
//! `tenant fork`, `tenant rotate-key`.

use anyhow::{Context, Result};
use tenantfs::control::replies::RewriteReply;
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

/// `tenant rotate-key NAME [--rewrite]`: through the process that serves the tenant if one
/// does, else on its store opened here (for a rewrite) or on its record alone.
pub fn rotate_key(cli: &Cli, name: &str, rewrite: bool) -> Result<()> {
    let kept = || format!("tenant {name} keeps its key");
    let (id, rewritten) = match through_server(cli, name, |p| p.rotate_key(name, rewrite))? {
        Some(reply) if rewrite && reply.rewrite.is_none() => anyhow::bail!(
            "tenant {name} moved to key {}, but the process that serves it (an older \
             tenantfs) did not write its older files again; restart it with this tenantfs, \
             or unmount the tenant, and run the command again",
            reply.key_id
        ),
        Some(reply) => (reply.key_id, reply.rewrite),
        None if rewrite => {
            let config = cli.load_config()?;
            let data = cli.open_data_dir()?;
            let host = command_stores(&config);
            let open = tenants::open_when_free(&data, &host, name).with_context(kept)?;
            let vol = tenantfs::volume::Volume::open(open).with_context(kept)?;
            vol.check_room_for_rewrite().with_context(kept)?;
            let id = tenants::rotate_key(&data, vol.tenant()).with_context(kept)?;
            let done = vol.rewrite_under_writing_key().with_context(|| {
                format!(
                    "tenant {name} moved to key {id}, but its older files were not all \
                     written again under it; run the command again (it moves to one more key, \
                     and rewrites what is left)"
                )
            })?;
            let reply = RewriteReply {
                moved_bytes: done.moved_bytes,
                extent_files: done.extent_files,
                left: done.left.iter().map(|p| p.display().to_string()).collect(),
            };
            (id.to_hex(), Some(reply))
        }
        None => {
            let data = cli.open_data_dir()?;
            let id = tenants::rotate_key_closed(&data, name).with_context(kept)?;
            (id.to_hex(), None)
        }
    };
    let (ids, _) = tenants::key_ids(&cli.data_dir, name)?;
    println!(
        "tenant {name}: the files it writes from now on are sealed under key {id}; its ring \
         holds {} keys{}",
        ids.len(),
        if rewritten.is_some() {
            ""
        } else {
            " (older files keep theirs)"
        }
    );
    let Some(r) = rewritten else {
        return Ok(());
    };
    if !r.left.is_empty() {
        anyhow::bail!(
            "tenant {name}: {} of its files are still sealed under older keys ({}); run \
             `tenantfs tenant rotate-key {name} --rewrite` again (it moves to one more key, \
             and rewrites what is left)",
            r.left.len(),
            r.left.join(", ")
        );
    }
    println!(
        "tenant {name}: its older files were written again under key {id} ({} of bulk data \
         moved, {} extent files let go, every table and blob file rewritten): none of its \
         files is sealed under an older key now. Its ring keeps the older keys for its \
         snapshots and forks, whose files still use them.",
        ByteSize(r.moved_bytes),
        r.extent_files
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
