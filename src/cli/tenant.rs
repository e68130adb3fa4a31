//! The data dir and its tenants: `init`, `tenant create|list|delete`, `config check`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use tenantfs::config::Config;
use tenantfs::control::{ControlError, RefusalCode};
use tenantfs::data_dir::DataDir;
use tenantfs::tenants;
use tenantfs::units::ByteSize;

use super::{command_stores, daemon_error, print_json, Cli, Limit};

pub fn init(cli: &Cli) -> Result<()> {
    let root = &cli.data_dir;
    let report = DataDir::init(root, cli.master_key.as_deref())?;
    if report.already_initialised {
        println!(
            "data dir {} is already initialised (key checked)",
            root.display()
        );
    } else {
        println!("initialised data dir {}", root.display());
    }
    if report.created_key {
        println!(
            "created master key {} (mode 0600); back it up: without it no tenant can be opened",
            report.key.path().display()
        );
    } else {
        println!("master key: {}", report.key.path().display());
    }
    Ok(())
}

pub fn create(
    cli: &Cli,
    name: &str,
    block_size: Option<ByteSize>,
    base: Option<&str>,
) -> Result<()> {
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let host = command_stores(&config);
    let info = match base {
        None => tenants::create(&data, &host, name, block_size.map(|b| b.0))
            .with_context(|| format!("cannot create tenant {name}"))?,
        Some(base) => {
            if block_size.is_some() {
                anyhow::bail!(
                    "cannot create tenant {name}: --block-size and --base do not go together \
                     (a tenant from a base uses the base's block size)"
                );
            }
            let started = std::time::Instant::now();
            let store = tenantfs::base::BaseStore::open(&data, &host)?;
            let info = store
                .create_tenant(&data, &host, name, base)
                .with_context(|| format!("cannot create tenant {name} from base {base}"))?;
            println!(
                "grafted base {base} into tenant {name} in {:.2} s (no data copied)",
                started.elapsed().as_secs_f64()
            );
            info
        }
    };
    println!(
        "created tenant {} (block size {}, {} on disk, encrypted)",
        info.name,
        ByteSize(info.block_size.into()),
        ByteSize(info.disk_bytes)
    );
    Ok(())
}

/// The tenants with where they are mounted. The list comes from the data dir; the
/// mountpoints from whoever serves them: the daemon and each foreground mount's process
/// under `<data-dir>/run/` answer `tenant_list` with what they serve (a mount table lookup by
/// name could not tell two data dirs' tenants of the same name apart).
pub fn list(cli: &Cli, json: bool) -> Result<()> {
    let root = &cli.data_dir;
    let mut list: Vec<ListedTenant> = tenants::list(root)?
        .into_iter()
        .map(|info| ListedTenant {
            info,
            mounts: Vec::new(),
        })
        .collect();
    let servers = match cli.serving_processes() {
        Ok(s) => s,
        Err(ControlError::NoServer(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for server in servers {
        for s in server.tenant_list().map_err(daemon_error)?.tenants {
            if let Some(t) = list.iter_mut().find(|t| t.info.name == s.name) {
                t.mounts.extend(s.mounts);
            }
        }
    }
    if json {
        return print_json(&list);
    }
    if list.is_empty() {
        println!("no tenants in {}", root.display());
        return Ok(());
    }
    println!(
        "{:<32} {:>10} {:>14}  {:<16} MOUNTED AT",
        "NAME", "BLOCK", "DISK BYTES", "BASE"
    );
    for t in list {
        let mounts: Vec<String> = t.mounts.iter().map(|m| m.display().to_string()).collect();
        println!(
            "{:<32} {:>10} {:>14}  {:<16} {}",
            t.info.name,
            t.info.block_size,
            t.info.disk_bytes,
            t.info.base.as_deref().unwrap_or("-"),
            if mounts.is_empty() {
                "-".to_owned()
            } else {
                mounts.join(", ")
            }
        );
    }
    Ok(())
}

/// One line of `tenant list --json`: the tenant's record and where it is mounted.
#[derive(serde::Serialize)]
struct ListedTenant {
    #[serde(flatten)]
    info: tenants::TenantInfo,
    mounts: Vec<PathBuf>,
}

pub fn delete(cli: &Cli, name: &str) -> Result<()> {
    let data = cli.open_data_dir()?;
    tenants::delete(&data, name)?;
    println!("deleted tenant {name}");
    Ok(())
}

/// `tenant set NAME --iops N --bandwidth SIZE`: the new limits go to every process that
/// serves a mount of the tenant, and take effect at once.
pub fn set_limits(
    cli: &Cli,
    name: &str,
    iops: Option<Limit>,
    bandwidth: Option<Limit>,
) -> Result<()> {
    if iops.is_none() && bandwidth.is_none() {
        anyhow::bail!(
            "say what to change: --iops N (requests a second) or --bandwidth SIZE (bytes a              second, e.g. 100M), or unlimited for either"
        );
    }
    if !cli.data_dir.join("tenants").join(name).is_dir() {
        anyhow::bail!(
            "no tenant {name} in {} (see `tenantfs tenant list`)",
            cli.data_dir.display()
        );
    }
    let mut mounts = Vec::new();
    for process in cli.serving_processes().map_err(daemon_error)? {
        match process.set_limits(name, iops.map(Limit::wire), bandwidth.map(Limit::wire)) {
            Ok(reply) => mounts.extend(reply.mounts),
            Err(e)
                if e.refusal()
                    .is_some_and(|r| r.code == RefusalCode::NotServed) => {}
            Err(e) => return Err(daemon_error(e)),
        }
    }
    if mounts.is_empty() {
        anyhow::bail!(
            "tenant {name} is not mounted: limits apply to a mounted tenant (mount it with              -o iops=N,bandwidth=SIZE, or mount it and run this again)"
        );
    }
    for m in mounts {
        let iops = m
            .iops_limit
            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        let bandwidth = m
            .bandwidth_limit
            .map_or_else(|| "unlimited".to_owned(), |b| format!("{}/s", ByteSize(b)));
        println!(
            "tenant {name} on {}: {iops} IOPS, {bandwidth}",
            m.mountpoint.display()
        );
    }
    Ok(())
}

pub fn config_check(cli: &Cli) -> Result<()> {
    let path = cli.config.as_deref();
    let shown = path.map_or_else(
        || tenantfs::config::DEFAULT_PATH.to_owned(),
        |p| p.display().to_string(),
    );
    let config = Config::load(path)?;
    println!(
        "{shown}: ok (cache budget {}, write buffers {}, direct I/O {:?}, governor {})",
        config.cache.budget,
        config.store.write_buffers,
        config.store.direct_io,
        if config.pressure.governor {
            format!("every {} ms", config.pressure.interval_ms)
        } else {
            "off".into()
        }
    );
    Ok(())
}
