//! Reading the host's memory-pressure signals: PSI, the process's memory cgroup (v1 or v2)
//! and MemAvailable. Parsers take text so they are tested on fixtures; `read_*` functions take
//! the files from the live system.
//!
//! cgroup v2 (production hosts): `memory.current`, `memory.high`, `memory.max` ("max" means
//! no limit), `memory.events` (`high`, `max`, `oom`, `oom_kill` counts), `memory.pressure`
//! (PSI of the cgroup). cgroup v1 (this test machine): `memory.usage_in_bytes`,
//! `memory.limit_in_bytes` (a huge number means no limit), `memory.failcnt` (times usage hit
//! the limit: v1's counterpart of the v2 `max` event) and `memory.oom_control` (`oom_kill`).

use std::path::{Path, PathBuf};

/// One PSI line: the share of time some (or all) tasks stalled on memory.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Psi {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time in microseconds.
    pub total_us: u64,
}

/// The `some` and `full` lines of a PSI file.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiPair {
    pub some: Psi,
    pub full: Psi,
}

/// Where the process's memory cgroup is and which interface it speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupMemory {
    V1(PathBuf),
    V2(PathBuf),
}

/// A cgroup's memory state, whatever the version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupState {
    pub current: u64,
    /// The hard limit (v2 memory.max, v1 limit_in_bytes); `None` when unlimited.
    pub max: Option<u64>,
    /// The throttling threshold (v2 memory.high); `None` when unset or on v1.
    pub high: Option<u64>,
    /// Times the cgroup went over `high` and hit `max` (v2 memory.events; v1 has no `high`
    /// and counts limit hits in memory.failcnt).
    pub high_events: u64,
    pub max_events: u64,
    /// OOM events (v2 memory.events `oom`; v1 memory.oom_control `oom_kill`).
    pub oom_events: u64,
    /// Inactive file pages (memory.stat `inactive_file`, v1 `total_inactive_file`): page
    /// cache the kernel reclaims before it runs out, counted in `current` all the same.
    pub inactive_file: u64,
}

impl CgroupState {
    /// Usage the cgroup cannot shed by reclaiming inactive page cache.
    pub fn unreclaimable(&self) -> u64 {
        self.current.saturating_sub(self.inactive_file)
    }
}

/// Total and available memory of the host (/proc/meminfo), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub available: u64,
}

/// Limits at or above this are "no limit" (v1 reports PAGE_COUNTER_MAX * page size).
const UNLIMITED: u64 = 1 << 62;

fn parse_psi_line(line: &str) -> Option<(&str, Psi)> {
    let mut parts = line.split_whitespace();
    let kind = parts.next()?;
    let mut psi = Psi::default();
    for field in parts {
        let (k, v) = field.split_once('=')?;
        match k {
            "avg10" => psi.avg10 = v.parse().ok()?,
            "avg60" => psi.avg60 = v.parse().ok()?,
            "avg300" => psi.avg300 = v.parse().ok()?,
            "total" => psi.total_us = v.parse().ok()?,
            _ => {}
        }
    }
    Some((kind, psi))
}

/// Parses /proc/pressure/memory or a cgroup's memory.pressure.
pub fn parse_psi(text: &str) -> Option<PsiPair> {
    let mut pair = PsiPair::default();
    let mut seen_some = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_psi_line(line)? {
            ("some", p) => {
                pair.some = p;
                seen_some = true;
            }
            ("full", p) => pair.full = p,
            _ => return None,
        }
    }
    seen_some.then_some(pair)
}

/// Parses a limit file: a byte count, or "max" (v2) / a huge number (v1) for none.
pub fn parse_limit(text: &str) -> Option<Option<u64>> {
    let t = text.trim();
    if t == "max" {
        return Some(None);
    }
    let v: u64 = t.parse().ok()?;
    Some((v < UNLIMITED).then_some(v))
}

/// The value of a `key value` line (memory.events, memory.oom_control, memory.stat).
pub fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        (it.next()? == key).then(|| it.next()?.parse().ok())?
    })
}

/// Parses v2 memory.events into (high, max) counts.
pub fn parse_events(text: &str) -> Option<(u64, u64)> {
    Some((parse_keyed(text, "high")?, parse_keyed(text, "max")?))
}

/// Parses MemAvailable (bytes) out of /proc/meminfo.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kib| kib * 1024)
}

