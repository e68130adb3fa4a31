//! What the mount's INIT handshake hands from the kernel to the daemon, checked the one way
//! that catches a round-trip optimisation changing a semantic: the same script runs on a local
//! ext4 and on a mount, and every line it prints must be the same on both.
//! `privileges.py`: setuid, setgid and file capabilities cleared by chown, chgrp, write,
//! truncate and allocation, by owner, other users and root, with and without the
//! group-execute bit, on every kind of node (FUSE_HANDLE_KILLPRIV_V2). `handed_over.py`:
//! listings' attributes (FUSE_DO_READDIRPLUS), races in one directory
//! (FUSE_PARALLEL_DIROPS), parallel direct I/O (FUSE_ASYNC_DIO, FUSE_ASYNC_READ) and shared
//! mappings of direct-I/O files (FUSE_DIRECT_IO_ALLOW_MMAP). Each runs on a mount with the
//! default page-cache bypass over the default transport, and on one with the kernel's page
//! cache over /dev/fuse.

use super::*;
use crate::common::guards::small_ext4;

const PRIVILEGES_PY: &str = include_str!("privileges.py");
const HANDED_OVER_PY: &str = include_str!("handed_over.py");

/// The mounts each script runs on (`-o` options).
const MOUNTS: [&str; 2] = ["", "cache=kernel,transport=dev"];

fn run_script(script: &str, dir: &Path) -> String {
    check(cmd("python3", &["-c", script]).arg(dir))
}

/// Runs `script` in a directory on a local ext4, then in one on each of [`MOUNTS`], and
/// asserts every mount printed what ext4 did.
fn same_as_ext4(name: &str, script: &str) {
    let h = Host::new(name);
    h.create_tenant("t");
    // A fresh ext4 of its own, mounted with setuid and exec allowed, whatever /var/tmp is.
    let (local, _ext4) = small_ext4(&h.dir("reference"), 256 << 20);
    let want = run_script(script, &local);
    assert!(
        want.lines().count() > 10,
        "the script printed too little:\n{want}"
    );
    let mnt = h.dir("mnt");
    for options in MOUNTS {
        let m = h.mount("t", &mnt, options);
        let dir = mnt.join(format!("run{}", options.len()));
        std::fs::create_dir(&dir).unwrap();
        let got = run_script(script, &dir);
        m.umount();
        let differ: Vec<String> = want
            .lines()
            .zip(got.lines())
            .filter(|(w, g)| w != g)
            .map(|(w, g)| format!("  host:  {w}\n  mount: {g}"))
            .collect();
        assert!(
            differ.is_empty() && want.lines().count() == got.lines().count(),
            "mounted with -o '{options}': {} of {} lines differ from ext4 \
             ({} lines on the mount), the first:\n{}",
            differ.len(),
            want.lines().count(),
            got.lines().count(),
            differ[..differ.len().min(30)].join("\n")
        );
    }
}

#[test]
fn setuid_setgid_and_capabilities_are_cleared_as_on_ext4() {
    same_as_ext4("privileges", PRIVILEGES_PY);
}

#[test]
fn listings_races_parallel_direct_io_and_mappings_are_as_on_ext4() {
    same_as_ext4("handed-over", HANDED_OVER_PY);
}
