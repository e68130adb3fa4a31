//! The cache governor: owns the host cache budget, shrinks it under memory pressure and grows
//! it back, with hysteresis, once pressure has stayed away. The caches are the one large
//! memory consumer of tenantfs that can give memory back at once, so they are what yields
//! when the host or the service's cgroup runs short; the operator's `cache budget SIZE` is the
//! ceiling the governor never exceeds.
//!
//! [`Governor`] runs [`Policy`] (`policy`: the pure decision function, where the rules are) on
//! a thread against live inputs (see `watch`): a poll loop that wakes every `interval` (1 s)
//! or at once when a PSI trigger or a v1 `memory.pressure_level` event fires, samples the
//! signals, applies the decision and logs it with its reason.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use super::policy::{Decision, Policy, PolicyConfig, Sample};
use super::signals::{self, CgroupMemory};
use super::watch::{Triggers, Watch, WatchConfig};
use crate::units::ByteSize;

/// What the governor steers: cache memory that can shrink at once and grow back.
pub trait CacheBudget: Send + Sync {
    /// The budget in effect now (bytes).
    fn budget(&self) -> u64;
    /// Bytes the caches hold now.
    fn used(&self) -> u64;
    /// Applies a new budget; shrinking evicts at once and gives the memory back to the kernel.
    fn set_budget(&self, bytes: u64);
    /// Called once per governor tick before it decides (e.g. to re-split the budget among
    /// several caches by what they use).
    fn tick(&self) {}
}

/// How the [`Governor`] runs.
#[derive(Clone, Debug)]
pub struct GovernorConfig {
    /// Time between ticks when nothing fires.
    pub interval: Duration,
    /// The memory cgroup to watch; `None` finds the process's own.
    pub cgroup: Option<CgroupMemory>,
    /// Register PSI triggers (host, and the v2 cgroup's memory.pressure).
    pub psi_triggers: bool,
    /// PSI trigger: this much `some` stall within `psi_window` fires it.
    pub psi_stall: Duration,
    pub psi_window: Duration,
    /// Listen for v1 memory.pressure_level `medium` events.
    pub v1_pressure_level: bool,
    pub policy: PolicyConfig,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        GovernorConfig {
            interval: Duration::from_secs(1),
            cgroup: None,
            psi_triggers: true,
            psi_stall: Duration::from_millis(150),
            psi_window: Duration::from_secs(1),
            v1_pressure_level: true,
            policy: PolicyConfig::default(),
        }
    }
}

/// Counters for the admin interface.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GovernorStats {
    pub ceiling_bytes: u64,
    /// Ticks on which pressure was seen.
    pub pressure_events: u64,
    pub shrinks: u64,
    pub grows: u64,
    /// The last shrink or grow, with its reason.
    pub last_decision: Option<String>,
}

struct Shared {
    target: Arc<dyn CacheBudget>,
    ceiling: AtomicU64,
    stop: AtomicBool,
    wake: EventFd,
    /// Serialises "read ceiling, decide, apply" against the operator's `set_ceiling`.
    apply: Mutex<GovernorStats>,
}

impl Shared {
    fn stats(&self) -> std::sync::MutexGuard<'_, GovernorStats> {
        self.apply.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_ceiling(&self, bytes: u64) {
        let mut stats = self.stats();
        self.ceiling.store(bytes, Ordering::Release);
        stats.ceiling_bytes = bytes;
        let budget = self.target.budget();
        if budget > bytes {
            self.target.set_budget(bytes);
            let line = format!(
                "shrink {} -> {}: ceiling lowered by operator",
                ByteSize(budget).rounded(),
                ByteSize(bytes).rounded()
            );
            tracing::info!(
                from = budget,
                to = bytes,
                ceiling = bytes,
                "cache budget shrunk: ceiling lowered by operator"
            );
            stats.shrinks += 1;
            stats.last_decision = Some(line);
        }
    }
}

