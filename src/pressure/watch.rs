//! Live pressure events for the governor's poll loop, so it reacts within the event's window
//! instead of at the next tick: PSI triggers (/proc/pressure/memory and a v2 cgroup's
//! memory.pressure signal POLLPRI once stall time in a window passes a threshold) and v1
//! memory.pressure_level notifications (an eventfd registered through cgroup.event_control).
//!
//! A new trigger can fire at once for stall that happened before it existed: the kernel
//! starts its first window from a total it only updates while some trigger exists (seen here:
//! an event 0.19 s after registration, with no stall since, after a thrashing cgroup had
//! stalled earlier). Within its first window an event therefore counts only if the file's
//! `some total` grew by the trigger's stall since registration.
//!
//! Every watcher is optional: a kernel without PSI, a caller without CAP_SYS_RESOURCE (whose
//! trigger windows must be multiples of 2 s; we retry with one) or a missing file logs one
//! warning and the governor carries on with what it samples each tick.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::signals::CgroupMemory;

/// Event-style signals that fired since the last tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Triggers {
    /// The /proc/pressure/memory trigger.
    pub host_psi: bool,
    /// The v2 cgroup's memory.pressure trigger.
    pub cgroup_psi: bool,
    /// A v1 memory.pressure_level `medium` event.
    pub v1_pressure_level: bool,
}

impl Triggers {
    pub fn any(&self) -> bool {
        self.host_psi || self.cgroup_psi || self.v1_pressure_level
    }

    pub(crate) fn merge(self, o: Triggers) -> Triggers {
        Triggers {
            host_psi: self.host_psi || o.host_psi,
            cgroup_psi: self.cgroup_psi || o.cgroup_psi,
            v1_pressure_level: self.v1_pressure_level || o.v1_pressure_level,
        }
    }
}

pub(crate) struct WatchConfig {
    pub psi_triggers: bool,
    pub psi_stall: Duration,
    pub psi_window: Duration,
    pub v1_pressure_level: bool,
}

/// What one wait saw.
#[derive(Default)]
pub(crate) struct Woke {
    pub triggers: Triggers,
    /// The wake eventfd was written (stop, or a new ceiling).
    pub woken: bool,
}

/// A v1 memory.pressure_level registration.
struct V1Level {
    event: EventFd,
    _level: File,
}

/// A registered PSI trigger and what it needs to tell a real first-window event from stale
/// stall.
struct PsiTrigger {
    file: File,
    path: PathBuf,
    stall: Duration,
    window: Duration,
    armed: Instant,
    /// `some total` (microseconds) at registration.
    total_at_arm: Option<u64>,
}

fn some_total_us(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(super::signals::parse_psi(&text)?.some.total_us)
}

impl PsiTrigger {
    /// Whether an event from this trigger stands for stall since it was registered.
    fn event_is_real(&self) -> bool {
        if self.armed.elapsed() >= self.window {
            return true;
        }
        let (Some(then), Some(now)) = (self.total_at_arm, some_total_us(&self.path)) else {
            return true;
        };
        let grew = Duration::from_micros(now.saturating_sub(then));
        if grew < self.stall {
            tracing::debug!(
                path = %self.path.display(),
                grew_ms = grew.as_millis() as u64,
                stall_ms = self.stall.as_millis() as u64,
                "PSI trigger fired in its first window for stall from before it existed; ignored"
            );
            return false;
        }
        true
    }
}

pub(crate) struct Watch {
    host_psi: Option<PsiTrigger>,
    cgroup_psi: Option<PsiTrigger>,
    v1_level: Option<V1Level>,
}

#[derive(Clone, Copy)]
enum Source {
    Wake,
    HostPsi,
    CgroupPsi,
    V1Level,
}

/// Window lengths unprivileged PSI triggers must be a multiple of.
const UNPRIVILEGED_WINDOW: Duration = Duration::from_secs(2);

fn write_trigger(path: &Path, stall: Duration, window: Duration) -> std::io::Result<File> {
    let mut f = OpenOptions::new().read(true).write(true).open(path)?;
    // The kernel overwrites the last byte written with a NUL: end the line with one.
    let line = format!("some {} {}\0", stall.as_micros(), window.as_micros());
    f.write_all(line.as_bytes())?;
    Ok(f)
}

