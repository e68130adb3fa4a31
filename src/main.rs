//! The `tenantfs` command line: parses arguments and hands each command to its module in
//! `cli/` (by subject); the work itself is the library's.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod cli;

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use cli::{
    BaseCommand, CacheCommand, Cli, Command, ConfigCommand, KeyCommand, SnapshotCommand,
    TenantCommand, VolumeCommand,
};

fn main() -> ExitCode {
    tenantfs::logging::init("warn");
    // The tests set the library's failpoints through FAILPOINTS (the fail crate's syntax).
    // Only a build with the `failpoints` feature (`make test`'s) has them: the binary that
    // ships does not even link the fail crate's registry.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    match run(Cli::parse()) {
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
    match &cli.command {
        Command::Init => cli::tenant::init(&cli),
        Command::Tenant(TenantCommand::Create {
            name,
            block_size,
            base,
            quota_bytes,
            quota_inodes,
        }) => {
            let quota = tenantfs::quota::Quota {
                bytes: quota_bytes.and_then(|l| std::num::NonZeroU64::new(l.wire())),
                inodes: quota_inodes.and_then(|l| std::num::NonZeroU64::new(l.wire())),
            };
            cli::tenant::create(&cli, name, *block_size, base.as_deref(), quota)
        }
        Command::Tenant(TenantCommand::Check { name }) => cli::tenant::check(&cli, name),
        Command::Tenant(TenantCommand::List { json }) => cli::tenant::list(&cli, *json),
        Command::Tenant(TenantCommand::Delete { name, shred }) => {
            cli::tenant::delete(&cli, name, *shred)
        }
        Command::Tenant(TenantCommand::Restore { name, snapshot }) => {
            cli::snapshot::restore(&cli, name, snapshot)
        }
        Command::Tenant(TenantCommand::Fork {
            source,
            new,
            snapshot,
        }) => cli::snapshot::fork(&cli, source, new, snapshot.as_deref()),
        Command::Tenant(TenantCommand::RotateKey { name, rewrite }) => {
            cli::snapshot::rotate_key(&cli, name, *rewrite)
        }
        Command::Key(KeyCommand::RotateMaster { new_key }) => {
            cli::key::rotate_master(&cli, new_key)
        }
        Command::Snapshot(SnapshotCommand::Create { tenant, name }) => {
            cli::snapshot::create(&cli, tenant, name)
        }
        Command::Snapshot(SnapshotCommand::List { tenant, json }) => {
            cli::snapshot::list(&cli, tenant.as_deref(), *json)
        }
        Command::Snapshot(SnapshotCommand::Delete { tenant, name }) => {
            cli::snapshot::delete(&cli, tenant, name)
        }
        Command::Tenant(TenantCommand::Set {
            name,
            iops,
            bandwidth,
            quota_bytes,
            quota_inodes,
            weight,
        }) => {
            let settings = cli::tenant::Settings {
                iops: *iops,
                bandwidth: *bandwidth,
                quota_bytes: *quota_bytes,
                quota_inodes: *quota_inodes,
                weight: *weight,
            };
            cli::tenant::set(&cli, name, settings)
        }
        Command::Config(ConfigCommand::Check) => cli::tenant::config_check(&cli),
        Command::Mount {
            tenant,
            mountpoint,
            foreground,
            options,
        } => cli::mount::mount(&cli, tenant, mountpoint, *foreground, options),
        Command::Umount { mountpoint } => cli::mount::umount(&cli, mountpoint),
        Command::Daemon => cli::mount::daemon(&cli),
        Command::Stats { json } => cli::stats::stats(&cli, *json),
        Command::Cache(CacheCommand::Stats { json }) => cli::cache::stats(&cli, *json),
        Command::Cache(CacheCommand::Release { size }) => cli::cache::release(&cli, *size),
        Command::Cache(CacheCommand::Budget { size }) => cli::cache::budget(&cli, *size),
        Command::Base(BaseCommand::Import {
            name,
            source,
            block_size,
        }) => cli::base::import(&cli, name, source, *block_size),
        Command::Base(BaseCommand::List { json }) => cli::base::list(&cli, *json),
        Command::Base(BaseCommand::Verify) => cli::base::verify(&cli),
        Command::Base(BaseCommand::Delete { name }) => cli::base::delete(&cli, name),
        Command::Base(BaseCommand::Gc) => cli::base::gc(&cli),
        Command::Volume(VolumeCommand::Create { name, size, base }) => {
            cli::volume::create(&cli, name, *size, base.as_deref())
        }
        Command::Volume(VolumeCommand::List { json }) => cli::volume::list(&cli, *json),
        Command::Volume(VolumeCommand::Resize { name, size, shrink }) => {
            cli::volume::resize(&cli, name, *size, *shrink)
        }
        Command::Volume(VolumeCommand::Delete { name }) => cli::volume::delete(&cli, name),
        Command::Volume(VolumeCommand::Attach {
            name,
            nbd,
            ublk,
            nbd_device,
        }) => cli::volume::attach(&cli, name, nbd.as_deref(), *ublk, *nbd_device),
        Command::Volume(VolumeCommand::Detach { name }) => cli::volume::detach(&cli, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_shown_once() {
        let e = anyhow::anyhow!("no such tenant alpha")
            .context("cannot open tenant alpha: no such tenant alpha")
            .context("cannot mount");
        assert_eq!(
            error_text(&e),
            "cannot mount: cannot open tenant alpha: no such tenant alpha"
        );
    }
}
