//! The process's log: tracing events to stderr, one line each, filtered by `TENANTFS_LOG`.
//!
//! A log line that cannot be written is dropped and counted, never fatal. The daemon's stderr
//! is often a file on the very disk that filled up (or a pipe whose reader went away), and
//! tracing-subscriber reports a failed write on stderr with a print macro, which panics;
//! inside one of RocksDB's callbacks (its info logger, the cipher) that panic crosses an
//! `extern "C"` frame and aborts the process, taking every tenant with it. [`dropped_lines`]
//! tells how many lines were lost (`tenantfs stats` shows it).

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines that could not be written since the process started.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A writer that swallows write errors (counting them) instead of reporting them.
struct Lossy<W>(W);

impl<W: Write> Write for Lossy<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0.write(buf) {
            Ok(n) => Ok(n),
            Err(_) => {
                // The rest of this line goes too: one dropped line, one count.
                DROPPED.fetch_add(1, Ordering::Relaxed);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

/// Installs the process-wide subscriber (a second call does nothing). `default` is the filter
/// when `TENANTFS_LOG` is unset or invalid.
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENANTFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Lossy(io::stderr()))
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .log_internal_errors(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write error is swallowed and counted: the whole buffer counts as written.
    #[test]
    fn failed_writes_are_dropped_and_counted() {
        let before = dropped_lines();
        // /dev/full answers every write with ENOSPC: the disk-full case itself.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut w = Lossy(full);
        assert_eq!(w.write(b"a line that cannot be written\n").unwrap(), 30);
        w.write_all(b"and another\n").unwrap();
        w.flush().unwrap();
        assert!(dropped_lines() >= before + 2);
    }
}
