//! The `tenantfs` command line: parses arguments, then calls one function per command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tenantfs::config::{ByteSize, Config};
use tenantfs::data_dir::DataDir;
use tenantfs::fuse::{block_shutdown_signals, prepare_mountpoint, serve, MountOptions};
use tenantfs::tenants;
use tenantfs::volume::Volume;

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
    /// Mount a tenant's filesystem (returns once it is ready; serves in the background).
    Mount {
        tenant: String,
        mountpoint: PathBuf,
        /// Stay attached and serve in this process until unmounted.
        #[arg(long)]
        foreground: bool,
        /// Mount options: cache=direct (default) or cache=kernel, ro, rw.
        #[arg(short = 'o', default_value = "")]
        options: String,
    },
    /// Flush and unmount a tenant filesystem.
    Umount { mountpoint: PathBuf },
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
    match &cli.command {
        Command::Init => init(&cli.data_dir, key),
        Command::Tenant(TenantCommand::Create { name, block_size }) => {
            tenant_create(&cli.data_dir, key, cli.config.as_deref(), name, *block_size)
        }
        Command::Tenant(TenantCommand::List { json }) => tenant_list(&cli.data_dir, *json),
        Command::Tenant(TenantCommand::Delete { name }) => tenant_delete(&cli.data_dir, key, name),
        Command::Config(ConfigCommand::Check) => config_check(cli.config.as_deref()),
        Command::Mount {
            tenant,
            mountpoint,
            foreground,
            options,
        } => {
            let parsed = MountOptions::parse(options)?;
            if *foreground {
                mount_foreground(&cli, tenant, mountpoint, &parsed)
            } else {
                mount_background(&cli, tenant, mountpoint, options)
            }
        }
        Command::Umount { mountpoint } => umount(&cli.data_dir, mountpoint),
    }
}

/// Set by `mount` (background) for the child it starts: print "ready" on stdout once mounted.
const READY_ENV: &str = "TENANTFS_MOUNT_READY";

fn mount_foreground(
    cli: &Cli,
    tenant: &str,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<()> {
    // Before any thread starts (the store's background threads): SIGTERM/SIGINT must reach only
    // the thread `serve` waits for them on, or they kill the process and leave a dead mount.
    block_shutdown_signals();
    // Check everything that can fail before opening the store, so nothing is touched.
    prepare_mountpoint(mountpoint)?;
    let config = Config::load(cli.config.as_deref())?;
    let data = DataDir::open(&cli.data_dir, cli.master_key.as_deref())?;
    let host = config.store_host();
    let opened = tenants::open(&data, &host, tenant)?;
    let volume = Volume::open(opened).with_context(|| format!("cannot open tenant {tenant}"))?;
    let log = data.tenants_dir().join(tenant).join("mount.log");
    let notify = std::env::var_os(READY_ENV).is_some();
    serve(volume, mountpoint, options, || {
        if notify {
            println!("ready");
            // The parent stops reading now: send further output to the tenant's log.
            detach_stdio(&log);
        } else {
            eprintln!(
                "serving tenant {tenant} at {} (Ctrl-C or `tenantfs umount` to stop)",
                mountpoint.display()
            );
        }
    })?;
    Ok(())
}

fn detach_stdio(log: &Path) {
    use std::os::fd::AsRawFd;
    let null = std::fs::File::options().write(true).open("/dev/null");
    let log = std::fs::File::options().create(true).append(true).open(log);
    if let (Ok(null), Ok(log)) = (null, log) {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
        let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
    }
}

fn mount_background(cli: &Cli, tenant: &str, mountpoint: &Path, options: &str) -> Result<()> {
    use std::io::{BufRead, Read};
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let exe = std::env::current_exe().context("cannot find the tenantfs binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--data-dir").arg(&cli.data_dir);
    if let Some(k) = &cli.master_key {
        cmd.arg("--master-key").arg(k);
    }
    if let Some(c) = &cli.config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(["mount", "--foreground", "-o", options, "--", tenant])
        .arg(mountpoint)
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C in this terminal does not stop the server.
        .process_group(0);
    let mut child = cmd.spawn().context("cannot start the serving process")?;
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let _ = out.read_line(&mut line);
    if line.trim() == "ready" {
        println!(
            "mounted tenant {tenant} at {} (served by pid {})",
            mountpoint.display(),
            child.id()
        );
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait()?;
    let err = err.trim().trim_start_matches("tenantfs: error: ");
    anyhow::bail!(
        "{}",
        if err.is_empty() {
            format!("the serving process exited ({status}) before the mount was ready")
        } else {
            err.to_owned()
        }
    )
}

fn umount(root: &Path, mountpoint: &Path) -> Result<()> {
    let tenant = tenantfs::fuse::unmount(mountpoint)?;
    // The serving process syncs and closes the store after the kernel lets go; wait for it so
    // the tenant can be mounted again (or deleted) as soon as this returns.
    match tenants::wait_until_closed(root, &tenant, std::time::Duration::from_secs(60)) {
        Ok(true) => println!(
            "unmounted {} (tenant {tenant}, flushed)",
            mountpoint.display()
        ),
        Ok(false) => anyhow::bail!(
            "unmounted {}, but the serving process of tenant {tenant} has not exited after 60 s",
            mountpoint.display()
        ),
        // A tenant of another data dir: the unmount itself succeeded.
        Err(_) => println!("unmounted {} (tenant {tenant})", mountpoint.display()),
    }
    Ok(())
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
