//! Dormant mounts: a mount idle for `[store] close_idle_after_secs` closes its tenant's store
//! (its descriptors and memory go back), keeps the tenant locked and the mount alive, and the
//! next request finds everything as it was: files open in it, a file unlinked while open, the
//! usage, a quota changed meanwhile, and every byte after a remount.

use std::os::unix::fs::FileExt;

use super::*;

/// The daemon's open descriptors.
fn open_fds(pid: u32) -> usize {
    fd_targets(pid).len()
}

/// What the daemon's descriptors name.
fn fd_targets(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.display().to_string())
        .collect()
}

/// Waits up to 20 s for the mount of `tenant` to be dormant (`want`) or not; says whether it
/// is.
fn wait_dormant(h: &Host, tenant: &str, want: bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let dormant = mount_stats(h, tenant)["dormant"].as_bool().unwrap_or(false);
        if dormant == want || Instant::now() > deadline {
            return dormant == want;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A dormant mount holds one descriptor, its FUSE device: the tenant's lock is a record in
/// the data dir's one lock file, and the device is not kept twice. This is what lets 10,000
/// idle mounts fit a process limit of 20,000 descriptors.
#[test]
fn each_dormant_mount_holds_one_descriptor() {
    let h = Host::new("dormfds").with_config("[store]\nclose_idle_after_secs = 1\n");
    for t in ["a", "b", "c"] {
        h.create_tenant(t);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    // The first mount opens what all share (the lock file, the host's rings).
    let mut mounts = mount_each(&h, &d, &["a"]);
    assert!(wait_dormant(&h, "a", true));
    let before = fd_targets(pid);
    let one = before.len();
    mounts.extend(mount_each(&h, &d, &["b", "c"]));
    std::fs::write(h.dir("m-b").join("f"), b"x").unwrap();
    std::fs::write(h.dir("m-c").join("f"), b"x").unwrap();
    assert!(wait_dormant(&h, "b", true) && wait_dormant(&h, "c", true));
    // A closed store's last files go with the last thread that held it (a background job
    // that was ending as the mount rested): give them a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut three = open_fds(pid);
    while three > one + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        three = open_fds(pid);
    }
    let fuse = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter(|e| {
            std::fs::read_link(e.as_ref().unwrap().path())
                .is_ok_and(|l| l == std::path::Path::new("/dev/fuse"))
        })
        .count();
    let mut added = fd_targets(pid);
    for t in &before {
        if let Some(i) = added.iter().position(|a| a == t) {
            added.swap_remove(i);
        }
    }
    assert_eq!(
        three,
        one + 2,
        "two more dormant mounts: {one} -> {three} descriptors; new: {added:?}"
    );
    assert_eq!(fuse, 3, "FUSE devices open for 3 mounts");
    drop(mounts);
}

#[test]
fn an_idle_mount_closes_its_store_and_its_next_request_finds_everything_as_it_was() {
    let h = Host::new("dormant").with_config("[store]\nclose_idle_after_secs = 1\n");
    h.create_tenant("t");
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let _mounts = mount_each(&h, &d, &["t"]);
    let mp = h.dir("m-t");
    write_synced(&mp.join("kept"), b"kept across rests");
    let open = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mp.join("open"))
        .unwrap();
    open.write_all_at(b"open and unlinked", 0).unwrap();
    std::fs::remove_file(mp.join("open")).unwrap();
    let awake = mount_stats(&h, "t");
    let fds_awake = open_fds(pid);
    // The store's own files, counted apart from the daemon's other descriptors (sockets,
    // pipes), which come and go and could hide them.
    let store = h.data.join("tenants/t/db").display().to_string();
    let in_store = || {
        fd_targets(pid)
            .iter()
            .filter(|t| t.starts_with(&store))
            .count()
    };
    let store_awake = in_store();

    assert!(
        wait_dormant(&h, "t", true),
        "no rest: {}",
        mount_stats(&h, "t")
    );
    let dormant = mount_stats(&h, "t");
    let fds_dormant = open_fds(pid);
    eprintln!("daemon descriptors: {fds_awake} with the store open, {fds_dormant} dormant");
    let store_dormant = in_store();
    assert!(
        store_awake >= 2 && store_dormant == 0,
        "the dormant store's files are still open: {store_dormant} descriptors in {store}, \
         {store_awake} before ({fds_dormant} in all, {fds_awake} before)"
    );
    assert_eq!(dormant["usage"], awake["usage"], "{dormant}");
    assert!(dormant.get("store").is_none(), "{dormant}");
    assert!(h.ok(&["stats"]).contains("dormant"));
    // df answers from what the mount kept, and does not wake it.
    let df = nix::sys::statvfs::statvfs(&mp).unwrap();
    assert_eq!(
        mount_stats(&h, "t")["dormant"],
        true,
        "statfs woke the store"
    );
    assert!(df.blocks() > 0 && df.files() > df.files_available());
    // The kernel dropping its inodes forgets them: nothing to free, so the store stays closed.
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        mount_stats(&h, "t")["dormant"],
        true,
        "forgets woke the store"
    );
    // The tenant stays the daemon's: no other process takes its store meanwhile.
    let refused = h.fails(&["tenant", "delete", "t"]);
    assert!(refused.contains("in use"), "{refused}");

    // The file open and unlinked before the rest reads and writes as before.
    let mut buf = [0u8; 17];
    open.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"open and unlinked");
    open.write_all_at(b"OPEN", 0).unwrap();
    open.read_exact_at(&mut buf[..4], 0).unwrap();
    assert_eq!(&buf[..4], b"OPEN");
    assert!(wait_dormant(&h, "t", false));

    // A quota set while dormant is in force at once, in the record and in the mount.
    assert!(wait_dormant(&h, "t", true));
    h.ok(&["tenant", "set", "t", "--quota-bytes", "1M"]);
    let s = nix::sys::statvfs::statvfs(&mp).unwrap();
    assert_eq!(
        s.blocks() * s.fragment_size(),
        1 << 20,
        "df does not show the new quota"
    );
    let over = std::fs::write(mp.join("big"), vec![1u8; 2 << 20]).unwrap_err();
    assert_eq!(over.raw_os_error(), Some(libc::EDQUOT), "{over}");

    // Every byte is there after the file closes (it is freed), a rest and a remount.
    drop(open);
    assert!(wait_dormant(&h, "t", true));
    h.ok(&["umount", mp.to_str().unwrap()]);
    h.ok(&["mount", "t", mp.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(mp.join("kept")).unwrap(),
        b"kept across rests"
    );
    let names: Vec<_> = std::fs::read_dir(&mp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}"); // kept, and big (created; its write refused)
    assert_eq!(mount_stats(&h, "t")["quota"]["bytes"], 1 << 20);
}
