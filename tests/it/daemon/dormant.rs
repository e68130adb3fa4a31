//! Dormant mounts: a mount idle for `[store] close_idle_after_secs` closes its tenant's store
//! (its descriptors and memory go back), keeps the tenant locked and the mount alive, and the
//! next request finds everything as it was: files open in it, a file unlinked while open, the
//! usage, a quota changed meanwhile, and every byte after a remount.

use std::os::unix::fs::FileExt;

use super::*;

/// The daemon's open descriptors.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
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

    assert!(
        wait_dormant(&h, "t", true),
        "no rest: {}",
        mount_stats(&h, "t")
    );
    let dormant = mount_stats(&h, "t");
    let fds_dormant = open_fds(pid);
    eprintln!("daemon descriptors: {fds_awake} with the store open, {fds_dormant} dormant");
    assert!(
        fds_dormant + 4 <= fds_awake,
        "the dormant store's files are still open: {fds_dormant} descriptors, {fds_awake} before"
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
