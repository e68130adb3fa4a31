//! The commands, one module per subject; each function prints what it did for people (or
//! JSON with `--json`) and returns errors that say what to do.

mod args;
pub mod base;
pub mod cache;
pub mod key;
pub mod mount;
pub mod snapshot;
pub mod stats;
pub mod tenant;
pub mod volume;

pub use args::{
    BaseCommand, CacheCommand, Cli, Command, ConfigCommand, KeyCommand, Limit, SnapshotCommand,
    TenantCommand, VolumeCommand,
};

use std::path::PathBuf;

use anyhow::{Context, Result};
use tenantfs::config::Config;
use tenantfs::control::{self, Client, ControlError};
use tenantfs::data_dir::DataDir;

impl Cli {
    /// The daemon's socket, as given or the default.
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| tenantfs::daemon::default_socket(&self.data_dir))
    }

    /// The daemon, if one runs on its socket (`None`: not running). A daemon that may run but
    /// cannot be reached (permission denied, by the errno of connect) is an error that says
    /// so, never taken for one that is not running.
    fn live_daemon(&self) -> Result<Option<Client>, ControlError> {
        control::probe(&self.socket())
    }

    /// Every process serving mounts of this data dir: the daemon (if one answers) and each
    /// foreground mount's process. Errors when there is none, or one cannot be reached.
    fn serving_processes(&self) -> Result<Vec<Client>, ControlError> {
        let mut clients: Vec<Client> = self.live_daemon()?.into_iter().collect();
        match control::serving_sockets(&self.data_dir) {
            Ok(s) => clients.extend(s.into_iter().map(Client::new)),
            Err(e) if clients.is_empty() => return Err(e),
            Err(_) => {}
        }
        Ok(clients)
    }

    fn load_config(&self) -> Result<Config> {
        Ok(Config::load(self.config.as_deref())?)
    }

    fn open_data_dir(&self) -> Result<DataDir> {
        Ok(DataDir::open(&self.data_dir, self.master_key.as_deref())?)
    }
}

/// A serving process's refusal is the whole message; other errors keep their context.
fn daemon_error(e: ControlError) -> anyhow::Error {
    match e {
        ControlError::Refused { refusal, .. } => anyhow::anyhow!("{}", refusal.message),
        e => e.into(),
    }
}

/// The host's shared store resources for commands that only create or check a store.
fn command_stores(config: &Config) -> tenantfs::store::StoreHost {
    tenantfs::host::store_host(&config.store, None)
}

/// `--json` output.
fn print_json(v: &impl serde::Serialize) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(v).context("cannot write JSON")?
    );
    Ok(())
}
