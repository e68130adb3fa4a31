//! The `tenantfs` command line: parses arguments, then calls one function per command.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tenantfs::config::{ByteSize, Config};
use tenantfs::control::{self, Request};
use tenantfs::data_dir::DataDir;
use tenantfs::fuse::{block_shutdown_signals, prepare_mountpoint, serve, MountOptions};
use tenantfs::pressure::Governor;
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
    /// The daemon's control socket (default <data-dir>/tenantfs.sock).
    #[arg(long, global = true, env = "TENANTFS_SOCKET")]
    socket: Option<PathBuf>,
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
        /// Mount options: cache=direct (default) or cache=kernel, transport=auto (default), uring
        /// or dev, ro, rw.
        #[arg(short = 'o', default_value = "")]
        options: String,
    },
    /// Flush and unmount a tenant filesystem.
    Umount { mountpoint: PathBuf },
    /// Check the config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run the host daemon: serve every tenant mounted through it, with one host cache.
    Daemon,
    /// The daemon's mounts (operations, bytes, latency) and host numbers.
    Stats {
        /// Print a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Import, list, verify and delete shared base images.
    #[command(subcommand)]
    Base(BaseCommand),
    /// Inspect and steer the host cache of the process serving the mounts.
    #[command(subcommand)]
    Cache(CacheCommand),
}

#[derive(Subcommand)]
enum BaseCommand {
    /// Import a directory tree or a raw disk image as base NAME (each distinct block stored
    /// once per host).
    Import {
        name: String,
        source: PathBuf,
        /// Block size (power of two, 4K..1M); tenants from this base use it.
        #[arg(long, default_value = "4096")]
        block_size: ByteSize,
    },
    /// List bases with their logical and unique bytes, and host totals.
    List {
        /// Print a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Read back every stored block and check it.
    Verify,
    /// Delete base NAME (blocks no other base holds become garbage for `base gc`).
    Delete { name: String },
    /// Give back the disk space of blocks no base holds any more.
    Gc,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Show the cache's budget, use, memory and counters.
    Stats {
        /// Print a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Evict SIZE from the cache now and give the memory back to the kernel (e.g. 512M).
    Release { size: ByteSize },
    /// Set the cache budget ceiling to SIZE (the governor may hold it lower under pressure).
    Budget { size: ByteSize },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Create a tenant with its own key and empty encrypted store.
    Create {
        name: String,
        /// Volume block size in bytes (power of two, 4K..1M).
        #[arg(long)]
        block_size: Option<ByteSize>,
        /// Start from base image BASE: its whole tree at once, no data copied (the block size
        /// is the base's).
        #[arg(long)]
        base: Option<String>,
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
    tenantfs::logging::init("warn");
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!: it panics when stderr cannot be written (a full disk).
            let _ = writeln!(std::io::stderr(), "tenantfs: error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once: most library errors already name their cause in
/// their own message (so that a control-socket reply is whole), and `{:#}` would repeat it.
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if out.contains(&cause) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&cause);
    }
    out
}

fn run(cli: Cli) -> Result<()> {
    let key = cli.master_key.as_deref();
    match &cli.command {
        Command::Init => init(&cli.data_dir, key),
        Command::Tenant(TenantCommand::Create {
            name,
            block_size,
            base,
        }) => tenant_create(
            &cli.data_dir,
            key,
            cli.config.as_deref(),
            name,
            *block_size,
            base.as_deref(),
        ),
        Command::Tenant(TenantCommand::List { json }) => tenant_list(&cli, *json),
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
            } else if let Some(socket) = live_daemon(&cli) {
                let mp = std::path::absolute(mountpoint)?;
                let r = ask(
                    &socket,
                    &Request::Mount {
                        tenant: tenant.clone(),
                        mountpoint: mp.to_string_lossy().into_owned(),
                        options: options.clone(),
                    },
                )?;
                println!(
                    "mounted tenant {tenant} at {} (served by the daemon, pid {})",
                    mountpoint.display(),
                    r["pid"]
                );
                Ok(())
            } else {
                mount_background(&cli, tenant, mountpoint, options)
            }
        }
        Command::Umount { mountpoint } => {
            if let Some(socket) = live_daemon(&cli) {
                let mp = std::path::absolute(mountpoint)?;
                let served = tenantfs::fuse::find_mount(&mp).ok().flatten().is_some();
                if served {
                    match control::request(
                        &socket,
                        &Request::Umount {
                            mountpoint: mp.to_string_lossy().into_owned(),
                        },
                    ) {
                        Ok(r) => {
                            println!(
                                "unmounted {} (tenant {}, flushed)",
                                mountpoint.display(),
                                r["tenant"].as_str().unwrap_or("?")
                            );
                            return Ok(());
                        }
                        Err(control::ControlError::Refused { message, .. })
                            if message.contains("serves nothing") => {}
                        Err(e) => anyhow::bail!("{}", daemon_error(e)),
                    }
                }
            }
            umount(&cli.data_dir, mountpoint)
        }
        Command::Cache(c) => cache_command(&cli.data_dir, live_daemon(&cli).as_deref(), c),
        Command::Daemon => daemon(&cli),
        Command::Stats { json } => stats(&cli, *json),
        Command::Base(c) => base_command(&cli, c),
    }
}

