//! Memory pressure: the inputs a governor uses to shrink and regrow the host caches.
//!
//! `signals` reads PSI (/proc/pressure/memory, a cgroup's memory.pressure), the process's
//! memory cgroup (v1 on this test machine, v2 on production hosts) and MemAvailable. The
//! governor that turns them into budget decisions is the next step of issue 4.

pub mod signals;

pub use signals::{CgroupMemory, CgroupState, Psi, PsiPair};