/// Opens a PSI file with a `some` trigger; on EINVAL retries with the window rounded up to
/// what an unprivileged caller may use, the stall scaled with it.
fn register_psi(path: &Path, stall: Duration, window: Duration) -> std::io::Result<PsiTrigger> {
    let total_at_arm = some_total_us(path);
    let armed = |file: File, stall: Duration, window: Duration| PsiTrigger {
        file,
        path: path.to_owned(),
        stall,
        window,
        armed: Instant::now(),
        total_at_arm,
    };
    match write_trigger(path, stall, window) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let n = window
                .as_micros()
                .div_ceil(UNPRIVILEGED_WINDOW.as_micros())
                .max(1);
            let wider = UNPRIVILEGED_WINDOW * n as u32;
            let scaled = stall.mul_f64(wider.as_secs_f64() / window.as_secs_f64().max(1e-6));
            let stall = scaled.min(wider);
            let f = write_trigger(path, stall, wider).map_err(|_| e)?;
            tracing::info!(
                path = %path.display(),
                stall_ms = stall.as_millis() as u64,
                window_ms = wider.as_millis() as u64,
                "PSI trigger registered with an unprivileged window"
            );
            Ok(armed(f, stall, wider))
        }
        r => r.map(|f| armed(f, stall, window)),
    }
}

fn register_v1_level(dir: &Path) -> std::io::Result<V1Level> {
    let event = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    let level = File::open(dir.join("memory.pressure_level"))?;
    let mut control = OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))?;
    let line = format!("{} {} medium", event.as_raw_fd(), level.as_raw_fd());
    control.write_all(line.as_bytes())?;
    Ok(V1Level {
        event,
        _level: level,
    })
}