/// The running governor; dropping it stops and joins its thread.
pub struct Governor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Governor {
    /// Starts governing `target` below `ceiling` on a thread named "tenantfs-governor". A
    /// budget above the ceiling is cut to it before this returns.
    pub fn start(
        target: Arc<dyn CacheBudget>,
        ceiling: u64,
        config: GovernorConfig,
    ) -> std::io::Result<Governor> {
        let cgroup = match config.cgroup.clone() {
            Some(c) => Some(c),
            None => CgroupMemory::of_self().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no memory cgroup found; governing on host signals");
                None
            }),
        };
        let wake =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let watch = Watch::new(
            cgroup.as_ref(),
            &WatchConfig {
                psi_triggers: config.psi_triggers,
                psi_stall: config.psi_stall,
                psi_window: config.psi_window,
                v1_pressure_level: config.v1_pressure_level,
            },
        );
        let shared = Arc::new(Shared {
            target,
            ceiling: AtomicU64::new(ceiling),
            stop: AtomicBool::new(false),
            wake,
            apply: Mutex::new(GovernorStats::default()),
        });
        shared.set_ceiling(ceiling);
        tracing::info!(
            ceiling,
            cgroup = ?cgroup,
            interval_ms = config.interval.as_millis() as u64,
            "cache governor started"
        );
        let runner = Runner {
            shared: Arc::clone(&shared),
            watch,
            cgroup,
            policy: Policy::new(config.policy.clone()),
            interval: config.interval.max(Duration::from_millis(1)),
            cgroup_warned: false,
        };
        let thread = std::thread::Builder::new()
            .name("tenantfs-governor".into())
            .spawn(move || runner.run())?;
        Ok(Governor {
            shared,
            thread: Some(thread),
        })
    }

    /// The operator's `cache budget SIZE`: a budget above it is cut at once; the governor
    /// grows up to it later (straight to it when there is no pressure and room allows).
    pub fn set_ceiling(&self, bytes: u64) {
        self.shared.set_ceiling(bytes);
        self.wake();
    }

    pub fn ceiling(&self) -> u64 {
        self.shared.ceiling.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> GovernorStats {
        self.shared.stats().clone()
    }

    fn wake(&self) {
        if let Err(e) = self.shared.wake.write(1) {
            tracing::warn!(error = %e, "cannot wake the cache governor");
        }
    }
}

impl Drop for Governor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("cache governor thread panicked");
            }
        }
    }
}

impl fmt::Debug for Governor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Governor")
            .field("ceiling", &self.ceiling())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The governor thread's state.
struct Runner {
    shared: Arc<Shared>,
    watch: Watch,
    cgroup: Option<CgroupMemory>,
    policy: Policy,
    interval: Duration,
    cgroup_warned: bool,
}

impl Runner {
    fn run(mut self) {
        // Events tick at once, but no more often than every half interval: a v1 reclaim
        // storm signals many times a second and each shrink needs a fresh sample to judge.
        let min_gap = self.interval / 2;
        let mut pending = Triggers::default();
        let mut last = Instant::now();
        let mut next = last + self.interval;
        loop {
            let due = if pending.any() {
                (last + min_gap).min(next)
            } else {
                next
            };
            let woke = self.watch.wait(
                &self.shared.wake,
                due.saturating_duration_since(Instant::now()),
            );
            if self.shared.stop.load(Ordering::Acquire) {
                break;
            }
            pending = pending.merge(woke.triggers);
            let now = Instant::now();
            if woke.woken || now >= next || (pending.any() && now >= last + min_gap) {
                self.tick(std::mem::take(&mut pending));
                last = now;
                next = now + self.interval;
            }
        }
        tracing::info!("cache governor stopped");
    }

    fn sample(&mut self, mut triggers: Triggers) -> Sample {
        let cgroup = self.cgroup.as_ref().and_then(|cg| match cg.state() {
            Ok(s) => {
                self.cgroup_warned = false;
                Some(s)
            }
            Err(e) => {
                if !std::mem::replace(&mut self.cgroup_warned, true) {
                    tracing::warn!(dir = %cg.dir().display(), error = %e, "cannot read the memory cgroup");
                }
                None
            }
        });
        if cgroup.is_none() {
            // The event a v1 cgroup sends when it is removed is no pressure.
            triggers.v1_pressure_level = false;
        }
        let cgroup_psi = match &self.cgroup {
            Some(CgroupMemory::V2(dir)) => std::fs::read_to_string(dir.join("memory.pressure"))
                .ok()
                .and_then(|t| signals::parse_psi(&t)),
            _ => None,
        };
        Sample {
            host_psi: signals::read_host_psi().ok(),
            cgroup_psi,
            cgroup,
            cgroup_v1: matches!(self.cgroup, Some(CgroupMemory::V1(_))),
            meminfo: signals::read_meminfo().ok(),
            triggers,
        }
    }

