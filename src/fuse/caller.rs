//! The process behind a request, as far as clearing setuid and setgid needs to know it (see
//! `volume::privileges`): whether it holds CAP_FSETID, and whether it is in a group. The
//! request header names its thread and filesystem group; the rest (supplementary groups,
//! effective capabilities) is read from `/proc/<tid>/status`, and only when a rule asks: a
//! setgid file that is not group-executable, or a chown whose caller's privilege matters.
//! When the kernel already said the caller is unprivileged (FUSE_WRITE_KILL_SUIDGID,
//! FATTR_KILL_SUIDGID on a truncate), that is taken as it is. A thread that is gone, or a
//! request the kernel sent on its own (pid 0), counts as unprivileged and in no other group:
//! the rules then clear the bits, the safe side; so does a process in another user namespace
//! (a container's root), whose capabilities are not the initial namespace's. Also which
//! thread the kernel last removed a file capability for ([`CapabilityRemovals`]).

use std::cell::OnceCell;
use std::collections::VecDeque;
use std::sync::Mutex;

use crate::volume::Caller;

/// CAP_FSETID's bit in the capability sets (`linux/capability.h`).
const CAP_FSETID: u32 = 4;

/// A request's caller.
pub(crate) struct RequestCaller {
    pid: u32,
    fsgid: u32,
    /// The kernel said it lacks CAP_FSETID.
    unprivileged: bool,
    status: OnceCell<Option<Status>>,
}

/// What `/proc/<tid>/status` says of a thread's groups and capabilities.
#[derive(Debug, PartialEq, Eq)]
struct Status {
    groups: Vec<u32>,
    effective_caps: u64,
}

/// Whether thread `pid` is in this process's user namespace. Capabilities count only there:
/// the kernel asks for CAP_FSETID in the initial namespace, where the daemon runs, and a
/// container's root holds its capabilities in a namespace of its own.
fn in_our_user_namespace(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user")).ok();
    matches!((ns(&pid.to_string()), ns("self")), (Some(theirs), Some(ours)) if theirs == ours)
}

impl RequestCaller {
    /// The caller of a request from thread `pid` with filesystem group `fsgid`.
    pub(crate) fn new(pid: u32, fsgid: u32) -> Self {
        Self {
            pid,
            fsgid,
            unprivileged: false,
            status: OnceCell::new(),
        }
    }

    /// The same, known to lack CAP_FSETID (the kernel flagged the request so).
    pub(crate) fn unprivileged(pid: u32, fsgid: u32) -> Self {
        Self {
            unprivileged: true,
            ..Self::new(pid, fsgid)
        }
    }

    fn status(&self) -> Option<&Status> {
        self.status
            .get_or_init(|| {
                if self.pid == 0 {
                    return None;
                }
                let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
                let mut status = parse_status(&text)?;
                if !in_our_user_namespace(self.pid) {
                    status.effective_caps = 0;
                }
                Some(status)
            })
            .as_ref()
    }
}

impl Caller for RequestCaller {
    fn privileged(&self) -> bool {
        !self.unprivileged
            && self
                .status()
                .is_some_and(|s| s.effective_caps & (1 << CAP_FSETID) != 0)
    }

    fn in_group(&self, gid: u32) -> bool {
        gid == self.fsgid || self.status().is_some_and(|s| s.groups.contains(&gid))
    }
}

/// Capability removals remembered at once: each is taken by the SETATTR its thread sends
/// right after it.
const CAPABILITY_REMOVALS: usize = 64;

/// The kernel's removals of a file capability (REMOVEXATTR of `security.capability`), each
/// with the thread that asked, until that thread's next SETATTR of the inode: an empty one
/// is that removal's, a privileged writer's that clears nothing else (see `dispatch`). A few
/// at most; the oldest go first.
#[derive(Default)]
pub(crate) struct CapabilityRemovals(Mutex<VecDeque<(u64, u32)>>);

impl CapabilityRemovals {
    /// The kernel removed `ino`'s file capability for thread `pid`.
    pub(crate) fn note(&self, ino: u64, pid: u32) {
        let mut noted = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !noted.contains(&(ino, pid)) {
            if noted.len() == CAPABILITY_REMOVALS {
                noted.pop_front();
            }
            noted.push_back((ino, pid));
        }
    }

    /// Whether the kernel removed `ino`'s file capability for `pid` since that thread's last
    /// SETATTR of it; forgotten then (call it once for each SETATTR).
    pub(crate) fn take(&self, ino: u64, pid: u32) -> bool {
        let mut noted = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match noted.iter().position(|n| *n == (ino, pid)) {
            Some(i) => noted.remove(i).is_some(),
            None => false,
        }
    }
}

fn parse_status(text: &str) -> Option<Status> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let groups = field("Groups:")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<Vec<u32>, _>>()
        .ok()?;
    let effective_caps = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    Some(Status {
        groups,
        effective_caps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_groups_and_effective_capabilities() {
        let text = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n\
                    Groups:\t4 27 100 \nCapInh:\t0000000000000000\nCapPrm:\t0000000000000010\n\
                    CapEff:\t0000000000000010\n";
        assert_eq!(
            parse_status(text),
            Some(Status {
                groups: vec![4, 27, 100],
                effective_caps: 0x10,
            })
        );
        assert_eq!(
            parse_status("Groups:\t\nCapEff:\t0\n").map(|s| s.groups),
            Some(vec![])
        );
        assert_eq!(parse_status("Groups:\tx\nCapEff:\t0\n"), None);
    }

    #[test]
    fn a_capability_removal_is_taken_once_by_its_own_thread() {
        let r = CapabilityRemovals::default();
        r.note(7, 100);
        assert!(!r.take(7, 101), "another thread's SETATTR");
        assert!(!r.take(8, 100), "another inode");
        assert!(r.take(7, 100));
        assert!(!r.take(7, 100), "taken already");
        for ino in 0..=CAPABILITY_REMOVALS as u64 {
            r.note(ino, 1);
        }
        assert!(!r.take(0, 1), "the oldest went first");
        assert!(r.take(CAPABILITY_REMOVALS as u64, 1));
    }

    #[test]
    fn capabilities_held_in_another_user_namespace_do_not_count() {
        // Root of a user namespace of its own: every capability there, none here.
        let mut child = std::process::Command::new("unshare")
            .args(["--user", "--map-root-user", "sleep", "30"])
            .spawn()
            .expect("unshare (util-linux) runs");
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while in_our_user_namespace(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let caps = parse_status(&text).unwrap().effective_caps;
        let left = !in_our_user_namespace(pid);
        let privileged = RequestCaller::new(pid, 0).privileged();
        let _ = child.kill();
        let _ = child.wait();
        assert!(left, "the child never left our user namespace");
        assert_ne!(
            caps & (1 << CAP_FSETID),
            0,
            "it holds CAP_FSETID in its namespace"
        );
        assert!(!privileged);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = std::process::id();
        let gid = nix::unistd::getegid().as_raw();
        let caller = RequestCaller::new(me, gid);
        assert!(caller.in_group(gid));
        // The tests run as root with every capability (make test); a non-root run has none.
        assert_eq!(caller.privileged(), nix::unistd::geteuid().is_root());
        assert!(!RequestCaller::unprivileged(me, gid).privileged());
        // A thread that does not exist: unprivileged, in its own group only.
        let gone = RequestCaller::new(0, 5);
        assert!(!gone.privileged() && gone.in_group(5) && !gone.in_group(6));
    }
}
