//! The mount's INIT handshake, the one request fuser answers: fuser answers INIT inside
//! `fuser::Session::from_fd` through this [`Filesystem`], and its session ends there; every later
//! request is read by tenantfs's own transports ([`super::device`], [`super::ring`]), so no
//! other method of it is ever called. At INIT it also offers the kernel FUSE over io_uring
//! and, if the kernel takes it, starts the [`Ring`] that serves requests from then on.

use std::sync::Arc;

use fuser::{Filesystem, InitFlags, KernelConfig, Request};

use super::dormancy::ServedVolume;
use super::mount::MountOptions;
use super::ops::{CacheMode, Operations, MAX_WRITE};
use super::ring::Ring;
use crate::metrics::MountMetrics;

/// What fuser needs of a mount for INIT: the operations and the ring.
pub struct Handshake {
    ops: Arc<Operations>,
    ring: Arc<Ring>,
}

impl Handshake {
    /// The filesystem of `volume` as `options` say (page cache, transport, limits), counting
    /// operations into `metrics` (shared with whoever reports them).
    pub fn new(
        volume: Arc<ServedVolume>,
        options: &MountOptions,
        metrics: Arc<MountMetrics>,
    ) -> Self {
        let (cache, transport) = (options.cache, options.transport);
        Self {
            ops: Arc::new(Operations::new(volume, cache, metrics).with_limits(options.limits)),
            ring: Arc::new(Ring::new(transport)),
        }
    }

    /// The ring of this filesystem: the mount hands it the session's device after mounting.
    pub fn ring(&self) -> Arc<Ring> {
        self.ring.clone()
    }

    /// The operations, for the /dev/fuse workers.
    pub fn ops(&self) -> Arc<Operations> {
        self.ops.clone()
    }
}

impl Filesystem for Handshake {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        // FUSE_HANDLE_KILLPRIV_V2: the volume clears setuid/setgid on write, truncate and
        // chown itself, so the kernel does not fetch the attributes before each chown; the
        // kernel flags each request whose caller lacks CAP_FSETID (see `dispatch`, and
        // `volume::privileges` for the rules). Not FUSE_HANDLE_KILLPRIV: with it the kernel
        // says nothing of the caller, and a filesystem cannot follow the rules.
        // FUSE_DO_READDIRPLUS with _AUTO: a directory listing that is followed by lookups
        // (tar c, cp -a, rm -rf, find) comes with every entry's attributes, so the kernel
        // fills its dentries from it instead of sending one LOOKUP per name.
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO;
        let mut supported = config.capabilities() & wanted;
        // FUSE over io_uring is a promise: once negotiated, the kernel holds every request
        // until each CPU's queue is registered. So the queues are set up (rings, buffers,
        // threads) before it is offered; they register as soon as this reply is in.
        if self.ring.wanted() {
            if !config
                .capabilities()
                .contains(InitFlags::FUSE_OVER_IO_URING)
            {
                tracing::warn!(
                    "the kernel does not offer FUSE over io_uring; serving over /dev/fuse"
                );
            } else {
                match self.ring.start(self.ops.clone()) {
                    Ok(queues) => {
                        tracing::info!(queues, "serving FUSE requests over io_uring");
                        supported |= InitFlags::FUSE_OVER_IO_URING;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "cannot set up the FUSE io_uring queues; serving over /dev/fuse"
                    ),
                }
            }
        }
        if let Err(missing) = config.add_capabilities(supported) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        if self.ops.cache() == CacheMode::Direct
            && !supported.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        {
            tracing::warn!(
                "kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: shared mmap of tenant files will fail"
            );
        }
        Ok(())
    }

    // No `destroy`: fuser's session ends right after INIT; the mount's end is the session's
    // (`Session::start`).
}