/// The daemon's socket, if a daemon answers on it.
fn live_daemon(cli: &Cli) -> Option<PathBuf> {
    let path = cli
        .socket
        .clone()
        .unwrap_or_else(|| tenantfs::daemon::default_socket(&cli.data_dir));
    std::os::unix::net::UnixStream::connect(&path)
        .ok()
        .map(|_| path)
}

/// Every process serving mounts of the data dir at `root`: the daemon (if one answers) and
/// each per-mount serving process. Errors only when there is none.
fn serving_processes(
    root: &Path,
    daemon: Option<&Path>,
) -> Result<Vec<PathBuf>, control::ControlError> {
    let mut sockets: Vec<PathBuf> = daemon.map(Path::to_owned).into_iter().collect();
    match control::serving_sockets(root) {
        Ok(s) => sockets.extend(s),
        Err(e) if sockets.is_empty() => return Err(e),
        Err(_) => {}
    }
    Ok(sockets)
}

/// One request to a serving process; its refusal becomes the error message.
fn ask(socket: &Path, req: &Request) -> Result<serde_json::Value> {
    control::request(socket, req).map_err(|e| anyhow::anyhow!("{}", daemon_error(e)))
}

/// A daemon's refusal is the whole message; other errors keep their context.
fn daemon_error(e: control::ControlError) -> String {
    match e {
        control::ControlError::Refused { message, .. } => message,
        e => e.to_string(),
    }
}

fn stats(cli: &Cli, json: bool) -> Result<()> {
    let Some(socket) = live_daemon(cli) else {
        anyhow::bail!(
            "the tenantfs daemon is not running on {} (start it with `tenantfs daemon`; \
             without it, `tenantfs cache stats` shows each serving process)",
            cli.socket
                .clone()
                .unwrap_or_else(|| tenantfs::daemon::default_socket(&cli.data_dir))
                .display()
        );
    };
    let v = ask(&socket, &Request::Stats)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mib = |v: &serde_json::Value| v.as_u64().unwrap_or(0) >> 20;
    let c = &v["cache"];
    println!(
        "daemon pid {}: {} mounts; cache budget {} MiB, used {} MiB, resident {} MiB; RSS {} MiB; hits {}, misses {}",
        v["pid"],
        v["mounts"].as_array().map_or(0, Vec::len),
        mib(&c["budget_bytes"]),
        mib(&c["used_bytes"]),
        mib(&c["resident_bytes"]),
        mib(&c["process_rss_bytes"]),
        c["hits"],
        c["misses"]
    );
    println!(
        "{:<16} {:<32} {:>9} {:>9} {:>9} {:>9} {:>14} {:>14} {:>6}",
        "TENANT",
        "MOUNTPOINT",
        "READS",
        "READ MiB",
        "WRITES",
        "WRIT MiB",
        "READ p50/p99",
        "WRITE p50/p99",
        "STATE"
    );
    for m in v["mounts"].as_array().into_iter().flatten() {
        let op = |o: &str, k: &str| m["ops"][o][k].as_u64().unwrap_or(0);
        let lat = |o: &str| {
            if op(o, "calls") == 0 {
                "-".to_string()
            } else {
                format!("<{}/<{} us", op(o, "p50_us_le"), op(o, "p99_us_le"))
            }
        };
        let state: Option<tenantfs::store::StoreState> =
            serde_json::from_value(m["store"].clone()).ok();
        println!(
            "{:<16} {:<32} {:>9} {:>9} {:>9} {:>9} {:>14} {:>14} {:>6}",
            m["tenant"].as_str().unwrap_or("?"),
            m["mountpoint"].as_str().unwrap_or("?"),
            op("read", "calls"),
            mib(&m["read_bytes"]),
            op("write", "calls"),
            mib(&m["written_bytes"]),
            lat("read"),
            lat("write"),
            state.as_ref().map_or("-", |s| s.label())
        );
    }
    for w in v["waiting_mounts"].as_array().into_iter().flatten() {
        println!(
            "configured mount {} at {} is not mounted yet (attempt {}, next in {} s): {}",
            w["tenant"].as_str().unwrap_or("?"),
            w["mountpoint"].as_str().unwrap_or("?"),
            w["attempts"],
            w["next_attempt_in_ms"].as_u64().unwrap_or(0).div_ceil(1000),
            w["error"].as_str().unwrap_or("?")
        );
    }
    // Why a tenant does not take writes, and when it will again.
    for m in v["mounts"].as_array().into_iter().flatten() {
        let tenant = m["tenant"].as_str().unwrap_or("?");
        let ago = |since: u64| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs().saturating_sub(since))
        };
        match serde_json::from_value(m["store"].clone()) {
            Ok(tenantfs::store::StoreState::NoSpace {
                since_unix,
                free_bytes,
                needs_free_bytes,
                ..
            }) => println!(
                "tenant {tenant} is read-only for {} s: its filesystem is full; it takes writes \
                 again by itself once {} MiB are free there ({} MiB free when last checked)",
                ago(since_unix),
                needs_free_bytes.div_ceil(1 << 20),
                free_bytes >> 20
            ),
            Ok(tenantfs::store::StoreState::Failed { since_unix, detail }) => println!(
                "tenant {tenant} stopped taking writes {} s ago ({detail}); remount it",
                ago(since_unix)
            ),
            _ => {}
        }
    }
    Ok(())
}

