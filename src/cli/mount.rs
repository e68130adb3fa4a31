//! Mounting and unmounting: through the daemon when one runs, else by a serving process of
//! the mount's own (started in the background, or this process with `--foreground`); and
//! running the daemon.

use std::path::Path;

use anyhow::{Context, Result};
use tenantfs::control::RefusalCode;
use tenantfs::fuse::{block_shutdown_signals, prepare_mountpoint, MountOptions};
use tenantfs::tenants;

use super::{daemon_error, Cli};

/// Set by `mount` (background) for the child it starts: print "ready" on stdout once mounted.
const READY_ENV: &str = "TENANTFS_MOUNT_READY";

pub fn mount(
    cli: &Cli,
    tenant: &str,
    mountpoint: &Path,
    foreground: bool,
    options: &str,
) -> Result<()> {
    let parsed = MountOptions::parse(options)?;
    if foreground {
        return mount_foreground(cli, tenant, mountpoint, &parsed);
    }
    let Some(daemon) = cli.live_daemon()? else {
        return mount_background(cli, tenant, mountpoint, options);
    };
    let r = daemon
        .mount(tenant, &std::path::absolute(mountpoint)?, options)
        .map_err(daemon_error)?;
    println!(
        "mounted tenant {tenant} at {} (served by the daemon, pid {})",
        mountpoint.display(),
        r.pid
    );
    Ok(())
}

pub fn umount(cli: &Cli, mountpoint: &Path) -> Result<()> {
    if let Some(daemon) = cli.live_daemon()? {
        let mp = std::path::absolute(mountpoint)?;
        if tenantfs::fuse::find_mount(&mp).ok().flatten().is_some() {
            match daemon.umount(&mp) {
                Ok(r) => {
                    println!(
                        "unmounted {} (tenant {}, flushed)",
                        mountpoint.display(),
                        r.tenant
                    );
                    return Ok(());
                }
                // Served by a process of its own: unmount it by path below.
                Err(e)
                    if e.refusal()
                        .is_some_and(|r| r.code == RefusalCode::NotServed) => {}
                Err(e) => return Err(daemon_error(e)),
            }
        }
    }
    umount_by_path(&cli.data_dir, mountpoint)
}

pub fn daemon(cli: &Cli) -> Result<()> {
    // Before any thread starts: SIGTERM/SIGINT must reach only the thread that waits for them,
    // and malloc's arenas are set before threads create more.
    block_shutdown_signals();
    tenantfs::cache::malloc::tune_for_serving();
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let socket = cli.socket();
    tenantfs::daemon::run(data, &config, &socket)
        .with_context(|| format!("daemon on {}", socket.display()))?;
    Ok(())
}

fn mount_foreground(
    cli: &Cli,
    tenant: &str,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<()> {
    // Before any thread starts (the store's background threads): SIGTERM/SIGINT must reach only
    // the thread that waits for them, or they kill the process and leave a dead mount.
    block_shutdown_signals();
    tenantfs::cache::malloc::tune_for_serving();
    // Check everything that can fail before opening the store, so nothing is touched.
    prepare_mountpoint(mountpoint)?;
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    let log = data.tenants_dir().join(tenant).join("mount.log");
    let notify = std::env::var_os(READY_ENV).is_some();
    tenantfs::daemon::run_one_mount(data, &config, tenant, mountpoint, options, || {
        if notify {
            // The parent stops reading at "ready": further output goes to the tenant's log,
            // stderr first, since a request may come (and log) as soon as the parent returns.
            stderr_to(&log);
            println!("ready");
            stdout_to_null();
        } else {
            eprintln!(
                "serving tenant {tenant} at {} (Ctrl-C or `tenantfs umount` to stop)",
                mountpoint.display()
            );
        }
    })?;
    Ok(())
}

/// Sends stderr (the logs) to `log`, appended.
fn stderr_to(log: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(log) = std::fs::File::options().create(true).append(true).open(log) {
        let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
    }
}

/// Sends stdout to /dev/null (its reader, the parent, has gone).
fn stdout_to_null() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let _ = std::io::stdout().flush();
    if let Ok(null) = std::fs::File::options().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
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

fn umount_by_path(root: &Path, mountpoint: &Path) -> Result<()> {
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
