//! The cache governor: owns the host cache budget, shrinks it under memory pressure and grows
//! it back, with hysteresis, once pressure has stayed away. The caches are the one large
//! memory consumer of tenantfs that can give memory back at once, so they are what yields
//! when the host or the service's cgroup runs short; the operator's `cache budget SIZE` is the
//! ceiling the governor never exceeds.
//!
//! [`Policy`] is the pure decision function, tested on fixture samples; [`Governor`] runs it
//! on a thread against live inputs (see `watch`): a poll loop that wakes every `interval`
//! (1 s) or at once when a PSI trigger or a v1 `memory.pressure_level` event fires.
//!
//! Pressure, on any one of (each is a reason in the log line):
//! - a trigger fired since the last tick: host or cgroup PSI trigger (150 ms stall in 1 s),
//!   v1 `memory.pressure_level` medium;
//! - PSI `some avg10` above 10 % (host /proc/pressure/memory or the v2 cgroup's
//!   memory.pressure); avg10 lags, so after a shrink it cannot shrink again for 3 ticks;
//! - the cgroup's `high`, `max` or `oom` event counts grew (v1: memory.failcnt and
//!   memory.oom_control `oom_kill`);
//! - cgroup headroom (limit − (current − inactive_file), limit = min(high, max)) below the
//!   watermark max(64 MiB, 5 % of limit). Inactive page cache is what the kernel reclaims
//!   first, so it counts as room: a cgroup full of cold page cache does not pin the cache low;
//! - MemAvailable below max(64 MiB, 5 % of MemTotal).
//!
//! Decisions:
//! - Shrink under pressure to max(floor, min(budget, used) − max(need, quarter)), where
//!   `need` brings the headroom (or MemAvailable) back to twice its watermark and `quarter` is
//!   a quarter of min(budget, used). The floor is 32 MiB (or the ceiling, if lower).
//! - Budget above the ceiling (operator lowered it): shrink to the ceiling at once.
//! - Grow only after 10 ticks without pressure (any pressure or shrink restarts the count),
//!   by max(64 MiB, ceiling / 8), again at most every 10 ticks; never above the ceiling, and
//!   never above used + headroom − 2 × watermark (cgroup limit, and MemAvailable likewise) so
//!   growth does not walk the caches back into the limit that made them shrink.
//! - When the operator raises the ceiling and there has been no shrink for 10 ticks and no
//!   pressure now, the budget goes straight to the new ceiling (capped as above).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use super::signals::{self, CgroupMemory, CgroupState, MemInfo, PsiPair};
use super::watch::{Triggers, Watch, WatchConfig};

const MIB: u64 = 1 << 20;

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

/// Tuning of [`Policy`]; the defaults are the numbers in the module doc.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// The budget never shrinks below this (unless the ceiling is lower).
    pub floor: u64,
    /// Watermarks are max(`watermark_min`, `watermark_percent` % of the limit or MemTotal).
    pub watermark_min: u64,
    pub watermark_percent: u64,
    /// PSI `some avg10` (percent) above which memory is under pressure.
    pub psi_some_avg10: f64,
    /// Ticks after a shrink during which PSI averages alone do not shrink again.
    pub psi_cooldown_ticks: u32,
    /// Ticks without pressure before growing, and between growth steps.
    pub calm_ticks: u32,
    /// A growth step is max(`grow_step_min`, ceiling / `grow_step_divisor`).
    pub grow_step_min: u64,
    pub grow_step_divisor: u64,
    /// A shrink cuts at least min(budget, used) / `shrink_divisor`.
    pub shrink_divisor: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            floor: 32 * MIB,
            watermark_min: 64 * MIB,
            watermark_percent: 5,
            psi_some_avg10: 10.0,
            psi_cooldown_ticks: 3,
            calm_ticks: 10,
            grow_step_min: 64 * MIB,
            grow_step_divisor: 8,
            shrink_divisor: 4,
        }
    }
}

