//! Clearing setuid and setgid when a file changes, by the kernel's rules (`fs/attr.c`,
//! `setattr_should_drop_suidgid` and `setattr_should_drop_sgid`), which a FUSE mount hands to
//! the filesystem (FUSE_HANDLE_KILLPRIV_V2: one round trip less per chown, and the write path
//! learns from the request whether its caller is privileged).
//!
//! Two rules, told apart by what changes:
//! - a **modification** (write, truncate, allocation) by a caller without CAP_FSETID clears
//!   setuid, and setgid when the file is group-executable or the caller is not in the file's
//!   group; a privileged caller clears nothing;
//! - a **change of owner or group** (chown, chgrp, even to the same ids) clears setuid
//!   whoever asks, and setgid when the file is group-executable or the caller is neither in
//!   the file's group nor privileged.
//!
//! Directories keep both bits in every case (setgid on a directory is inheritance, not
//! privilege). A setgid file that is not group-executable is the old mandatory-locking mark:
//! it keeps the bit when its own group (or a privileged caller) changes it.

use super::types::{Attr, FileKind};

/// The file capability xattr, which every write to a file drops (whoever writes), as a
/// change of owner does (that one the kernel removes itself, through REMOVEXATTR).
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Who asks for a change, as far as the rules need to know.
pub trait Caller {
    /// Holds CAP_FSETID.
    fn privileged(&self) -> bool;
    /// Is in group `gid` (its filesystem group or a supplementary one).
    fn in_group(&self, gid: u32) -> bool;
}

/// A change that may clear setuid and setgid.
#[derive(Clone, Copy)]
pub enum Clearing<'a> {
    /// Data or size changed (write, truncate, allocation).
    Modify(&'a dyn Caller),
    /// Owner or group set (chown, chgrp).
    Chown(&'a dyn Caller),
}

const SETUID: u16 = 0o4000;
const SETGID: u16 = 0o2000;
const GROUP_EXEC: u16 = 0o010;

/// Clears what `change` clears in `attr`; whether the mode changed.
pub(crate) fn clear(attr: &mut Attr, change: Clearing<'_>) -> bool {
    if attr.kind == FileKind::Dir || attr.perm & (SETUID | SETGID) == 0 {
        return false;
    }
    let before = attr.perm;
    let group_exec = attr.perm & GROUP_EXEC != 0;
    match change {
        Clearing::Modify(caller) => {
            if !caller.privileged() {
                attr.perm &= !SETUID;
                if attr.perm & SETGID != 0 && (group_exec || !caller.in_group(attr.gid)) {
                    attr.perm &= !SETGID;
                }
            }
        }
        Clearing::Chown(caller) => {
            attr.perm &= !SETUID;
            if attr.perm & SETGID != 0
                && (group_exec || !(caller.in_group(attr.gid) || caller.privileged()))
            {
                attr.perm &= !SETGID;
            }
        }
    }
    attr.perm != before
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Who {
        privileged: bool,
        groups: &'static [u32],
    }

    impl Caller for Who {
        fn privileged(&self) -> bool {
            self.privileged
        }
        fn in_group(&self, gid: u32) -> bool {
            self.groups.contains(&gid)
        }
    }

    fn attr(kind: FileKind, perm: u16, gid: u32) -> Attr {
        Attr {
            perm,
            uid: 1000,
            gid,
            ..Attr::for_tests(2, kind)
        }
    }

    fn after(kind: FileKind, perm: u16, gid: u32, change: Clearing<'_>) -> u16 {
        let mut a = attr(kind, perm, gid);
        let changed = clear(&mut a, change);
        assert_eq!(changed, a.perm != perm);
        a.perm
    }

    const MEMBER: Who = Who {
        privileged: false,
        groups: &[100],
    };
    const OUTSIDER: Who = Who {
        privileged: false,
        groups: &[200],
    };
    const ROOT: Who = Who {
        privileged: true,
        groups: &[0],
    };

    #[test]
    fn a_modification_by_an_unprivileged_caller_clears_setuid_and_executable_setgid() {
        let m = |perm, who: &Who| after(FileKind::File, perm, 100, Clearing::Modify(who));
        assert_eq!(m(0o6755, &MEMBER), 0o755);
        assert_eq!(
            m(0o6745, &MEMBER),
            0o2745,
            "mandatory-locking mark, own group"
        );
        assert_eq!(m(0o6745, &OUTSIDER), 0o745);
        assert_eq!(m(0o6755, &ROOT), 0o6755, "CAP_FSETID clears nothing");
        assert_eq!(m(0o755, &MEMBER), 0o755);
    }

    #[test]
    fn a_chown_clears_setuid_whoever_asks_and_every_kind_but_directories() {
        for kind in [
            FileKind::File,
            FileKind::Fifo,
            FileKind::Socket,
            FileKind::CharDev,
            FileKind::BlockDev,
        ] {
            let c = |perm, who: &Who| after(kind, perm, 100, Clearing::Chown(who));
            assert_eq!(c(0o6555, &MEMBER), 0o555, "{kind:?}");
            assert_eq!(c(0o6555, &ROOT), 0o555, "{kind:?}");
            assert_eq!(c(0o6545, &MEMBER), 0o2545, "{kind:?}");
            assert_eq!(c(0o6545, &ROOT), 0o2545, "{kind:?}");
            assert_eq!(c(0o6545, &OUTSIDER), 0o545, "{kind:?}");
        }
        let dir = |who: &Who| after(FileKind::Dir, 0o6755, 100, Clearing::Chown(who));
        assert_eq!(dir(&OUTSIDER), 0o6755);
    }
}
