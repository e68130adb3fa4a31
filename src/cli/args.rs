//! The command line's grammar: every command, argument and option, with its help text.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tenantfs::units::ByteSize;

#[derive(Parser)]
#[command(
    name = "tenantfs",
    version,
    about = "Per-tenant encrypted filesystems for Linux hosts"
)]
pub struct Cli {
    /// Host data dir (tenants, keys, stores).
    #[arg(
        long,
        global = true,
        env = "TENANTFS_DATA_DIR",
        default_value = tenantfs::data_dir::DEFAULT_ROOT
    )]
    pub data_dir: PathBuf,
    /// Master key file: 32 raw bytes or 64 hex characters, mode 0600.
    #[arg(long, global = true)]
    pub master_key: Option<PathBuf>,
    /// Config file (default /etc/tenantfs/tenantfs.toml if present).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// The daemon's control socket (default <data-dir>/tenantfs.sock).
    #[arg(long, global = true, env = "TENANTFS_SOCKET")]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Snapshots of a tenant or block volume: take, list, delete (`tenant restore` goes back
    /// to one).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// The data dir's master key.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Block volumes: create, list, resize, delete; attach as /dev/ublkbN or over NBD through
    /// the daemon.
    #[command(subcommand)]
    Volume(VolumeCommand),
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create block volume NAME: an encrypted tenant store holding one device of SIZE bytes.
    Create {
        name: String,
        /// Device size in whole 512-byte sectors (e.g. 20G). With --base, at least the
        /// image's size (default: the image's size).
        #[arg(long)]
        size: Option<ByteSize>,
        /// Start from raw image base BASE (`base import`): its blocks shared, copy on write.
        #[arg(long)]
        base: Option<String>,
    },
    /// List block volumes with their size and where they are attached.
    List {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Set volume NAME's size to SIZE (detached; shrinking needs --shrink).
    Resize {
        name: String,
        size: ByteSize,
        /// Allow a smaller size: the data past it is dropped.
        #[arg(long)]
        shrink: bool,
    },
    /// Delete volume NAME and its data (detached).
    Delete { name: String },
    /// Serve volume NAME through the daemon: as /dev/ublkbN (--ublk), as /dev/nbdN
    /// (--nbd-device), or over NBD at ADDR (unix:PATH or a loopback HOST:PORT; port 0 picks a
    /// free one).
    Attach {
        name: String,
        #[arg(long, value_name = "ADDR")]
        nbd: Option<String>,
        /// As block device /dev/ublkbN (the kernel's ublk driver); it survives a daemon
        /// restart (its I/O is held meanwhile) until `volume detach`.
        #[arg(long, conflicts_with = "nbd")]
        ublk: bool,
        /// As block device /dev/nbdN (the kernel's NBD client, for kernels without ublk); it
        /// survives a daemon restart (its I/O is held meanwhile) until `volume detach`.
        #[arg(long, conflicts_with_all = ["nbd", "ublk"])]
        nbd_device: bool,
    },
    /// Stop serving volume NAME (NBD clients are disconnected, a device is deleted, refused
    /// while mounted; the store is synced and closed).
    Detach { name: String },
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Move the data dir to a new master key: every key sealed under the old one (tenants',
    /// base templates', the host's base keys) is sealed under the new one, which replaces
    /// master.key where the data dir keeps its key. Through the daemon when one runs. A
    /// crash leaves the data dir under the old key or the new one; run it again to finish.
    RotateMaster {
        /// The new key's file (32 raw bytes or 64 hex characters, mode 0600); made, with a
        /// random key, when there is none.
        #[arg(long)]
        new_key: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Take snapshot NAME of TENANT (a tenant or block volume): its files as they are now,
    /// sharing its store's files. A mounted or attached one is snapshotted while it runs,
    /// through the process that serves it: what was written before is in the snapshot.
    Create { tenant: String, name: String },
    /// List the snapshots of TENANT, or of every tenant.
    List {
        tenant: Option<String>,
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshot NAME of TENANT (the disk only it holds comes back).
    Delete { tenant: String, name: String },
}

#[derive(Subcommand)]
pub enum BaseCommand {
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
pub enum CacheCommand {
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
pub enum TenantCommand {
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
        /// Bytes its files may take, as `du` inside the mount counts them (e.g. 10G).
        #[arg(long, value_parser = parse_quota_bytes, allow_hyphen_values = true)]
        quota_bytes: Option<Limit>,
        /// Files, directories, links and nodes it may hold (the root directory counts).
        #[arg(long, value_parser = parse_quota_inodes, allow_hyphen_values = true)]
        quota_inodes: Option<Limit>,
    },
    /// Count what a tenant's files take again and correct its stored usage (the tenant must
    /// not be mounted; a tenant that was not unmounted cleanly is counted at its next mount).
    Check { name: String },
    /// List tenants.
    List {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tenant and all its data, its snapshots included.
    Delete {
        name: String,
        /// Destroy its keys first (its record, zeroed and synced), so that its bytes left on
        /// the disk open under no key; forks keep the keys of the files they share with it.
        #[arg(long)]
        shred: bool,
    },
    /// Make tenant NEW a fork of tenant (or block volume) SOURCE: its files as they are now,
    /// or as its snapshot --snapshot NAME holds them, sharing them (no data copied). SOURCE may
    /// be mounted or attached. Each then sees only its own changes, under keys of its own.
    Fork {
        source: String,
        new: String,
        #[arg(long)]
        snapshot: Option<String>,
    },
    /// Seal the files tenant NAME writes from now on under a new key (the files it holds keep
    /// theirs, which stay in its keyring). NAME may be mounted or attached.
    RotateKey {
        name: String,
        /// Then write every file it holds under an older key again, under the new one, and
        /// report when none is left (its snapshots and forks keep their copies).
        #[arg(long)]
        rewrite: bool,
    },
    /// Put tenant NAME (or block volume) back to one of its snapshots: its files become the
    /// snapshot's (which stays). Refused while it is mounted or attached.
    Restore {
        name: String,
        #[arg(long)]
        snapshot: String,
    },
    /// Change a tenant's settings: its quota (`--quota-bytes 10G`, `--quota-inodes N`, kept
    /// in its record, at once if it is mounted) and a mounted tenant's I/O limits on every
    /// mount of it (`--iops` requests a second, `--bandwidth 100M` bytes a second, `--weight`
    /// its share among busy tenants); `unlimited` removes a limit.
    Set {
        name: String,
        #[arg(long, value_parser = parse_iops, allow_hyphen_values = true)]
        iops: Option<Limit>,
        #[arg(long, value_parser = parse_bandwidth, allow_hyphen_values = true)]
        bandwidth: Option<Limit>,
        #[arg(long, value_parser = parse_quota_bytes, allow_hyphen_values = true)]
        quota_bytes: Option<Limit>,
        #[arg(long, value_parser = parse_quota_inodes, allow_hyphen_values = true)]
        quota_inodes: Option<Limit>,
        /// Its weight among busy tenants of the daemon (1 to 10000; `default`: 100).
        #[arg(long, value_parser = parse_weight, allow_hyphen_values = true)]
        weight: Option<Limit>,
    },
}

/// A limit given on the command line: a positive number, or none at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    At(u64),
}

impl Limit {
    /// Its value in a `set_limits` request (0: none).
    pub fn wire(self) -> u64 {
        match self {
            Limit::Unlimited => 0,
            Limit::At(n) => n,
        }
    }
}

fn parse_iops(s: &str) -> Result<Limit, String> {
    match s {
        "unlimited" => Ok(Limit::Unlimited),
        _ => match s.parse::<u32>() {
            Ok(n) if n > 0 => Ok(Limit::At(n.into())),
            _ => Err(format!(
                "{s:?} is not an IOPS limit: give a positive number of requests a second \
                 (at most {}), or unlimited",
                u32::MAX
            )),
        },
    }
}

fn parse_bandwidth(s: &str) -> Result<Limit, String> {
    match s {
        "unlimited" => Ok(Limit::Unlimited),
        _ => match s.parse::<ByteSize>() {
            Ok(b) if b.0 > 0 => Ok(Limit::At(b.0)),
            _ => Err(format!(
                "{s:?} is not a bandwidth limit: give a positive size a second (100M, 1G), or \
                 unlimited"
            )),
        },
    }
}

fn parse_weight(s: &str) -> Result<Limit, String> {
    let max = tenantfs::fair_share::MAX_WEIGHT;
    match s {
        "default" => Ok(Limit::Unlimited),
        _ => match s.parse::<u32>() {
            Ok(n) if (1..=max).contains(&n) => Ok(Limit::At(n.into())),
            _ => Err(format!(
                "{s:?} is not a weight: give a whole number from 1 to {max}, or default ({})",
                tenantfs::fair_share::DEFAULT_WEIGHT
            )),
        },
    }
}

fn parse_quota_bytes(s: &str) -> Result<Limit, String> {
    match s {
        "unlimited" => Ok(Limit::Unlimited),
        _ => match s.parse::<ByteSize>() {
            Ok(b) if b.0 > 0 => Ok(Limit::At(b.0)),
            _ => Err(format!(
                "{s:?} is not a byte quota: give a positive size (500M, 10G), or unlimited"
            )),
        },
    }
}

fn parse_quota_inodes(s: &str) -> Result<Limit, String> {
    match s {
        "unlimited" => Ok(Limit::Unlimited),
        _ => match s.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Limit::At(n)),
            _ => Err(format!(
                "{s:?} is not an inode quota: give a positive number of inodes (the root \
                 directory is one), or unlimited"
            )),
        },
    }
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Parse and validate the config file; report errors with their line.
    Check,
}