/// What one tick read. Event counts are compared with the previous tick's by the policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub host_psi: Option<PsiPair>,
    /// The v2 cgroup's memory.pressure.
    pub cgroup_psi: Option<PsiPair>,
    pub cgroup: Option<CgroupState>,
    /// The cgroup speaks v1 (changes only the file names in reasons).
    pub cgroup_v1: bool,
    pub meminfo: Option<MemInfo>,
    pub triggers: Triggers,
}

/// The policy's verdict for one tick; `reason` says why, with the numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Keep,
    Shrink { to: u64, reason: String },
    Grow { to: u64, reason: String },
}

struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 10 << 30 {
            write!(f, "{:.1} GiB", self.0 as f64 / (1u64 << 30) as f64)
        } else {
            write!(f, "{} MiB", self.0 / MIB)
        }
    }
}

/// Pressure found in one sample.
struct Pressure {
    reasons: Vec<String>,
    /// Bytes to release to restore twice the watermark (0 for signals without a size).
    need: u64,
    /// Only lagging PSI averages: subject to the post-shrink cooldown.
    averages_only: bool,
}

/// The decision function: pure, fed one [`Sample`] per tick.
#[derive(Debug)]
pub struct Policy {
    config: PolicyConfig,
    prev: Option<CgroupState>,
    /// Ticks without pressure (0 on the tick of pressure).
    calm: u32,
    since_shrink: u32,
    since_grow: u32,
    last_ceiling: Option<u64>,
    pressure: Option<String>,
}

impl Policy {
    pub fn new(config: PolicyConfig) -> Self {
        Policy {
            config,
            prev: None,
            calm: 0,
            since_shrink: u32::MAX,
            since_grow: u32::MAX,
            last_ceiling: None,
            pressure: None,
        }
    }

    /// The pressure the last [`Policy::decide`] saw, if any.
    pub fn pressure(&self) -> Option<&str> {
        self.pressure.as_deref()
    }

    fn watermark(&self, of: u64) -> u64 {
        (of / 100 * self.config.watermark_percent).max(self.config.watermark_min)
    }

    fn assess(&self, s: &Sample) -> Option<Pressure> {
        let c = &self.config;
        let mut reasons = Vec::new();
        let mut averages = 0;
        let mut need = 0u64;
        if s.triggers.host_psi {
            reasons.push("host PSI trigger fired".to_owned());
        }
        if s.triggers.cgroup_psi {
            reasons.push("cgroup memory.pressure trigger fired".to_owned());
        }
        if s.triggers.v1_pressure_level {
            reasons.push("v1 memory.pressure_level medium event".to_owned());
        }
        for (what, psi) in [("host", s.host_psi), ("cgroup", s.cgroup_psi)] {
            if let Some(p) = psi.filter(|p| p.some.avg10 > c.psi_some_avg10) {
                reasons.push(format!(
                    "{what} PSI some avg10 {:.1}% > {}%",
                    p.some.avg10, c.psi_some_avg10
                ));
                averages += 1;
            }
        }
        if let Some(cg) = &s.cgroup {
            if let Some(prev) = &self.prev {
                let (high, max, oom) = if s.cgroup_v1 {
                    ("", "v1 memory.failcnt", "v1 memory.oom_control oom_kill")
                } else {
                    (
                        "v2 memory.events high",
                        "v2 memory.events max",
                        "v2 memory.events oom",
                    )
                };
                // Limit hits while much inactive page cache is left are the kernel recycling
                // page cache, not a shortage (OOM events always count).
                let recycling = cgroup_limit(cg).is_some_and(|limit| {
                    cg.inactive_file > 0
                        && limit.saturating_sub(cg.unreclaimable()) >= 4 * self.watermark(limit)
                });
                for (name, now, before) in [
                    (high, cg.high_events, prev.high_events),
                    (max, cg.max_events, prev.max_events),
                    (oom, cg.oom_events, prev.oom_events),
                ] {
                    // A counter that went down belongs to a new cgroup: no delta.
                    if now > before && !(recycling && name != oom) {
                        reasons.push(format!("{name} +{}", now - before));
                    }
                }
            }
            if let Some(limit) = cgroup_limit(cg) {
                let wm = self.watermark(limit);
                let headroom = limit.saturating_sub(cg.unreclaimable());
                if headroom < wm {
                    need = need.max(2 * wm - headroom);
                    reasons.push(format!(
                        "cgroup headroom {} < {} watermark (usage {} of limit {}, {} of it inactive page cache)",
                        Bytes(headroom),
                        Bytes(wm),
                        Bytes(cg.current),
                        Bytes(limit),
                        Bytes(cg.inactive_file)
                    ));
                }
            }
        }
        if let Some(m) = &s.meminfo {
            let wm = self.watermark(m.total);
            if m.available < wm {
                need = need.max(2 * wm - m.available);
                reasons.push(format!(
                    "MemAvailable {} < {} watermark",
                    Bytes(m.available),
                    Bytes(wm)
                ));
            }
        }
        if reasons.is_empty() {
            return None;
        }
        Some(Pressure {
            averages_only: averages == reasons.len(),
            reasons,
            need,
        })
    }

