//! Block volumes: `volume create|list|resize|delete` work on the data dir; `attach` and
//! `detach` ask the daemon, which serves them.

use anyhow::{Context, Result};
use tenantfs::blockdev;
use tenantfs::control::replies::VolumeReport;
use tenantfs::control::AttachVia;
use tenantfs::nbd::NbdAddress;
use tenantfs::units::ByteSize;

use super::{command_stores, daemon_error, print_json, Cli};

pub fn create(cli: &Cli, name: &str, size: Option<ByteSize>, base: Option<&str>) -> Result<()> {
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let host = command_stores(&config);
    let info = blockdev::create(&data, &host, name, size.map(|s| s.0), base)
        .with_context(|| format!("cannot create volume {name}"))?;
    let size = info.device_size.unwrap_or(0);
    println!(
        "created volume {name} ({}, block size {}{}, encrypted); serve it with `tenantfs \
         volume attach {name} --ublk`, `--nbd-device` or `--nbd ADDR`",
        ByteSize(size),
        ByteSize(info.block_size.into()),
        base.map(|b| format!(", from base {b}, copy on write"))
            .unwrap_or_default()
    );
    Ok(())
}

/// One line of `volume list --json`.
#[derive(serde::Serialize)]
struct ListedVolume {
    #[serde(flatten)]
    info: tenantfs::tenants::TenantInfo,
    /// Where the daemon serves it, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    attached: Option<VolumeReport>,
}

pub fn list(cli: &Cli, json: bool) -> Result<()> {
    let attached: Vec<VolumeReport> = match cli.live_daemon()? {
        Some(d) => d.stats().map_err(daemon_error)?.volumes,
        None => Vec::new(),
    };
    let list: Vec<ListedVolume> = blockdev::list(&cli.data_dir)?
        .into_iter()
        .map(|info| ListedVolume {
            attached: attached
                .iter()
                .find(|v| v.served.volume == info.name)
                .cloned(),
            info,
        })
        .collect();
    if json {
        return print_json(&list);
    }
    if list.is_empty() {
        println!("no volumes in {}", cli.data_dir.display());
        return Ok(());
    }
    println!(
        "{:<32} {:>12} {:>14}  {:<16} ATTACHED AT",
        "NAME", "SIZE", "DISK BYTES", "BASE"
    );
    for v in list {
        println!(
            "{:<32} {:>12} {:>14}  {:<16} {}",
            v.info.name,
            ByteSize(v.info.device_size.unwrap_or(0)).to_string(),
            v.info.disk_bytes,
            v.info.base.as_deref().unwrap_or("-"),
            v.attached.as_ref().map_or("-".to_owned(), attached_at)
        );
    }
    Ok(())
}

/// Where an attached volume is served, as `list` and `stats` show it.
pub fn attached_at(a: &VolumeReport) -> String {
    if a.served.kind == "nbd" {
        format!("nbd {} ({} clients)", a.served.address, a.connections)
    } else {
        format!("{} {}", a.served.kind, a.served.address)
    }
}

pub fn resize(cli: &Cli, name: &str, size: ByteSize, shrink: bool) -> Result<()> {
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let host = command_stores(&config);
    let r = blockdev::resize(&data, &host, name, size.0, shrink)
        .with_context(|| format!("cannot resize volume {name}"))?;
    if r.old == r.new {
        println!("volume {name} is {} already", ByteSize(r.new));
    } else {
        println!(
            "resized volume {name}: {} -> {}",
            ByteSize(r.old),
            ByteSize(r.new)
        );
    }
    Ok(())
}

pub fn delete(cli: &Cli, name: &str) -> Result<()> {
    let data = cli.open_data_dir()?;
    blockdev::delete(&data, name).with_context(|| format!("cannot delete volume {name}"))?;
    println!("deleted volume {name}");
    Ok(())
}

pub fn attach(
    cli: &Cli,
    name: &str,
    nbd: Option<&str>,
    ublk: bool,
    nbd_device: bool,
) -> Result<()> {
    // The daemon runs elsewhere: a relative socket path is made absolute here.
    let address = match nbd {
        Some(nbd) => Some(
            NbdAddress::parse(nbd)?
                .absolute()
                .context("cannot resolve the socket path")?
                .to_string(),
        ),
        None => None,
    };
    let Some(via) = AttachVia::of(address, ublk, nbd_device) else {
        anyhow::bail!(
            "say how to serve volume {name}: --ublk (as /dev/ublkbN), --nbd-device (as \
             /dev/nbdN), --nbd unix:PATH or --nbd 127.0.0.1:PORT"
        );
    };
    let Some(daemon) = cli.live_daemon()? else {
        anyhow::bail!(
            "cannot attach volume {name}: no daemon answers on {}; volumes are served by the \
             daemon: start it (`tenantfs daemon`, or the tenantfs.service unit) and try again",
            cli.socket().display()
        );
    };
    let r = daemon
        .volume_attach(name, &via)
        .map_err(daemon_error)?
        .served;
    if r.kind == "nbd" {
        println!(
            "attached volume {} ({}) over NBD at {}  [{}]",
            r.volume,
            ByteSize(r.size_bytes),
            r.address,
            r.uri
        );
    } else {
        println!(
            "attached volume {} ({}) as {}",
            r.volume,
            ByteSize(r.size_bytes),
            r.address
        );
    }
    Ok(())
}

pub fn detach(cli: &Cli, name: &str) -> Result<()> {
    let Some(daemon) = cli.live_daemon()? else {
        anyhow::bail!(
            "cannot detach volume {name}: no daemon answers on {} (a volume is attached only \
             while the daemon runs)",
            cli.socket().display()
        );
    };
    let r = daemon.volume_detach(name).map_err(daemon_error)?;
    println!(
        "detached volume {} ({} client connections closed; store synced)",
        r.volume, r.connections_closed
    );
    Ok(())
}