/// Parses MemTotal and MemAvailable out of /proc/meminfo.
pub fn parse_meminfo(meminfo: &str) -> Option<MemInfo> {
    let kib = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kib| kib * 1024)
    };
    Some(MemInfo {
        total: kib("MemTotal:")?,
        available: kib("MemAvailable:")?,
    })
}

/// Finds the memory cgroup in /proc/self/cgroup text, given the cgroup mount root: a v1
/// `memory` controller line wins; otherwise the v2 unified line (`0::/path`).
pub fn parse_cgroup_membership(text: &str, root: &Path) -> Option<CgroupMemory> {
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            return Some(CgroupMemory::V1(root.join("memory").join(rel)));
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(CgroupMemory::V2(root.join(rel)));
        }
    }
    v2
}

fn read(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path)
}

fn bad(path: &Path) -> std::io::Error {
    std::io::Error::other(format!("{}: unexpected content", path.display()))
}

impl CgroupMemory {
    /// The memory cgroup of this process on the live system.
    pub fn of_self() -> std::io::Result<Option<Self>> {
        Ok(parse_cgroup_membership(
            &read(Path::new("/proc/self/cgroup"))?,
            Path::new("/sys/fs/cgroup"),
        ))
    }

    pub fn dir(&self) -> &Path {
        match self {
            CgroupMemory::V1(p) | CgroupMemory::V2(p) => p,
        }
    }

    /// Reads the cgroup's state from its files.
    pub fn state(&self) -> std::io::Result<CgroupState> {
        let dir = self.dir();
        let number = |name: &str| -> std::io::Result<u64> {
            let p = dir.join(name);
            read(&p)?.trim().parse().map_err(|_| bad(&p))
        };
        let limit = |name: &str| -> std::io::Result<Option<u64>> {
            let p = dir.join(name);
            parse_limit(&read(&p)?).ok_or_else(|| bad(&p))
        };
        match self {
            CgroupMemory::V1(_) => Ok(CgroupState {
                current: number("memory.usage_in_bytes")?,
                max: limit("memory.limit_in_bytes")?,
                // Counters only: a kernel without them (oom_kill is 4.13+) reads as zero.
                max_events: number("memory.failcnt").unwrap_or(0),
                oom_events: read(&dir.join("memory.oom_control"))
                    .ok()
                    .and_then(|t| parse_keyed(&t, "oom_kill"))
                    .unwrap_or(0),
                inactive_file: read(&dir.join("memory.stat"))
                    .ok()
                    .and_then(|t| parse_keyed(&t, "total_inactive_file"))
                    .unwrap_or(0),
                ..CgroupState::default()
            }),
            CgroupMemory::V2(_) => {
                let events = dir.join("memory.events");
                let text = read(&events)?;
                let (high_events, max_events) = parse_events(&text).ok_or_else(|| bad(&events))?;
                Ok(CgroupState {
                    current: number("memory.current")?,
                    max: limit("memory.max")?,
                    high: limit("memory.high")?,
                    high_events,
                    max_events,
                    oom_events: parse_keyed(&text, "oom").unwrap_or(0),
                    inactive_file: read(&dir.join("memory.stat"))
                        .ok()
                        .and_then(|t| parse_keyed(&t, "inactive_file"))
                        .unwrap_or(0),
                })
            }
        }
    }
}

/// Host-wide memory PSI from /proc/pressure/memory.
pub fn read_host_psi() -> std::io::Result<PsiPair> {
    let p = Path::new("/proc/pressure/memory");
    parse_psi(&read(p)?).ok_or_else(|| bad(p))
}

/// MemAvailable from /proc/meminfo.
pub fn read_mem_available() -> std::io::Result<u64> {
    let p = Path::new("/proc/meminfo");
    parse_mem_available(&read(p)?).ok_or_else(|| bad(p))
}