    /// The most the budget may grow to without eating into a watermark: used + headroom −
    /// 2 × watermark, for the cgroup limit and for MemAvailable.
    fn grow_cap(&self, s: &Sample, used: u64) -> Option<u64> {
        let cgroup = s.cgroup.as_ref().and_then(|cg| {
            let limit = cgroup_limit(cg)?;
            let room = limit.saturating_sub(cg.unreclaimable());
            Some((used + room).saturating_sub(2 * self.watermark(limit)))
        });
        let host = s
            .meminfo
            .map(|m| (used + m.available).saturating_sub(2 * self.watermark(m.total)));
        match (cgroup, host) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Decides what to do with the budget this tick.
    pub fn decide(&mut self, s: &Sample, budget: u64, used: u64, ceiling: u64) -> Decision {
        let c = self.config.clone();
        let pressure = self.assess(s);
        if s.cgroup.is_some() {
            self.prev = s.cgroup;
        }
        let raised = self.last_ceiling.is_some_and(|last| ceiling > last);
        self.last_ceiling = Some(ceiling);
        self.since_shrink = self.since_shrink.saturating_add(1);
        self.since_grow = self.since_grow.saturating_add(1);
        let floor = c.floor.min(ceiling);
        let lowered = || Decision::Shrink {
            to: ceiling,
            reason: format!(
                "ceiling lowered by operator to {} (budget {})",
                Bytes(ceiling),
                Bytes(budget)
            ),
        };

        if let Some(p) = pressure {
            self.calm = 0;
            let why = p.reasons.join("; ");
            self.pressure = Some(why.clone());
            if !p.averages_only || self.since_shrink > c.psi_cooldown_ticks {
                let base = budget.min(used).min(ceiling);
                let cut = p.need.max(base / c.shrink_divisor.max(1));
                let to = base.saturating_sub(cut).max(floor);
                if to < budget {
                    self.since_shrink = 0;
                    return Decision::Shrink {
                        to,
                        reason: format!(
                            "{why} (used {}, budget {}, cut {})",
                            Bytes(used),
                            Bytes(budget),
                            Bytes(budget - to)
                        ),
                    };
                }
            }
            return if budget > ceiling {
                lowered()
            } else {
                Decision::Keep
            };
        }
        self.pressure = None;
        if budget > ceiling {
            return lowered();
        }
        self.calm = self.calm.saturating_add(1);
        if budget >= ceiling {
            return Decision::Keep;
        }
        let cap = self.grow_cap(s, used);
        let capped = |to: u64| cap.map_or(to, |cap| to.min(cap));
        if raised && self.since_shrink >= c.calm_ticks {
            let to = capped(ceiling);
            if to > budget {
                self.since_grow = 0;
                return Decision::Grow {
                    to,
                    reason: format!(
                        "ceiling raised by operator to {}, no shrink for {} ticks{}",
                        Bytes(ceiling),
                        c.calm_ticks,
                        cap_note(to, ceiling)
                    ),
                };
            }
        }
        if self.calm >= c.calm_ticks && self.since_grow >= c.calm_ticks {
            let step = c.grow_step_min.max(ceiling / c.grow_step_divisor.max(1));
            let to = capped(budget.saturating_add(step).min(ceiling));
            if to > budget {
                self.since_grow = 0;
                return Decision::Grow {
                    to,
                    reason: format!(
                        "calm for {} ticks (step {}, ceiling {}){}",
                        self.calm,
                        Bytes(step),
                        Bytes(ceiling),
                        cap_note(to, budget.saturating_add(step).min(ceiling))
                    ),
                };
            }
        }
        Decision::Keep
    }
}

fn cap_note(to: u64, wanted: u64) -> String {
    if to < wanted {
        format!(", capped at {} to keep 2x watermark headroom", Bytes(to))
    } else {
        String::new()
    }
}

/// The limit the cgroup reclaims or throttles at: min(high, max).
fn cgroup_limit(cg: &CgroupState) -> Option<u64> {
    match (cg.high, cg.max) {
        (Some(h), Some(m)) => Some(h.min(m)),
        (h, m) => h.or(m),
    }
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
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
                Bytes(budget),
                Bytes(bytes)
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
                    Bytes(budget),
                    Bytes(to)
                ));
            }
            Decision::Grow { to, reason } => {
                shared.target.set_budget(to);
                tracing::info!(from = budget, to, used, ceiling, %reason, "cache budget grown");
                stats.grows += 1;
                stats.last_decision =
                    Some(format!("grow {} -> {}: {reason}", Bytes(budget), Bytes(to)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pressure::signals::Psi;

    const GIB: u64 = 1 << 30;

    fn v2(current: u64, max: Option<u64>, high: Option<u64>, events: (u64, u64, u64)) -> Sample {
        Sample {
            cgroup: Some(CgroupState {
                current,
                max,
                high,
                high_events: events.0,
                max_events: events.1,
                oom_events: events.2,
                inactive_file: 0,
            }),
            ..Sample::default()
        }
    }

    fn v1(current: u64, limit: u64, failcnt: u64, oom_kill: u64) -> Sample {
        Sample {
            cgroup: Some(CgroupState {
                current,
                max: Some(limit),
                max_events: failcnt,
                oom_events: oom_kill,
                ..CgroupState::default()
            }),
            cgroup_v1: true,
            ..Sample::default()
        }
    }

    fn psi(avg10: f64) -> Option<PsiPair> {
        Some(PsiPair {
            some: Psi {
                avg10,
                ..Psi::default()
            },
            full: Psi::default(),
        })
    }

    fn fired(mut s: Sample) -> Sample {
        s.triggers.host_psi = true;
        s
    }

    fn shrink_to(d: &Decision) -> u64 {
        match d {
            Decision::Shrink { to, .. } => *to,
            other => panic!("expected a shrink, got {other:?}"),
        }
    }

    fn grow_to(d: &Decision) -> u64 {
        match d {
            Decision::Grow { to, .. } => *to,
            other => panic!("expected a grow, got {other:?}"),
        }
    }

    fn reason(d: &Decision) -> &str {
        match d {
            Decision::Shrink { reason, .. } | Decision::Grow { reason, .. } => reason,
            Decision::Keep => "",
        }
    }

    /// A roomy v2 cgroup: no pressure, no growth cap below a few GiB.
    fn calm() -> Sample {
        v2(300 * MIB, Some(8 * GIB), None, (0, 0, 0))
    }

    #[test]
    fn inactive_page_cache_counts_as_room() {
        // 1000 MiB used of 1 GiB, but 300 MiB of it is inactive page cache the kernel reclaims
        // first: 324 MiB of headroom, no pressure, and room to grow.
        let mut s = v2(1000 * MIB, Some(GIB), None, (0, 0, 0));
        if let Some(cg) = s.cgroup.as_mut() {
            cg.inactive_file = 300 * MIB;
        }
        let mut p = Policy::new(PolicyConfig::default());
        assert_eq!(p.decide(&s, 512 * MIB, 400 * MIB, 2 * GIB), Decision::Keep);
        assert!(p.pressure().is_none());
    }

    #[test]
    fn shrinks_by_the_headroom_deficit() {
        let mut p = Policy::new(PolicyConfig::default());
        // limit 1 GiB: watermark max(64 MiB, 51 MiB); headroom 24 MiB; need 2*64-24 = 104 MiB.
        let s = v2(1000 * MIB, Some(GIB), None, (0, 0, 0));
        let d = p.decide(&s, 512 * MIB, 400 * MIB, 2 * GIB);
        assert_eq!(shrink_to(&d), 296 * MIB);
        assert!(
            reason(&d).contains("cgroup headroom 24 MiB < 64 MiB watermark"),
            "{d:?}"
        );
        // memory.high below memory.max is the limit that counts.
        let s = v2(790 * MIB, Some(GIB), Some(800 * MIB), (0, 0, 0));
        let d = Policy::new(PolicyConfig::default()).decide(&s, GIB, 300 * MIB, GIB);
        assert_eq!(
            shrink_to(&d),
            (300 - 118) * MIB,
            "need 2*64-10 beats a quarter"
        );
        assert!(
            reason(&d)
                .contains("headroom 10 MiB < 64 MiB watermark (usage 790 MiB of limit 800 MiB"),
            "{d:?}"
        );
        // A large limit scales the watermark: 5% of 4 GiB = 204.8 MiB.
        let s = v2(4 * GIB - 100 * MIB, Some(4 * GIB), None, (0, 0, 0));
        let d = Policy::new(PolicyConfig::default()).decide(&s, 2 * GIB, 2 * GIB, 2 * GIB);
        assert!(reason(&d).contains("< 204 MiB watermark"), "{d:?}");
        // Enough headroom: no pressure.
        let s = v2(800 * MIB, Some(GIB), None, (0, 0, 0));
        let mut p = Policy::new(PolicyConfig::default());
        assert_eq!(p.decide(&s, GIB, GIB, GIB), Decision::Keep);
        assert_eq!(p.pressure(), None);
    }

    #[test]
    fn shrinks_at_least_a_quarter() {
        let mut p = Policy::new(PolicyConfig::default());
        let d = p.decide(&fired(calm()), 512 * MIB, 400 * MIB, GIB);
        assert_eq!(shrink_to(&d), 300 * MIB, "a quarter of min(budget, used)");
        assert!(reason(&d).starts_with("host PSI trigger fired"), "{d:?}");
        assert_eq!(p.pressure(), Some("host PSI trigger fired"));
        let mut s = calm();
        s.triggers.cgroup_psi = true;
        let d = p.decide(&s, 300 * MIB, 300 * MIB, GIB);
        assert_eq!(shrink_to(&d), 225 * MIB);
        assert!(reason(&d).contains("cgroup memory.pressure trigger fired"));
    }

    #[test]
    fn event_counts_that_grew_are_pressure() {
        let mut p = Policy::new(PolicyConfig::default());
        // The first sample is the baseline: counts since the cgroup was created are history.
        let d = p.decide(&v2(0, None, None, (5, 2, 0)), GIB, GIB, GIB);
        assert_eq!(d, Decision::Keep);
        let d = p.decide(&v2(0, None, None, (5, 5, 0)), GIB, GIB, GIB);
        assert_eq!(shrink_to(&d), 768 * MIB);
        assert!(reason(&d).starts_with("v2 memory.events max +3"), "{d:?}");
        let d = p.decide(&v2(0, None, None, (9, 5, 1)), GIB, GIB, GIB);
        assert!(
            reason(&d).starts_with("v2 memory.events high +4; v2 memory.events oom +1"),
            "{d:?}"
        );
        // Counters that went down (a new cgroup) are no pressure.
        let d = p.decide(&v2(0, None, None, (0, 0, 0)), GIB, GIB, GIB);
        assert_eq!((d, p.pressure()), (Decision::Keep, None));
        // Limit hits of a cgroup full of inactive page cache are reclaim, not pressure...
        let full_of_cache = |events| {
            let mut s = v2(GIB, Some(GIB), None, events);
            s.cgroup.as_mut().unwrap().inactive_file = 600 * MIB;
            s
        };
        let mut p = Policy::new(PolicyConfig::default());
        p.decide(&full_of_cache((0, 10, 0)), 256 * MIB, 256 * MIB, GIB);
        let d = p.decide(&full_of_cache((0, 90, 0)), 256 * MIB, 256 * MIB, GIB);
        assert_eq!((d, p.pressure()), (Decision::Keep, None));
        // ...but an OOM event still is.
        let d = p.decide(&full_of_cache((0, 95, 1)), 256 * MIB, 256 * MIB, GIB);
        assert!(reason(&d).contains("oom +1"), "{d:?}");
    }

    #[test]
    fn psi_averages_shrink_then_cool_down() {
        let mut p = Policy::new(PolicyConfig::default());
        let mut s = calm();
        s.host_psi = psi(12.3);
        let d = p.decide(&s, GIB, GIB, GIB);
        assert_eq!(shrink_to(&d), 768 * MIB);
        assert!(
            reason(&d).starts_with("host PSI some avg10 12.3% > 10%"),
            "{d:?}"
        );
        // avg10 lags: the same reading for the next 3 ticks is pressure but no new shrink.
        for _ in 0..3 {
            assert_eq!(p.decide(&s, 768 * MIB, 768 * MIB, GIB), Decision::Keep);
            assert!(p.pressure().is_some());
        }
        assert_eq!(
            shrink_to(&p.decide(&s, 768 * MIB, 768 * MIB, GIB)),
            576 * MIB
        );
        // An event during the cooldown shrinks at once.
        let d = p.decide(&fired(s.clone()), 576 * MIB, 576 * MIB, GIB);
        assert_eq!(shrink_to(&d), 432 * MIB);
        // The cgroup's own PSI (v2 memory.pressure) counts too.
        let mut s = calm();
        s.cgroup_psi = psi(50.0);
        let d = Policy::new(PolicyConfig::default()).decide(&s, GIB, GIB, GIB);
        assert!(
            reason(&d).starts_with("cgroup PSI some avg10 50.0% > 10%"),
            "{d:?}"
        );
        s.cgroup_psi = psi(9.9);
        assert_eq!(
            Policy::new(PolicyConfig::default()).decide(&s, GIB, GIB, GIB),
            Decision::Keep
        );
    }

    #[test]
    fn low_mem_available_is_pressure() {
        let mut p = Policy::new(PolicyConfig::default());
        let s = Sample {
            meminfo: Some(MemInfo {
                total: 16 * GIB,
                available: 200 * MIB,
            }),
            ..Sample::default()
        };
        // Watermark 5% of 16 GiB = 819.2 MiB; need 2 * 819.2 - 200 = 1438.4 MiB.
        let d = p.decide(&s, 2 * GIB, 2 * GIB, 4 * GIB);
        let need = 2 * (16 * GIB / 100 * 5) - 200 * MIB;
        assert_eq!(shrink_to(&d), 2 * GIB - need);
        assert!(
            reason(&d).starts_with("MemAvailable 200 MiB < 819 MiB watermark"),
            "{d:?}"
        );
    }

    #[test]
    fn lowered_ceiling_shrinks_at_once() {
        let mut p = Policy::new(PolicyConfig::default());
        let d = p.decide(&calm(), 512 * MIB, 100 * MIB, 256 * MIB);
        assert_eq!(shrink_to(&d), 256 * MIB);
        assert!(reason(&d).starts_with("ceiling lowered by operator to 256 MiB"));
        // With pressure as well, the pressure target wins when it is lower.
        let d = p.decide(&fired(calm()), 512 * MIB, 200 * MIB, 256 * MIB);
        assert_eq!(shrink_to(&d), 150 * MIB);
        // Pressure with nothing left to cut still obeys the ceiling.
        let d = p.decide(&fired(calm()), 512 * MIB, 10 * MIB, 256 * MIB);
        assert_eq!(shrink_to(&d), 32 * MIB);
    }

    #[test]
    fn floor_is_respected() {
        let mut p = Policy::new(PolicyConfig::default());
        let d = p.decide(&fired(calm()), 256 * MIB, 40 * MIB, GIB);
        assert_eq!(shrink_to(&d), 32 * MIB);
        assert_eq!(
            p.decide(&fired(calm()), 32 * MIB, 32 * MIB, GIB),
            Decision::Keep
        );
        assert!(p.pressure().is_some());
        // An operator ceiling below the floor wins over the floor.
        let d = p.decide(&fired(calm()), 64 * MIB, 64 * MIB, 16 * MIB);
        assert_eq!(shrink_to(&d), 16 * MIB);
        assert_eq!(
            p.decide(&fired(calm()), 16 * MIB, 16 * MIB, 16 * MIB),
            Decision::Keep
        );
    }

    #[test]
    fn v2_sequence_with_hysteresis() {
        let mut p = Policy::new(PolicyConfig::default());
        let ceiling = GIB;
        let tight = v2(1000 * MIB, Some(GIB), None, (0, 0, 0));
        // Pressure: shrink.
        let mut budget = shrink_to(&p.decide(&tight, ceiling, ceiling, ceiling));
        assert_eq!(budget, 768 * MIB, "a quarter beats the 104 MiB need");
        // Calm for 9 ticks: keep; the 10th grows by max(64 MiB, ceiling / 8) = 128 MiB.
        for _ in 0..9 {
            assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
        }
        let d = p.decide(&calm(), budget, budget, ceiling);
        assert_eq!(grow_to(&d), budget + 128 * MIB);
        assert!(reason(&d).starts_with("calm for 10 ticks"), "{d:?}");
        budget += 128 * MIB;
        // The next step needs another calm period.
        for _ in 0..9 {
            assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
        }
        budget = grow_to(&p.decide(&calm(), budget, budget, ceiling));
        assert_eq!(budget, 1024 * MIB, "the step stops at the ceiling");
        for _ in 0..20 {
            assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
        }
        // Pressure again: shrink, and the calm period restarts.
        budget = shrink_to(&p.decide(&tight, budget, budget, ceiling));
        assert_eq!(budget, 768 * MIB);
        for _ in 0..9 {
            assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
        }
        // Pressure on the 10th tick resets the count once more.
        assert_eq!(
            shrink_to(&p.decide(&fired(calm()), budget, budget, ceiling)),
            576 * MIB
        );
        budget = 576 * MIB;
        for _ in 0..9 {
            assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
        }
        assert_eq!(
            grow_to(&p.decide(&calm(), budget, budget, ceiling)),
            704 * MIB
        );
    }

    #[test]
    fn growth_stays_out_of_the_limit() {
        let mut p = Policy::new(PolicyConfig::default());
        // limit 1 GiB, watermark 64 MiB, usage 800 MiB: headroom 224 MiB, no pressure.
        let s = v2(800 * MIB, Some(GIB), None, (0, 0, 0));
        for _ in 0..9 {
            assert_eq!(p.decide(&s, 300 * MIB, 300 * MIB, GIB), Decision::Keep);
        }
        // used + headroom - 2 * watermark = 300 + 224 - 128 = 396 MiB < 300 + 128.
        let d = p.decide(&s, 300 * MIB, 300 * MIB, GIB);
        assert_eq!(grow_to(&d), 396 * MIB);
        assert!(reason(&d).contains("capped at 396 MiB"), "{d:?}");
        // At the cap there is nothing to grow.
        let mut p = Policy::new(PolicyConfig::default());
        for _ in 0..30 {
            assert_eq!(p.decide(&s, 396 * MIB, 300 * MIB, GIB), Decision::Keep);
        }
        // MemAvailable caps growth the same way.
        let host = Sample {
            meminfo: Some(MemInfo {
                total: 10 * GIB,
                available: 1200 * MIB,
            }),
            ..Sample::default()
        };
        let mut p = Policy::new(PolicyConfig::default());
        for _ in 0..9 {
            p.decide(&host, 100 * MIB, 100 * MIB, 4 * GIB);
        }
        let wm = 10 * GIB / 100 * 5;
        assert_eq!(
            grow_to(&p.decide(&host, 100 * MIB, 100 * MIB, 4 * GIB)),
            100 * MIB + 1200 * MIB - 2 * wm
        );
    }

    #[test]
    fn raised_ceiling_jumps_when_calm() {
        let mut p = Policy::new(PolicyConfig::default());
        assert_eq!(p.decide(&calm(), GIB, GIB, GIB), Decision::Keep);
        let d = p.decide(&calm(), GIB, GIB, 2 * GIB);
        assert_eq!(grow_to(&d), 2 * GIB);
        assert!(reason(&d).starts_with("ceiling raised by operator to 2048 MiB"));
        // Room caps the jump: limit 3 GiB (watermark 153.6 MiB), usage 2 GiB.
        let mut p = Policy::new(PolicyConfig::default());
        let s = v2(2 * GIB, Some(3 * GIB), None, (0, 0, 0));
        p.decide(&s, GIB, GIB, GIB);
        let cap = GIB + GIB - 2 * (3 * GIB / 100 * 5);
        assert_eq!(grow_to(&p.decide(&s, GIB, GIB, 4 * GIB)), cap);
        // After a recent shrink a raise waits for the calm period like any growth.
        let mut p = Policy::new(PolicyConfig::default());
        let budget = shrink_to(&p.decide(&fired(calm()), GIB, GIB, GIB));
        assert_eq!(p.decide(&calm(), budget, budget, 2 * GIB), Decision::Keep);
        // Pressure at the moment of the raise: no jump.
        let mut p = Policy::new(PolicyConfig::default());
        p.decide(&calm(), 0, 0, GIB);
        let mut s = calm();
        s.host_psi = psi(20.0);
        assert!(matches!(
            p.decide(&s, GIB, GIB, 2 * GIB),
            Decision::Shrink { .. }
        ));
    }

    #[test]
    fn v1_sequence() {
        let mut p = Policy::new(PolicyConfig::default());
        let limit = 256 * MIB;
        let ceiling = 512 * MIB;
        // A hog grows in a 256 MiB v1 cgroup: fine at 120 MiB.
        assert_eq!(
            p.decide(&v1(120 * MIB, limit, 0, 0), ceiling, 200 * MIB, ceiling),
            Decision::Keep
        );
        // At 210 MiB headroom is 46 MiB < 64 MiB: shrink by max(2*64-46, 200/4) = 82 MiB.
        let d = p.decide(&v1(210 * MIB, limit, 0, 0), ceiling, 200 * MIB, ceiling);
        assert_eq!(shrink_to(&d), 118 * MIB);
        assert!(reason(&d).starts_with("cgroup headroom 46 MiB < 64 MiB watermark"));
        // Limit hits (failcnt) and OOM kills, v1 names in the reason.
        let d = p.decide(&v1(100 * MIB, limit, 4, 1), 118 * MIB, 118 * MIB, ceiling);
        assert!(
            reason(&d).starts_with("v1 memory.failcnt +4; v1 memory.oom_control oom_kill +1"),
            "{d:?}"
        );
        let mut s = v1(100 * MIB, limit, 4, 1);
        s.triggers.v1_pressure_level = true;
        let d = p.decide(&s, 89 * MIB, 89 * MIB, ceiling);
        assert!(reason(&d).starts_with("v1 memory.pressure_level medium event"));
        let budget = shrink_to(&d);
        // Calm: growth is capped by the limit: used + 156 - 128.
        let s = v1(100 * MIB, limit, 4, 1);
        for _ in 0..9 {
            assert_eq!(p.decide(&s, budget, budget, ceiling), Decision::Keep);
        }
        assert_eq!(
            grow_to(&p.decide(&s, budget, budget, ceiling)),
            budget + 28 * MIB
        );
    }
}

/// The governor thread against live inputs.
#[cfg(test)]
mod live_tests {
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
