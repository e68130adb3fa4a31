//! Configured mounts and volumes that are not mounted or attached yet, and when to try each
//! again.
//!
//! A `[[mount]]` or `[[volume]]` entry that fails when the daemon starts (the disk is full, the
//! mountpoint is not there yet, another process still holds the tenant, no ublk driver yet) is
//! not skipped: it waits here, is retried with a growing interval (1 s doubling to 30 s), and
//! is reported in the log (when its error changes), in `tenantfs stats` and in systemd's
//! STATUS= line until it is served.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::control::replies::{WaitingMountReport, WaitingVolumeReport};

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LONGEST_RETRY: Duration = Duration::from_secs(30);

/// One configured mount waiting to be mounted (or volume waiting to be attached: `tenant`
/// is its name, `options` how it is to be served).
#[derive(Clone, Debug)]
pub struct WaitingMount {
    pub tenant: String,
    pub options: String,
    pub error: String,
    pub attempts: u32,
    since_unix: u64,
    next: Instant,
}

fn retry_after(attempts: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(LONGEST_RETRY)
}

impl WaitingMount {
    /// A mount whose first attempt failed with `error`.
    pub fn new(tenant: &str, options: &str, error: String) -> Self {
        Self {
            tenant: tenant.to_owned(),
            options: options.to_owned(),
            error,
            attempts: 1,
            since_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            next: Instant::now() + retry_after(1),
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Another attempt failed; true if the error is not the one reported before.
    pub fn failed_again(&mut self, error: String) -> bool {
        self.attempts += 1;
        self.next = Instant::now() + retry_after(self.attempts);
        let changed = error != self.error;
        self.error = error;
        changed
    }

    /// What `tenantfs stats` shows of a waiting volume.
    pub fn volume_report(&self) -> WaitingVolumeReport {
        WaitingVolumeReport {
            volume: self.tenant.clone(),
            via: self.options.clone(),
            error: self.error.clone(),
            attempts: self.attempts,
            next_attempt_in_ms: self.next_in_ms(),
        }
    }

    fn next_in_ms(&self) -> u64 {
        self.next
            .saturating_duration_since(Instant::now())
            .as_millis() as u64
    }

    /// What `tenantfs stats` shows of it.
    pub fn report(&self, mountpoint: &std::path::Path) -> WaitingMountReport {
        WaitingMountReport {
            tenant: self.tenant.clone(),
            mountpoint: mountpoint.to_owned(),
            error: self.error.clone(),
            attempts: self.attempts,
            since_unix: self.since_unix,
            next_attempt_in_ms: self.next_in_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_a_ceiling() {
        let secs: Vec<u64> = (1..=8).map(|a| retry_after(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(retry_after(u32::MAX), LONGEST_RETRY);
    }

    #[test]
    fn an_unchanged_error_is_not_news() {
        let mut w = WaitingMount::new("a", "", "disk full".into());
        assert!(!w.due(Instant::now()));
        assert!(!w.failed_again("disk full".into()));
        assert!(w.failed_again("no mountpoint".into()));
        assert_eq!(w.attempts, 3);
        let r = serde_json::to_value(w.report(std::path::Path::new("/m"))).unwrap();
        assert_eq!(r["error"], "no mountpoint");
        assert!(r["next_attempt_in_ms"].as_u64().unwrap() <= 4000);
    }
}