    fn tick(&mut self, triggers: Triggers) {
        let sample = self.sample(triggers);
        let shared = Arc::clone(&self.shared);
        shared.target.tick();
        let mut stats = shared.stats();
        let ceiling = shared.ceiling.load(Ordering::Acquire);
        let budget = shared.target.budget();
        let used = shared.target.used();
        let decision = self.policy.decide(&sample, budget, used, ceiling);
        if let Some(p) = self.policy.pressure() {
            stats.pressure_events += 1;
            if decision == Decision::Keep {
                tracing::debug!(
                    budget,
                    used,
                    ceiling,
                    pressure = p,
                    "cache budget kept under pressure"
                );
            }
        }
        match decision {
            Decision::Keep => {}
            Decision::Shrink { to, reason } => {
                shared.target.set_budget(to);
                tracing::info!(from = budget, to, used, ceiling, %reason, "cache budget shrunk");
                stats.shrinks += 1;
                stats.last_decision = Some(format!(
                    "shrink {} -> {}: {reason}",
                    ByteSize(budget).rounded(),
                    ByteSize(to).rounded()
                ));
            }
            Decision::Grow { to, reason } => {
                shared.target.set_budget(to);
                tracing::info!(from = budget, to, used, ceiling, %reason, "cache budget grown");
                stats.grows += 1;
                stats.last_decision = Some(format!(
                    "grow {} -> {}: {reason}",
                    ByteSize(budget).rounded(),
                    ByteSize(to).rounded()
                ));
            }
        }
    }
}

