//! Memory pressure: the cache governor and the signals it reads.
//!
//! The host caches are the memory tenantfs can give back at once, so they yield first when
//! the host or the service's cgroup runs short. [`Governor`] owns their budget through
//! [`CacheBudget`]: a thread samples `signals` every interval (and at once when a PSI trigger
//! or a v1 `memory.pressure_level` event fires, see `watch`), asks the pure [`Policy`] for a
//! [`Decision`], shrinks the budget under pressure and grows it back towards the operator's
//! ceiling after a calm period, logging each decision with its reason.
//!
//! `signals` reads PSI (/proc/pressure/memory, a cgroup's memory.pressure), the process's
//! memory cgroup (v1 on this test machine, v2 on production hosts) and /proc/meminfo.

mod governor;
mod policy;
pub mod signals;
mod watch;

pub use governor::{CacheBudget, Governor, GovernorConfig, GovernorStats};
pub use policy::{Decision, Policy, PolicyConfig, Sample};
pub use signals::{CgroupMemory, CgroupState, MemInfo, Psi, PsiPair};
pub use watch::Triggers;
