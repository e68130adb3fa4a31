//! The data dir and its tenants: `init`, `tenant create|list|delete`, `config check`.

use std::num::NonZeroU64;
use std::path::PathBuf;

use anyhow::{Context, Result};
use tenantfs::config::Config;
use tenantfs::control::{ControlError, LimitsChange, RefusalCode};
use tenantfs::data_dir::DataDir;
use tenantfs::quota::{Quota, QuotaChange};
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
    quota: Quota,
) -> Result<()> {
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let host = command_stores(&config);
    let info = match base {
        None => {
            let new = tenants::NewTenant {
                block_size: block_size.map(|b| b.0),
                quota,
                ..tenants::NewTenant::default()
            };
            tenants::create_as(&data, &host, name, &new)
                .with_context(|| format!("cannot create tenant {name}"))?
        }
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
                .create_tenant_with_quota(&data, &host, name, base, quota)
                .with_context(|| format!("cannot create tenant {name} from base {base}"))?;
            println!(
                "tenant {name} starts as a copy of base {base}'s tree in {:.1} ms (its files \
                 shared, no data copied)",
                started.elapsed().as_secs_f64() * 1e3
            );
            info
        }
    };
    println!(
        "created tenant {} (block size {}, {} on disk, encrypted, quota {})",
        info.name,
        ByteSize(info.block_size.into()),
        ByteSize(info.disk_bytes),
        quota_text(&info.quota)
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
            usage: None,
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
                t.usage = t.usage.or(s.usage);
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
        "{:<32} {:>10} {:>14} {:>14} {:>14}  {:<16} MOUNTED AT",
        "NAME", "BLOCK", "DISK BYTES", "USED BYTES", "QUOTA BYTES", "BASE"
    );
    for t in list {
        let mounts: Vec<String> = t.mounts.iter().map(|m| m.display().to_string()).collect();
        let used = t
            .usage
            .map_or_else(|| "-".to_owned(), |u| u.bytes.to_string());
        let quota = t
            .info
            .quota
            .bytes
            .map_or_else(|| "-".to_owned(), |q| q.to_string());
        println!(
            "{:<32} {:>10} {:>14} {:>14} {:>14}  {:<16} {}",
            t.info.name,
            t.info.block_size,
            t.info.disk_bytes,
            used,
            quota,
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

/// One line of `tenant list --json`: the tenant's record, where it is mounted and, while it
/// is, what its files take (its store is closed otherwise: `tenant check` counts them).
#[derive(serde::Serialize)]
struct ListedTenant {
    #[serde(flatten)]
    info: tenants::TenantInfo,
    mounts: Vec<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<tenantfs::quota::Usage>,
}

pub fn delete(cli: &Cli, name: &str, shred: bool) -> Result<()> {
    let data = cli.open_data_dir()?;
    if !shred {
        tenants::delete(&data, name)?;
        println!("deleted tenant {name}");
        return Ok(());
    }
    let holders = tenants::delete_shredded(&data, name)?;
    println!(
        "deleted tenant {name}; its keys were destroyed first: what is left of its files on \
         the disk opens under no key in {}",
        cli.data_dir.display()
    );
    if !holders.is_empty() {
        println!(
            "except where tenants {} hold copies of some of its keys (its forks, or the tenant \
             it was forked from, to read the files they share): its files sealed under those \
             keys still open under them (shred those tenants too to make all of its bytes \
             unreadable)",
            holders.join(", ")
        );
    }
    println!(
        "note: older copies of its record (each change of it was written as a new file) may \
         remain in the disk's free blocks until they are reused; they open only under this \
         data dir's master key"
    );
    Ok(())
}

/// What `tenant set` changes; `None`: leave it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Settings {
    pub iops: Option<Limit>,
    pub bandwidth: Option<Limit>,
    pub quota_bytes: Option<Limit>,
    pub quota_inodes: Option<Limit>,
    pub weight: Option<Limit>,
}

/// `tenant set NAME ...`: a quota goes into the tenant's record (through the process that
/// serves it, which applies it at once, or directly when none does); limits go to every
/// process that serves a mount of it, and take effect at once.
pub fn set(cli: &Cli, name: &str, settings: Settings) -> Result<()> {
    let Settings {
        iops,
        bandwidth,
        quota_bytes,
        quota_inodes,
        weight,
    } = settings;
    let limits = LimitsChange {
        iops: iops.map(Limit::wire),
        bandwidth: bandwidth.map(Limit::wire),
        weight: weight.map(Limit::wire),
    };
    if limits == LimitsChange::default() && quota_bytes.is_none() && quota_inodes.is_none() {
        anyhow::bail!(
            "say what to change: --quota-bytes SIZE, --quota-inodes N, --iops N (requests a \
             second), --bandwidth SIZE (bytes a second, e.g. 100M) or unlimited for any, or \
             --weight N"
        );
    }
    tenants::info(&cli.data_dir, name)?;
    let servers = match cli.serving_processes() {
        Ok(s) => s,
        Err(ControlError::NoServer(_)) => Vec::new(),
        Err(e) => return Err(daemon_error(e)),
    };
    if quota_bytes.is_some() || quota_inodes.is_some() {
        set_quota(cli, &servers, name, quota_bytes, quota_inodes)?;
    }
    if limits != LimitsChange::default() {
        set_limits(&servers, name, limits)?;
    }
    Ok(())
}

fn set_quota(
    cli: &Cli,
    servers: &[tenantfs::control::Client],
    name: &str,
    bytes: Option<Limit>,
    inodes: Option<Limit>,
) -> Result<()> {
    let (bytes, inodes) = (bytes.map(Limit::wire), inodes.map(Limit::wire));
    let mut served = None;
    for process in servers {
        match process.set_quota(name, bytes, inodes) {
            Ok(reply) => {
                served = Some((reply.quota, Some(reply.usage)));
                break;
            }
            Err(e)
                if e.refusal()
                    .is_some_and(|r| r.code == RefusalCode::NotServed) => {}
            Err(e) => return Err(daemon_error(e)),
        }
    }
    let (quota, usage) = match served {
        Some(s) => s,
        None => {
            let change = QuotaChange {
                bytes: bytes.map(NonZeroU64::new),
                inodes: inodes.map(NonZeroU64::new),
            };
            let old = tenants::info(&cli.data_dir, name)?.quota;
            let info = tenants::set_quota(&cli.data_dir, name, old.changed(change))
                .with_context(|| format!("cannot change the quota of tenant {name}"))?;
            (info.quota, None)
        }
    };
    let used = usage.map_or_else(String::new, |u| {
        format!(
            "; its files take {} in {} inodes",
            ByteSize(u.bytes),
            u.inodes
        )
    });
    println!("tenant {name}: quota {}{used}", quota_text(&quota));
    Ok(())
}

/// A quota for people: `10.0 GiB, 1000 inodes`, `unlimited`.
fn quota_text(quota: &Quota) -> String {
    if quota.is_unlimited() {
        return "unlimited".into();
    }
    let bytes = quota.bytes.map_or_else(
        || "unlimited bytes".to_owned(),
        |b| ByteSize(b.get()).to_string(),
    );
    let inodes = quota
        .inodes
        .map_or_else(|| "unlimited inodes".to_owned(), |n| format!("{n} inodes"));
    format!("{bytes}, {inodes}")
}

fn set_limits(
    servers: &[tenantfs::control::Client],
    name: &str,
    limits: LimitsChange,
) -> Result<()> {
    let mut mounts = Vec::new();
    for process in servers {
        match process.set_limits(name, limits) {
            Ok(reply) => mounts.extend(reply.mounts),
            Err(e)
                if e.refusal()
                    .is_some_and(|r| r.code == RefusalCode::NotServed) => {}
            Err(e) => return Err(daemon_error(e)),
        }
    }
    if mounts.is_empty() {
        anyhow::bail!(
            "tenant {name} is not mounted: limits and weights apply to a mounted tenant (mount \
             it with -o iops=N,bandwidth=SIZE,weight=N, or mount it and run this again)"
        );
    }
    for m in mounts {
        let iops = m
            .limits
            .iops_limit
            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        let bandwidth = m
            .limits
            .bandwidth_limit
            .map_or_else(|| "unlimited".to_owned(), |b| format!("{}/s", ByteSize(b)));
        let weight = m
            .limits
            .weight
            .unwrap_or(tenantfs::fair_share::DEFAULT_WEIGHT);
        println!(
            "tenant {name} on {}: {iops} IOPS, {bandwidth}, weight {weight}",
            m.mountpoint.display()
        );
    }
    Ok(())
}

/// `tenant check NAME`: counts what the files of an unmounted tenant take and corrects the
/// stored counts.
pub fn check(cli: &Cli, name: &str) -> Result<()> {
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let host = command_stores(&config);
    let tenant = tenants::open(&data, &host, name)?;
    let volume = tenantfs::volume::Volume::open(tenant)
        .with_context(|| format!("cannot open the files of tenant {name}"))?;
    let (stored, counted) = volume
        .check_usage()
        .with_context(|| format!("cannot count the files of tenant {name}"))?;
    let quota = volume.quota();
    drop(volume); // stores the counts
    let verdict = if stored == counted {
        "the stored counts were right".to_owned()
    } else {
        format!(
            "the stored counts said {} bytes in {} inodes; corrected",
            stored.bytes, stored.inodes
        )
    };
    println!(
        "tenant {name}: its files take {} bytes in {} inodes (quota {}); {verdict}",
        counted.bytes,
        counted.inodes,
        quota_text(&quota)
    );
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
