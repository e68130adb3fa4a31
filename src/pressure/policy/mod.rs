//! The governor's decision function: one tick's [`Sample`] in, keep / shrink / grow with a
//! reason out. Pure, so it is tested on fixture samples (`tests`); `governor` runs it on a
//! thread against live inputs.
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

use crate::units::ByteSize;

use super::signals::{CgroupState, MemInfo, PsiPair};
use super::watch::Triggers;

pub(super) const MIB: u64 = 1 << 20;

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
                        ByteSize(headroom).rounded(),
                        ByteSize(wm).rounded(),
                        ByteSize(cg.current).rounded(),
                        ByteSize(limit).rounded(),
                        ByteSize(cg.inactive_file).rounded()
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
                    ByteSize(m.available).rounded(),
                    ByteSize(wm).rounded()
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
                ByteSize(ceiling).rounded(),
                ByteSize(budget).rounded()
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
                            ByteSize(used).rounded(),
                            ByteSize(budget).rounded(),
                            ByteSize(budget - to).rounded()
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
                        ByteSize(ceiling).rounded(),
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
                        ByteSize(step).rounded(),
                        ByteSize(ceiling).rounded(),
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
        format!(
            ", capped at {} to keep 2x watermark headroom",
            ByteSize(to).rounded()
        )
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

#[cfg(test)]
mod tests;
