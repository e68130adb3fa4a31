//! The integration tests: one binary (the static RocksDB is linked once, not once per test
//! file), one module per subject, helpers in `common`. Each test uses real parts: FUSE mounts,
//! RocksDB stores, cgroups, child processes of the `tenantfs` binary.

// As in the library: every unsafe block says why it holds.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod base_daemon_cache;
mod base_shared_cache;
mod base_store;
mod base_tenants;
mod block_volumes;
mod cache_control;
mod cache_memory;
mod cli;
mod common;
mod daemon;
mod direct_io;
mod encryption_at_rest;
mod fuse_model;
mod fuse_mount;
mod generators;
mod master_key;
mod mount_helper;
mod pressure_live;
mod shipped_binary;
mod snapshots;
mod store_ffi;
mod systemd_units;
mod vm;
mod vm_systemd;
mod volume_model;