fn daemon(cli: &Cli) -> Result<()> {
    // Before any thread starts: SIGTERM/SIGINT must reach only the thread that waits for them,
    // and malloc's arenas are set before threads create more.
    block_shutdown_signals();
    tenantfs::cache::malloc::tune_for_serving();
    let config = Config::load(cli.config.as_deref())?;
    let data = DataDir::open(&cli.data_dir, cli.master_key.as_deref())?;
    let socket = cli
        .socket
        .clone()
        .unwrap_or_else(|| tenantfs::daemon::default_socket(&cli.data_dir));
    tenantfs::daemon::run(data, &config, &socket)
        .with_context(|| format!("daemon on {}", socket.display()))?;
    Ok(())
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
    tenantfs::cache::malloc::tune_for_serving();
    // Check everything that can fail before opening the store, so nothing is touched.
    prepare_mountpoint(mountpoint)?;
    let config = Config::load(cli.config.as_deref())?;
    let data = DataDir::open(&cli.data_dir, cli.master_key.as_deref())?;
    let cache = Arc::new(config.host_cache());
    let host = config.store_host(Some(&cache));
    let opened = tenants::open_when_free(&data, &host, tenant)?;
    let from_base = opened.info().base.is_some();
    let mut volume =
        Volume::open(opened).with_context(|| format!("cannot open tenant {tenant}"))?;
    if from_base {
        // Base blocks are read from the host's packs through the host block cache.
        volume = volume.with_base(Arc::new(tenantfs::base::BaseBlockReader::new(
            &data,
            Some(cache.clone()),
        )));
    }
    let governor = match config.governor() {
        Some(g) => Some(Arc::new(
            Governor::start(cache.clone(), cache.budget(), g)
                .context("cannot start the cache governor")?,
        )),
        None => None,
    };
    let cache_requests =
        control::cache_handler(cache.clone(), governor, format!("mount of tenant {tenant}"));
    // `tenant list` asks each serving process what it serves: here, this one mount.
    let served = serde_json::json!([{
        "name": tenant,
        "mounts": [std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_owned())],
    }]);
    let _control = control::Server::start(
        &control::mount_socket(&cli.data_dir, tenant),
        Arc::new(move |req| match req {
            Request::TenantList => control::Response::ok(served.clone()),
            other => cache_requests(other),
        }),
    )
    .context("cannot open the control socket")?;
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
    base: Option<&str>,
) -> Result<()> {
    let config = Config::load(config)?;
    let data = DataDir::open(root, key)?;
    let host = config.store_host(None);
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
        ByteSize(
            tenants::list(root)?
                .iter()
                .find(|t| t.name == info.name)
                .map_or(info.disk_bytes, |t| t.disk_bytes)
        )
    );
    Ok(())
}