impl Watch {
    /// Registers what `config` enables and the system allows; failures are logged once.
    pub(crate) fn new(cgroup: Option<&CgroupMemory>, config: &WatchConfig) -> Watch {
        let psi = |path: &Path| -> Option<PsiTrigger> {
            if !config.psi_triggers {
                return None;
            }
            match register_psi(path, config.psi_stall, config.psi_window) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "no PSI trigger; sampling PSI each tick instead");
                    None
                }
            }
        };
        let host_psi = psi(Path::new("/proc/pressure/memory"));
        let cgroup_psi = match cgroup {
            Some(CgroupMemory::V2(dir)) => psi(&dir.join("memory.pressure")),
            _ => None,
        };
        let v1_level = match cgroup {
            Some(CgroupMemory::V1(dir)) if config.v1_pressure_level => {
                match register_v1_level(dir) {
                    Ok(l) => Some(l),
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "no v1 memory.pressure_level events");
                        None
                    }
                }
            }
            _ => None,
        };
        Watch {
            host_psi,
            cgroup_psi,
            v1_level,
        }
    }

    /// Waits up to `timeout` for any event or for `wake`.
    pub(crate) fn wait(&mut self, wake: &EventFd, timeout: Duration) -> Woke {
        let mut sources = vec![Source::Wake];
        let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        if let Some(t) = &self.host_psi {
            sources.push(Source::HostPsi);
            fds.push(PollFd::new(t.file.as_fd(), PollFlags::POLLPRI));
        }
        if let Some(t) = &self.cgroup_psi {
            sources.push(Source::CgroupPsi);
            fds.push(PollFd::new(t.file.as_fd(), PollFlags::POLLPRI));
        }
        if let Some(l) = &self.v1_level {
            sources.push(Source::V1Level);
            fds.push(PollFd::new(l.event.as_fd(), PollFlags::POLLIN));
        }
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut woke = Woke::default();
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => return woke,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "poll failed in the cache governor");
                std::thread::sleep(Duration::from_millis(100));
                return woke;
            }
        }
        let revents: Vec<PollFlags> = fds
            .iter()
            .map(|p| p.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);
        let broken = PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL;
        for (source, ev) in sources.into_iter().zip(revents) {
            if ev.is_empty() {
                continue;
            }
            match source {
                Source::Wake => {
                    let _ = wake.read();
                    woke.woken = true;
                }
                Source::HostPsi | Source::CgroupPsi => {
                    let slot = match source {
                        Source::HostPsi => &mut self.host_psi,
                        _ => &mut self.cgroup_psi,
                    };
                    if ev.intersects(broken) {
                        // The trigger is gone (cgroup removed): POLLERR would spin the loop.
                        tracing::warn!("PSI trigger file reports an error; dropping it");
                        *slot = None;
                    } else if ev.contains(PollFlags::POLLPRI)
                        && slot.as_ref().is_some_and(PsiTrigger::event_is_real)
                    {
                        match source {
                            Source::HostPsi => woke.triggers.host_psi = true,
                            _ => woke.triggers.cgroup_psi = true,
                        }
                    }
                }
                Source::V1Level => {
                    let ok = self
                        .v1_level
                        .as_ref()
                        .is_some_and(|l| !ev.intersects(broken) && l.event.read().is_ok());
                    if ok {
                        woke.triggers.v1_pressure_level = true;
                    } else {
                        tracing::warn!("v1 pressure_level eventfd failed; dropping it");
                        self.v1_level = None;
                    }
                }
            }
        }
        woke
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn psi_text(some_total_us: u64) -> String {
        format!(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total={some_total_us}\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        )
    }

    /// A trigger over a fixture PSI file armed `ago` with `some total` 1,000,000 us.
    fn fixture_trigger(dir: &Path, ago: Duration) -> PsiTrigger {
        let path = dir.join("memory.pressure");
        std::fs::write(&path, psi_text(1_000_000)).unwrap();
        PsiTrigger {
            file: File::open(&path).unwrap(),
            total_at_arm: some_total_us(&path),
            path,
            stall: Duration::from_millis(100),
            window: Duration::from_secs(2),
            armed: Instant::now() - ago,
        }
    }

    #[test]
    fn first_window_events_need_stall_since_registration() {
        let dir = tempfile::tempdir().unwrap();
        let t = fixture_trigger(dir.path(), Duration::ZERO);
        assert_eq!(t.total_at_arm, Some(1_000_000));
        // The kernel fired, but the stall grew 10 ms since registration: stale.
        std::fs::write(&t.path, psi_text(1_010_000)).unwrap();
        assert!(!t.event_is_real());
        // 120 ms of new stall: real.
        std::fs::write(&t.path, psi_text(1_120_000)).unwrap();
        assert!(t.event_is_real());
    }

    #[test]
    fn events_after_the_first_window_are_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let t = fixture_trigger(dir.path(), Duration::from_secs(3));
        std::fs::write(&t.path, psi_text(1_000_000)).unwrap();
        assert!(
            t.event_is_real(),
            "the kernel's own window has rolled by now"
        );
        // Unreadable totals never hide an event.
        let t = fixture_trigger(dir.path(), Duration::ZERO);
        std::fs::remove_file(&t.path).unwrap();
        assert!(t.event_is_real());
    }

    fn config() -> WatchConfig {
        WatchConfig {
            psi_triggers: true,
            psi_stall: Duration::from_millis(150),
            psi_window: Duration::from_secs(1),
            v1_pressure_level: true,
        }
    }

    #[test]
    fn registers_what_this_machine_offers() {
        let cgroup = CgroupMemory::of_self().unwrap();
        let w = Watch::new(cgroup.as_ref(), &config());
        if let Some(CgroupMemory::V1(_)) = cgroup {
            assert!(w.v1_level.is_some(), "v1 pressure_level registration");
        }
        if Path::new("/proc/pressure/memory").exists() && nix::unistd::geteuid().is_root() {
            assert!(w.host_psi.is_some(), "host PSI trigger (root)");
        }
        // Disabled watchers are not registered.
        let off = WatchConfig {
            psi_triggers: false,
            v1_pressure_level: false,
            ..config()
        };
        let w = Watch::new(cgroup.as_ref(), &off);
        assert!(w.host_psi.is_none() && w.cgroup_psi.is_none() && w.v1_level.is_none());
    }

    #[test]
    fn missing_files_are_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        for cg in [CgroupMemory::V1(gone.clone()), CgroupMemory::V2(gone)] {
            let w = Watch::new(Some(&cg), &config());
            assert!(w.cgroup_psi.is_none() && w.v1_level.is_none());
        }
    }

    #[test]
    fn wake_ends_the_wait() {
        let mut w = Watch::new(None, &config());
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        let t = Instant::now();
        let woke = w.wait(&wake, Duration::from_millis(50));
        assert!(!woke.woken && t.elapsed() >= Duration::from_millis(40));
        wake.write(1).unwrap();
        let t = Instant::now();
        let woke = w.wait(&wake, Duration::from_secs(10));
        assert!(woke.woken && t.elapsed() < Duration::from_secs(1));
        // The wake was drained: the next wait times out again.
        assert!(!w.wait(&wake, Duration::from_millis(10)).woken);
    }
}
