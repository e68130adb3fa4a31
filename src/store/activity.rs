//! What a store has written since it opened: a put to make before its first write, and when
//! it last wrote, so an idle store's memtables can be flushed.
//!
//! The first-write put lets the volume mark its stored counts as open without writing at open
//! (`volume::usage`): a store that is mounted and never written keeps an empty memtable, which
//! costs the host cache nothing. The put is logged and lands before the first write of any
//! kind, so no write can be durable without it.
//!
//! Idle flushes: every store's memtables are charged to the host cache through the shared
//! WriteBufferManager, at least one arena block each once written, whatever they hold: 1,000
//! tenants written once took 1,061 MB of a 256 MiB budget. A store that has not written for a
//! while has its memtables flushed, and the charge goes with them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Family;

/// A store's writes since it opened.
pub(super) struct WriteActivity {
    opened: Instant,
    /// Milliseconds from `opened` to the end of the last write.
    last_write_ms: AtomicU64,
    /// Written since the last idle flush.
    dirty: AtomicBool,
    /// A put is waiting for the first write.
    first_pending: AtomicBool,
    first: Mutex<Option<FirstPut>>,
    /// The first-write put was made.
    first_done: AtomicBool,
}

pub(super) struct FirstPut {
    pub family: Family,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl WriteActivity {
    pub(super) fn new() -> Self {
        WriteActivity {
            opened: Instant::now(),
            last_write_ms: AtomicU64::new(0),
            dirty: AtomicBool::new(false),
            first_pending: AtomicBool::new(false),
            first: Mutex::new(None),
            first_done: AtomicBool::new(false),
        }
    }

    /// `put` is made before the next write (replacing one not made yet).
    pub(super) fn put_before_first_write(&self, put: FirstPut) {
        *self.first.lock().unwrap_or_else(|p| p.into_inner()) = Some(put);
        self.first_pending.store(true, Ordering::Release);
    }

    /// Before a write: makes the first-write put, if one waits, with `put` (a logged write);
    /// writers that come meanwhile wait for it.
    pub(super) fn before_write<E>(
        &self,
        put: impl FnOnce(&FirstPut) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.first_pending.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = first.as_ref() {
            put(p)?;
            *first = None;
            self.first_done.store(true, Ordering::Release);
            self.first_pending.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Whether the first-write put was made (the store was written since it opened).
    pub(super) fn written_since_open(&self) -> bool {
        self.first_done.load(Ordering::Acquire)
    }

    /// After a write.
    pub(super) fn wrote(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.last_write_ms.fetch_max(ms, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Release);
    }

    /// Whether the store wrote something and then nothing for `idle`; if so, it counts as
    /// clean from now on (the caller flushes, and calls [`Self::flush_failed`] if that fails).
    pub(super) fn take_idle(&self, idle: Duration) -> bool {
        if !self.dirty.load(Ordering::Acquire) {
            return false;
        }
        let now = self.opened.elapsed().as_millis() as u64;
        let last = self.last_write_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < idle.as_millis() as u64 {
            return false;
        }
        self.dirty.swap(false, Ordering::AcqRel)
    }

    pub(super) fn flush_failed(&self) {
        self.dirty.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_put_is_made_once_before_the_first_write() {
        let a = WriteActivity::new();
        let mut made = Vec::new();
        a.before_write(|_| -> Result<(), ()> { panic!("no put waits") })
            .unwrap();
        a.put_before_first_write(FirstPut {
            family: Family::Meta,
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        });
        assert!(!a.written_since_open());
        // A failed put stays waiting.
        assert!(a.before_write(|_| Err("disk full")).is_err());
        assert!(!a.written_since_open());
        a.before_write(|p| -> Result<(), ()> {
            made.push(p.key.clone());
            Ok(())
        })
        .unwrap();
        a.before_write(|p| -> Result<(), ()> {
            made.push(p.key.clone());
            Ok(())
        })
        .unwrap();
        assert_eq!(made, [b"k".to_vec()]);
        assert!(a.written_since_open());
    }

    #[test]
    fn only_a_store_written_and_then_quiet_is_idle() {
        let a = WriteActivity::new();
        assert!(!a.take_idle(Duration::ZERO), "never written");
        a.wrote();
        assert!(!a.take_idle(Duration::from_secs(3600)), "written just now");
        assert!(a.take_idle(Duration::ZERO));
        assert!(!a.take_idle(Duration::ZERO), "flushed already");
        a.flush_failed();
        assert!(a.take_idle(Duration::ZERO), "the flush failed: still to do");
    }
}