/// The tenants with where they are mounted. The list comes from the data dir; the
/// mountpoints from whoever serves them: the daemon and each per-mount serving process under
/// `<data-dir>/run/` answer `tenant_list` with what they serve (a mount table lookup by name
/// could not tell two data dirs' tenants of the same name apart).
fn tenant_list(cli: &Cli, json: bool) -> Result<()> {
    let root = &cli.data_dir;
    let mut list: Vec<serde_json::Value> = tenants::list(root)?
        .into_iter()
        .map(|t| {
            let mut v = serde_json::json!(t);
            v["mounts"] = serde_json::json!([]);
            v
        })
        .collect();
    let servers = match serving_processes(root, live_daemon(cli).as_deref()) {
        Ok(s) => s,
        Err(control::ControlError::NoServer(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for socket in servers {
        let served = ask(&socket, &Request::TenantList)?;
        for s in served.as_array().into_iter().flatten() {
            let mounts = s["mounts"].as_array().cloned().unwrap_or_default();
            if let Some(t) = list.iter_mut().find(|t| t["name"] == s["name"]) {
                if let Some(m) = t["mounts"].as_array_mut() {
                    m.extend(mounts);
                }
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
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
        let mounts: Vec<&str> = t["mounts"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m.as_str()).collect())
            .unwrap_or_default();
        println!(
            "{:<32} {:>10} {:>14}  {:<16} {}",
            t["name"].as_str().unwrap_or("?"),
            t["block_size"].as_u64().unwrap_or(0),
            t["disk_bytes"].as_u64().unwrap_or(0),
            t["base"].as_str().unwrap_or("-"),
            if mounts.is_empty() {
                "-".to_owned()
            } else {
                mounts.join(", ")
            }
        );
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

fn base_command(cli: &Cli, cmd: &BaseCommand) -> Result<()> {
    use tenantfs::base::{BaseStore, Progress};
    let config = Config::load(cli.config.as_deref())?;
    let data = DataDir::open(&cli.data_dir, cli.master_key.as_deref())?;
    let host = config.store_host(None);
    let store = BaseStore::open(&data, &host)?;
    match cmd {
        BaseCommand::Import {
            name,
            source,
            block_size,
        } => {
            let bs = u32::try_from(block_size.0).unwrap_or(0);
            let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let started = std::time::Instant::now();
            let mut show = |p: Progress| {
                if tty && p.total_bytes > 0 {
                    eprint!(
                        "\rimporting {name}: {:>3}% ({} of {} MiB)",
                        p.done_bytes * 100 / p.total_bytes,
                        p.done_bytes >> 20,
                        p.total_bytes >> 20
                    );
                }
            };
            let info = store
                .import(name, source, bs, &mut show)
                .with_context(|| format!("cannot import base {name}"))?;
            if tty {
                eprintln!();
            }
            println!(
                "imported base {} from {}: {} entries, {} logical, {} unique, in {:.1} s",
                info.name,
                source.display(),
                info.files,
                ByteSize(info.logical_bytes),
                ByteSize(info.unique_bytes),
                started.elapsed().as_secs_f64()
            );
        }
        BaseCommand::List { json } => {
            let list = store.list()?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            println!(
                "{:<24} {:>6} {:>8} {:>14} {:>14} {:>14} {:>8}",
                "NAME", "KIND", "FILES", "LOGICAL", "UNIQUE", "STORED", "TENANTS"
            );
            for b in &list.bases {
                println!(
                    "{:<24} {:>6} {:>8} {:>14} {:>14} {:>14} {:>8}",
                    b.name,
                    format!("{:?}", b.kind).to_lowercase(),
                    b.files,
                    b.logical_bytes,
                    b.unique_bytes,
                    b.stored_bytes,
                    b.tenants.len()
                );
            }
            println!(
                "LOGICAL: file sizes; UNIQUE: file bytes left after holes and duplicate blocks; \
                 STORED: its distinct blocks, whole, on disk"
            );
            println!(
                "host: {} logical, {} stored, {} in packs",
                list.host.logical_bytes, list.host.stored_bytes, list.host.pack_bytes
            );
        }
        BaseCommand::Verify => {
            let r = store.verify()?;
            for b in &r.bad {
                eprintln!("damaged: {b}");
            }
            if !r.is_clean() {
                anyhow::bail!(
                    "{} of {} blocks damaged, {} block references without a block; restore the data dir from a backup",
                    r.bad.len(),
                    r.blocks,
                    r.missing
                );
            }
            println!("verified {} blocks: all intact", r.blocks);
        }
        BaseCommand::Delete { name } => {
            store.delete(name)?;
            println!("deleted base {name}; run `tenantfs base gc` to reclaim its disk space");
        }
        BaseCommand::Gc => {
            let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let r = store.gc(&mut |p: Progress| {
                if tty && p.total_bytes > 0 {
                    eprint!("\rbase gc: pack {} of {}", p.done_bytes, p.total_bytes);
                }
            })?;
            if tty {
                eprintln!();
            }
            println!(
                "base gc: {} packs, {} live blocks, {} garbage slots, {} packs deleted, {} reclaimed",
                r.packs,
                r.live_blocks,
                r.garbage_slots,
                r.packs_deleted,
                ByteSize(r.reclaimed_bytes)
            );
        }
    }
    Ok(())
}

/// Numeric fields summed over serving processes for `cache stats`.
const SUMMED: [&str; 10] = [
    "budget_bytes",
    "ceiling_bytes",
    "used_bytes",
    "resident_bytes",
    "hits",
    "misses",
    "evictions",
    "released_bytes",
    "mapped_bytes",
    "process_rss_bytes",
];

fn cache_command(root: &Path, daemon: Option<&Path>, cmd: &CacheCommand) -> Result<()> {
    use serde_json::{json, Value};
    let sockets = serving_processes(root, daemon)?;
    let ask_all = |req: &Request| -> Result<Vec<Value>> {
        sockets
            .iter()
            .map(|s| control::request(s, req).map_err(anyhow::Error::from))
            .collect()
    };
    match cmd {
        CacheCommand::Stats { json } => {
            let each = ask_all(&Request::CacheStats)?;
            let mut total = serde_json::Map::new();
            for key in SUMMED {
                let sum: u64 = each.iter().filter_map(|v| v[key].as_u64()).sum();
                total.insert(key.into(), json!(sum));
            }
            total.insert("processes".into(), Value::Array(each.clone()));
            if *json {
                println!("{}", serde_json::to_string_pretty(&Value::Object(total))?);
                return Ok(());
            }
            let mib = |v: &Value, k: &str| format!("{} MiB", v[k].as_u64().unwrap_or(0) >> 20);
            for v in &each {
                println!(
                    "{} (pid {}): budget {} (ceiling {}), used {}, resident {}, process RSS {}",
                    v["server"].as_str().unwrap_or("?"),
                    v["pid"],
                    mib(v, "budget_bytes"),
                    mib(v, "ceiling_bytes"),
                    mib(v, "used_bytes"),
                    mib(v, "resident_bytes"),
                    mib(v, "process_rss_bytes"),
                );
                println!(
                    "  hits {}, misses {}, evictions {}, released {}",
                    v["hits"],
                    v["misses"],
                    v["evictions"],
                    mib(v, "released_bytes")
                );
                if let Some(d) = v["governor"]["last_decision"].as_str() {
                    println!("  governor: {d}");
                }
            }
        }
        CacheCommand::Release { size } => {
            // Split over the serving processes in proportion to what their caches hold.
            let each = ask_all(&Request::CacheStats)?;
            let used: Vec<u64> = each
                .iter()
                .map(|v| v["used_bytes"].as_u64().unwrap_or(0))
                .collect();
            let total: u64 = used.iter().sum::<u64>().max(1);
            let mut released = 0;
            for (s, u) in sockets.iter().zip(&used) {
                let bytes = (size.0 as u128 * *u as u128 / total as u128) as u64;
                let r = control::request(s, &Request::CacheRelease { bytes })?;
                released += r["released_bytes"].as_u64().unwrap_or(0);
            }
            println!(
                "released {} of cache memory to the kernel (asked {})",
                ByteSize(released),
                size
            );
        }
        CacheCommand::Budget { size } => {
            // One host budget, shared equally by the serving processes.
            let n = sockets.len() as u64;
            ask_all(&Request::CacheBudget { bytes: size.0 / n })?;
            if n == 1 {
                println!("cache budget set to {size}");
            } else {
                println!(
                    "cache budget set to {size}: {} for each of {n} serving processes",
                    ByteSize(size.0 / n)
                );
            }
        }
    }
    Ok(())
}
