//! The `tenantfs` command line: parses arguments, then calls one function per command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tenantfs::config::{ByteSize, Config};
use tenantfs::data_dir::DataDir;
use tenantfs::tenants;

#[derive(Parser)]
#[command(
    name = "tenantfs",
    version,
    about = "Per-tenant encrypted filesystems for Linux hosts"
)]
struct Cli {
    /// Host data dir (tenants, keys, stores).
    #[arg(
        long,
        global = true,
        env = "TENANTFS_DATA_DIR",
        default_value = "/var/lib/tenantfs"
    )]
    data_dir: PathBuf,
    /// Master key file: 32 raw bytes or 64 hex characters, mode 0600.
    #[arg(long, global = true)]
    master_key: Option<PathBuf>,
    /// Config file (default /etc/tenantfs/tenantfs.toml if present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the data dir and a master key (if none is given).
    Init,
    /// Create, list and delete tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Check the config file.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Create a tenant with its own key and empty encrypted store.
    Create {
        name: String,
        /// Volume block size in bytes (power of two, 4K..1M).
        #[arg(long)]
        block_size: Option<ByteSize>,
    },
    /// List tenants.
    List {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tenant and all its data.
    Delete { name: String },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Parse and validate the config file; report errors with their line.
    Check,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TENANTFS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tenantfs: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let key = cli.master_key.as_deref();
    match cli.command {
        Command::Init => init(&cli.data_dir, key),
        Command::Tenant(TenantCommand::Create { name, block_size }) => {
            tenant_create(&cli.data_dir, key, cli.config.as_deref(), &name, block_size)
        }
        Command::Tenant(TenantCommand::List { json }) => tenant_list(&cli.data_dir, json),
        Command::Tenant(TenantCommand::Delete { name }) => tenant_delete(&cli.data_dir, key, &name),
        Command::Config(ConfigCommand::Check) => config_check(cli.config.as_deref()),
    }
}

fn init(root: &Path, key: Option<&Path>) -> Result<()> {
    let report = DataDir::init(root, key)?;
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

fn tenant_create(
    root: &Path,
    key: Option<&Path>,
    config: Option<&Path>,
    name: &str,
    block_size: Option<ByteSize>,
) -> Result<()> {
    let config = Config::load(config)?;
    let data = DataDir::open(root, key)?;
    let host = config.store_host();
    let info = tenants::create(&data, &host, name, block_size.map(|b| b.0))
        .with_context(|| format!("cannot create tenant {name}"))?;
    println!(
        "created tenant {} (block size {}, {} on disk, encrypted)",
        info.name,
        ByteSize(info.block_size.into()),
        ByteSize(info.disk_bytes)
    );
    Ok(())
}

fn tenant_list(root: &Path, json: bool) -> Result<()> {
    let list = tenants::list(root)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no tenants in {}", root.display());
        return Ok(());
    }
    println!("{:<32} {:>10} {:>14}", "NAME", "BLOCK", "DISK BYTES");
    for t in list {
        println!("{:<32} {:>10} {:>14}", t.name, t.block_size, t.disk_bytes);
    }
    Ok(())
}

fn tenant_delete(root: &Path, key: Option<&Path>, name: &str) -> Result<()> {
    let data = DataDir::open(root, key)?;
    tenants::delete(&data, name)?;
    println!("deleted tenant {name}");
    Ok(())
}

fn config_check(path: Option<&Path>) -> Result<()> {
    let shown = path.map_or_else(
        || tenantfs::config::DEFAULT_PATH.to_owned(),
        |p| p.display().to_string(),
    );
    let config = Config::load(path)?;
    println!(
        "{shown}: ok (block cache {}, write buffers {}, direct I/O {:?})",
        config.store.block_cache, config.store.write_buffers, config.store.direct_io
    );
    Ok(())
}
