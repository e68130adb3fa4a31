//! The disk work a store does in the background for its tenant: flushes and compactions
//! (blob collection is one), reported by the shim's listener as they write files and finish,
//! and extent collection and folds, reported by the volume. Each report goes, as it is done,
//! to the sink of whoever serves the tenant: the mount or block device charges it to the
//! tenant's byte limit (`io_limits`) and counts it. With no sink (a store opened for a
//! command), nothing is charged.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Takes `bytes` of background disk work for a tenant, and when that work began.
pub type BackgroundSink = Arc<dyn Fn(u64, Instant) + Send + Sync>;

/// Where one open store reports its background work.
#[derive(Default)]
pub struct BackgroundWork {
    sink: OnceLock<BackgroundSink>,
}

impl std::fmt::Debug for BackgroundWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundWork")
            .field("sink", &self.sink.get().is_some())
            .finish()
    }
}

impl BackgroundWork {
    /// From now on, reports go to `sink` (once per open store; later calls are ignored).
    pub fn set_sink(&self, sink: BackgroundSink) {
        let _ = self.sink.set(sink);
    }

    /// `bytes` moved to or from the disk by work that began at `started`.
    pub fn report(&self, bytes: u64, started: Instant) {
        if bytes > 0 {
            if let Some(sink) = self.sink.get() {
                sink(bytes, started);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn reports_reach_the_first_sink_only_once_set() {
        let work = BackgroundWork::default();
        work.report(10, Instant::now());
        let (first, second) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        for to in [&first, &second] {
            let to = Arc::clone(to);
            work.set_sink(Arc::new(move |b, _| {
                to.fetch_add(b, Ordering::Relaxed);
            }));
        }
        work.report(4096, Instant::now());
        work.report(0, Instant::now());
        assert_eq!(first.load(Ordering::Relaxed), 4096);
        assert_eq!(second.load(Ordering::Relaxed), 0);
    }
}
