//! tenantfs: a multi-tenant storage plane for Linux hosts.
//!
//! Each tenant's files live in its own RocksDB instance, encrypted at rest ([`store`]), under
//! keys derived from one host master key ([`crypto`], [`data_dir`]). The tenant registry
//! ([`tenants`]) creates, lists, opens and deletes tenants. See ARCHITECTURE.md for the data
//! flow and docs/format.md for the on-disk format.

// Every operation the compiler cannot check sits in a block of its own with a `// SAFETY:`
// comment that says why it holds, also inside functions that are themselves unchecked.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod base;
pub mod blockdev;
pub mod cache;
pub mod config;
pub mod control;
pub mod crypto;
pub mod daemon;
pub mod data_dir;
pub mod fair_share;
pub mod forks;
mod fs_util;
pub mod fuse;
pub mod host;
pub mod io_limits;
pub mod logging;
pub mod master_rotation;
pub mod metrics;
pub mod nbd;
pub mod pressure;
pub mod process;
pub mod quota;
pub mod serving;
pub mod snapshots;
pub mod space;
pub mod store;
pub mod tenant_lock;
pub mod tenants;
mod threads;
pub mod ublk;
pub mod units;
pub mod volume;