/// The governor thread against live inputs.
#[cfg(test)]
mod live_tests {
    use super::super::policy::MIB;
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};

    const GIB: u64 = 1 << 30;

    /// A cache that holds `min(budget, wanted)` bytes, as a real one filled by a workload.
    struct TestCache {
        budget: AtomicU64,
        wanted: u64,
        sets: AtomicU64,
    }

    impl TestCache {
        fn new(budget: u64, wanted: u64) -> Arc<Self> {
            Arc::new(TestCache {
                budget: AtomicU64::new(budget),
                wanted,
                sets: AtomicU64::new(0),
            })
        }
    }

    impl CacheBudget for TestCache {
        fn budget(&self) -> u64 {
            self.budget.load(Ordering::SeqCst)
        }
        fn used(&self) -> u64 {
            self.budget().min(self.wanted)
        }
        fn set_budget(&self, bytes: u64) {
            self.sets.fetch_add(1, Ordering::SeqCst);
            self.budget.store(bytes, Ordering::SeqCst);
        }
    }

    /// A v2 cgroup directory with lots of room and no events.
    fn roomy_v2_fixture() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let w = |n: &str, v: &str| std::fs::write(dir.path().join(n), v).unwrap();
        w("memory.current", &format!("{}\n", 100 * MIB));
        w("memory.max", &format!("{}\n", 64 * GIB));
        w("memory.high", "max\n");
        w("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
        dir
    }

    fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        done()
    }

    #[test]
    fn drop_is_prompt_with_a_long_interval() {
        let fixture = roomy_v2_fixture();
        let config = GovernorConfig {
            interval: Duration::from_secs(10),
            cgroup: Some(CgroupMemory::V2(fixture.path().to_owned())),
            ..GovernorConfig::default()
        };
        let gov = Governor::start(TestCache::new(GIB, GIB), GIB, config).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        drop(gov);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    #[test]
    fn set_ceiling_applies_at_once_and_raises() {
        let fixture = roomy_v2_fixture();
        let config = GovernorConfig {
            interval: Duration::from_millis(50),
            cgroup: Some(CgroupMemory::V2(fixture.path().to_owned())),
            ..GovernorConfig::default()
        };
        // A budget above the starting ceiling is cut before start returns.
        let cache = TestCache::new(2 * GIB, 2 * GIB);
        let gov = Governor::start(cache.clone(), GIB, config).unwrap();
        assert_eq!(cache.budget(), GIB);
        gov.set_ceiling(256 * MIB);
        assert_eq!(
            cache.budget(),
            256 * MIB,
            "applied before set_ceiling returns"
        );
        assert_eq!(gov.ceiling(), 256 * MIB);
        let stats = gov.stats();
        assert_eq!((stats.ceiling_bytes, stats.shrinks), (256 * MIB, 2));
        assert!(
            stats
                .last_decision
                .as_deref()
                .is_some_and(|d| d.contains("ceiling lowered by operator")),
            "{stats:?}"
        );
        // Let the governor tick at the low ceiling, then raise it: no pressure, no shrink by
        // the policy, lots of room: the budget goes straight up.
        std::thread::sleep(Duration::from_millis(200));
        gov.set_ceiling(GIB);
        assert!(
            wait_for(Duration::from_secs(2), || cache.budget() == GIB),
            "budget {} MiB, stats {:?}",
            cache.budget() / MIB,
            gov.stats()
        );
        let stats = gov.stats();
        assert_eq!(stats.grows, 1, "{stats:?}");
        let json = serde_json::to_value(&stats).unwrap();
        assert_eq!(json["ceiling_bytes"], GIB);
    }

    #[test]
    fn v2_fixture_files_drive_the_governor_thread() {
        // A v2 cgroup as files: the thread reads them each tick like the live ones.
        let fixture = roomy_v2_fixture();
        let w = |n: &str, v: String| std::fs::write(fixture.path().join(n), v).unwrap();
        w("memory.max", format!("{}\n", 2 * GIB));
        let config = GovernorConfig {
            interval: Duration::from_millis(50),
            cgroup: Some(CgroupMemory::V2(fixture.path().to_owned())),
            psi_triggers: false,
            ..GovernorConfig::default()
        };
        let cache = TestCache::new(GIB, GIB);
        let gov = Governor::start(cache.clone(), GIB, config).unwrap();
        // Usage close to memory.max: the budget must drop.
        w("memory.current", format!("{}\n", 2 * GIB - 20 * MIB));
        assert!(
            wait_for(Duration::from_secs(3), || cache.budget() < GIB),
            "{:?}",
            gov.stats()
        );
        let after_headroom = cache.budget();
        assert!(gov
            .stats()
            .last_decision
            .is_some_and(|d| d.contains("cgroup headroom")));
        // Room again, then a memory.max event: another shrink, for that reason.
        w("memory.current", format!("{}\n", 100 * MIB));
        std::thread::sleep(Duration::from_millis(150));
        w(
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n".into(),
        );
        assert!(
            wait_for(Duration::from_secs(3), || gov
                .stats()
                .last_decision
                .is_some_and(|d| d.contains("memory.events max +3"))),
            "{:?}",
            gov.stats()
        );
        assert!(cache.budget() < after_headroom);
        // Calm and roomy: it grows back to the ceiling.
        assert!(
            wait_for(Duration::from_secs(10), || cache.budget() == GIB),
            "{:?}",
            gov.stats()
        );
        assert!(gov.stats().grows >= 1);
    }

    /// A scratch v1 memory cgroup with a memory hog in it; removed on drop, even on failure.
    struct HogCgroup {
        dir: PathBuf,
        child: Option<Child>,
    }

    impl HogCgroup {
        fn procs(&self) -> Vec<i32> {
            std::fs::read_to_string(self.dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        }
    }

    impl Drop for HogCgroup {
        fn drop(&mut self) {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            for _ in 0..100 {
                for pid in self.procs() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            tracing::warn!(dir = %self.dir.display(), "could not remove the test cgroup");
        }
    }

    #[test]
    fn live_v1_cgroup_pressure_shrinks_the_budget() {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("cgroup.procs").exists() {
            tracing::warn!("skipped: no cgroup v1 memory controller");
            return;
        }
        let dir = root.join(format!("tenantfs-gov-test-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "skipped: cannot create the test cgroup");
            return;
        }
        let mut hog = HogCgroup {
            dir: dir.clone(),
            child: None,
        };
        std::fs::write(dir.join("memory.limit_in_bytes"), format!("{}", 256 * MIB)).unwrap();
        // 13 x 16 MiB, touched, one every 50 ms: ~220 MiB with the interpreter, under the
        // limit but inside the 64 MiB watermark.
        let script = "import time\nheld = []\nfor _ in range(13):\n    \
                      held.append(b'x' * (16 << 20))\n    time.sleep(0.05)\ntime.sleep(120)\n";
        hog.child = Some(
            Command::new("sh")
                .arg("-c")
                .arg("echo $$ > \"$1/cgroup.procs\" && exec python3 -c \"$2\"")
                .arg("sh")
                .arg(&dir)
                .arg(script)
                .spawn()
                .unwrap(),
        );
        let ceiling = 512 * MIB;
        let cache = TestCache::new(ceiling, 200 * MIB);
        let config = GovernorConfig {
            interval: Duration::from_millis(100),
            cgroup: Some(CgroupMemory::V1(dir.clone())),
            ..GovernorConfig::default()
        };
        let gov = Governor::start(cache.clone(), ceiling, config).unwrap();
        let shrunk = wait_for(Duration::from_secs(10), || cache.budget() < 200 * MIB);
        let stats = gov.stats();
        let usage = CgroupMemory::V1(dir.clone()).state();
        drop(gov);
        drop(hog);
        assert!(
            shrunk,
            "budget {} MiB, stats {stats:?}, cgroup {usage:?}",
            cache.budget() / MIB
        );
        tracing::info!(?stats, "governor after the hog");
        assert!(
            stats.shrinks >= 1 && stats.pressure_events >= 1,
            "{stats:?}"
        );
        let last = stats.last_decision.unwrap_or_default();
        assert!(
            last.contains("cgroup headroom") || last.contains("v1 memory."),
            "the shrink came from the cgroup: {last}"
        );
        assert!(!dir.exists(), "cgroup removed");
    }
}