/// MemTotal and MemAvailable from /proc/meminfo.
pub fn read_meminfo() -> std::io::Result<MemInfo> {
    let p = Path::new("/proc/meminfo");
    parse_meminfo(&read(p)?).ok_or_else(|| bad(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_fixture() {
        let t = "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\n\
                 full avg10=0.75 avg60=0.00 avg300=0.00 total=654\n";
        let p = parse_psi(t).unwrap();
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.total_us, 123456);
        assert_eq!(p.full.avg10, 0.75);
        assert!(parse_psi("bogus avg10=1").is_none());
        assert!(parse_psi("").is_none());
    }

    #[test]
    fn v2_fixtures() {
        assert_eq!(parse_limit("max\n"), Some(None));
        assert_eq!(parse_limit("1073741824\n"), Some(Some(1 << 30)));
        assert_eq!(
            parse_limit("9223372036854771712\n"),
            Some(None),
            "v1 unlimited"
        );
        assert_eq!(parse_limit("lots"), None);
        let events = "low 0\nhigh 17\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_events(events), Some((17, 3)));
        assert_eq!(parse_events("low 0\n"), None);
        assert_eq!(parse_keyed(events, "oom"), Some(1));
        assert_eq!(parse_keyed(events, "oom_kill"), Some(1));
        assert_eq!(parse_keyed(events, "missing"), None);
    }

    #[test]
    fn v1_cgroup_dir_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let w = |n: &str, v: &str| std::fs::write(dir.path().join(n), v).unwrap();
        w("memory.usage_in_bytes", "209715200\n");
        w("memory.limit_in_bytes", "268435456\n");
        w("memory.failcnt", "7\n");
        w(
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        let s = CgroupMemory::V1(dir.path().to_owned()).state().unwrap();
        assert_eq!(
            s,
            CgroupState {
                current: 200 << 20,
                max: Some(256 << 20),
                high: None,
                high_events: 0,
                max_events: 7,
                oom_events: 2,
                inactive_file: 0,
            }
        );
        w(
            "memory.stat",
            "cache 10\ninactive_file 5\ntotal_inactive_file 4096\n",
        );
        let s = CgroupMemory::V1(dir.path().to_owned()).state().unwrap();
        assert_eq!(
            (s.inactive_file, s.unreclaimable()),
            (4096, (200 << 20) - 4096)
        );
        // Counters are optional; usage and limit are not.
        std::fs::remove_file(dir.path().join("memory.failcnt")).unwrap();
        std::fs::remove_file(dir.path().join("memory.oom_control")).unwrap();
        let s = CgroupMemory::V1(dir.path().to_owned()).state().unwrap();
        assert_eq!((s.max_events, s.oom_events), (0, 0));
        std::fs::remove_file(dir.path().join("memory.usage_in_bytes")).unwrap();
        assert!(CgroupMemory::V1(dir.path().to_owned()).state().is_err());
    }

    #[test]
    fn v2_cgroup_dir_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let w = |n: &str, v: &str| std::fs::write(dir.path().join(n), v).unwrap();
        w("memory.current", "536870912\n");
        w("memory.max", "1073741824\n");
        w("memory.high", "max\n");
        w("memory.events", "low 0\nhigh 0\nmax 2\noom 0\noom_kill 0\n");
        let s = CgroupMemory::V2(dir.path().to_owned()).state().unwrap();
        assert_eq!(
            s,
            CgroupState {
                current: 512 << 20,
                max: Some(1 << 30),
                high: None,
                high_events: 0,
                max_events: 2,
                oom_events: 0,
                inactive_file: 0,
            }
        );
        w("memory.stat", "anon 100\nfile 300\ninactive_file 200\n");
        assert_eq!(
            CgroupMemory::V2(dir.path().to_owned())
                .state()
                .unwrap()
                .inactive_file,
            200
        );
        w("memory.current", "garbage");
        let e = CgroupMemory::V2(dir.path().to_owned()).state().unwrap_err();
        assert!(e.to_string().contains("memory.current"), "{e}");
    }

    #[test]
    fn membership() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = "4:memory:/process_api/abc\n0::/\n";
        assert_eq!(
            parse_cgroup_membership(v1, root),
            Some(CgroupMemory::V1(PathBuf::from(
                "/sys/fs/cgroup/memory/process_api/abc"
            )))
        );
        let v2 = "0::/system.slice/tenantfs.service\n";
        assert_eq!(
            parse_cgroup_membership(v2, root),
            Some(CgroupMemory::V2(PathBuf::from(
                "/sys/fs/cgroup/system.slice/tenantfs.service"
            )))
        );
        assert_eq!(
            parse_mem_available("MemTotal: 10 kB\nMemAvailable:  2048 kB\n"),
            Some(2 << 20)
        );
        assert_eq!(
            parse_meminfo("MemTotal: 10 kB\nMemFree: 1 kB\nMemAvailable:  2048 kB\n"),
            Some(MemInfo {
                total: 10 << 10,
                available: 2 << 20
            })
        );
        assert_eq!(parse_meminfo("MemTotal: 10 kB\n"), None);
    }
}
