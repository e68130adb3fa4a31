//! Disk: idle mounted tenants hold little of it, a tenant that grows to the host's reserve
//! gets ENOSPC alone while the others still write and its deletes go through, and a disk
//! filled by something else stops only the tenant that hit it, until space is freed.

use super::*;

/// An idle mounted tenant holds at most 1 MiB of disk beyond its data (its WAL and MANIFEST
/// are preallocated in small steps; they were 64 MiB and 4 MiB), and `tenant list` reports
/// the disk it really takes (allocated, not file sizes).
#[test]
fn idle_mounted_tenants_hold_little_disk() {
    let h = Host::new("idledisk");
    let names = ["i0", "i1", "i2"];
    for n in names {
        h.create_tenant(n);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let _guards = mount_each(&h, &d, &names);
    // One of them used once: 4 KiB written and synced.
    write_synced(&h.root().join("m-i2/f"), &[7u8; 4096]);
    for n in names {
        let bytes = h.disk_bytes(n);
        let allocated: u64 = walk_allocated(&h.data.join("tenants").join(n));
        assert_eq!(bytes, allocated, "tenant list must report allocated disk");
        assert!(
            bytes <= (1 << 20) + 4096,
            "idle mounted tenant {n} holds {bytes} bytes of disk"
        );
    }
}

/// A host whose data dir (with `tenants` in it) is on a loop-mounted ext4 of `bytes` of its
/// own, with `config`; the filesystem's root and its mount (drop it after the host's users).
fn on_small_disk(
    prefix: &str,
    config: &str,
    bytes: u64,
    tenants: &[&str],
) -> (Host, std::path::PathBuf, common::guards::FsMount) {
    let mut h = Host::new(prefix).with_config(config);
    let (fs, mount) = small_ext4(h.root(), bytes);
    h.data = fs.join("data");
    h.ok(&["init"]);
    for t in tenants {
        h.create_tenant(t);
    }
    (h, fs, mount)
}

/// Writes MiB `i` of a new file `path` as `chunk(i)` says, each synced, until ENOSPC (at most
/// `most` of them); returns the file and the MiB acknowledged.
fn write_until_enospc(
    path: &std::path::Path,
    chunk: impl Fn(u64) -> Vec<u8>,
    most: u64,
) -> (std::fs::File, u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    let mut acked = 0u64;
    let err = loop {
        match f
            .write_all_at(&chunk(acked), acked << 20)
            .and_then(|()| f.sync_data())
        {
            Ok(()) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < most, "{acked} MiB written, and no ENOSPC");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    (f, acked)
}

/// Allocated bytes (st_blocks) of the files under `dir`.
pub(super) fn walk_allocated(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk_allocated(&e.path())
            } else {
                m.blocks() * 512
            }
        })
        .sum()
}

/// A full disk is one tenant's error, never the daemon's end. The data dir is on a small
/// loop-mounted ext4 (the log elsewhere); tenant a writes until the disk is full: the daemon
/// stays up, b and c keep serving reads, a's writes fail with ENOSPC, `stats` shows a
/// read-only and every store still on O_DIRECT. Space is freed (a ballast file deleted): a
/// takes writes again by itself, without a remount, and every acknowledged write is there.
#[test]
fn a_full_disk_stops_one_tenant_until_space_is_freed() {
    // Memtables of at most 16 MiB: what a stopped store must write out to take writes again.
    // No reserve: the disk itself fills (as when something else fills it).
    let (h, fs, _fs) = on_small_disk(
        "diskfull",
        "[store]\nwrite_buffers = \"16M\"\nreserve = \"0\"\n",
        128 << 20,
        &["a", "b", "c"],
    );
    let names = ["a", "b", "c"];
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let guards = mount_each(&h, &d, &names);
    let mps: Vec<_> = guards.iter().map(|g| g.path.clone()).collect();
    let b_data = common::noise(2, 1 << 20);
    write_synced(&mps[1].join("kept"), &b_data);
    std::fs::create_dir(mps[2].join("dir")).unwrap();
    // Room to give back later.
    let ballast = fs.join("ballast");
    std::fs::write(&ballast, vec![1u8; 48 << 20]).unwrap();

    // a writes 1 MiB chunks, each synced, until the disk is full.
    use std::os::unix::fs::FileExt;
    let chunk = |i: u64| common::noise(1000 + i, 1 << 20);
    let (f, mut acked) = write_until_enospc(&mps[0].join("big"), chunk, 1024);
    assert!(acked > 10, "only {acked} MiB acknowledged");
    assert!(alive(pid), "the daemon died on a full disk");
    // The others keep serving reads; a still refuses writes.
    assert_eq!(std::fs::read(mps[1].join("kept")).unwrap(), b_data);
    assert!(mps[2].join("dir").is_dir());
    assert_eq!(std::fs::read_dir(&mps[2]).unwrap().count(), 1);
    let again = f
        .write_all_at(&[9u8; 4096], acked << 20)
        .and_then(|()| f.sync_data())
        .expect_err("a wrote to a full disk");
    assert_eq!(again.raw_os_error(), Some(libc::ENOSPC), "{again}");
    let a = mount_stats(&h, "a");
    assert_eq!(a["store"]["state"], "no_space", "{a}");
    for n in names {
        assert_eq!(
            mount_stats(&h, n)["direct_io"],
            true,
            "{n} fell back to buffered I/O"
        );
    }
    let table = h.ok(&["stats"]);
    assert!(table.contains("tenant a is read-only"), "{table}");
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(!log.contains("buffered I/O"), "{log}");
    assert_eq!(log.matches("tenant is read-only").count(), 1, "{log}");

    // Space comes back: a takes writes again without a remount.
    std::fs::remove_file(&ballast).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = f
            .write_all_at(&chunk(acked), acked << 20)
            .and_then(|()| f.sync_data());
        if ok.is_ok() {
            acked += 1;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a takes no writes 30 s after space was freed: {ok:?}; stats: {}",
            mount_stats(&h, "a")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(mount_stats(&h, "a")["store"]["state"], "writable");
    let mut back = vec![0u8; 1 << 20];
    for i in 0..acked {
        f.read_exact_at(&mut back, i << 20).unwrap();
        assert!(
            back == chunk(i),
            "acknowledged MiB {i} of a is not what was written"
        );
    }
}

/// The host reserve: the data dir is on a 256 MiB loop ext4 with `reserve = "64M"`. Tenant a
/// writes 1 MiB chunks, each synced, until ENOSPC: it stops with the reserve still free, and
/// its store never saw a full disk (it stays writable). b, holding less, still writes; a
/// still deletes, truncates and overwrites; nothing acknowledged is lost.
#[test]
fn a_tenant_at_the_host_reserve_gets_enospc_alone_and_can_delete() {
    let (h, fs, _fs) = on_small_disk(
        "reserve",
        "[store]\nwrite_buffers = \"16M\"\nreserve = \"64M\"\n",
        256 << 20,
        &["a", "b"],
    );
    let d = start_daemon(&h, &h.root().join("notify"));
    let guards = mount_each(&h, &d, &["a", "b"]);
    let (ma, mb) = (guards[0].path.clone(), guards[1].path.clone());
    write_synced(&mb.join("small"), &common::noise(3, 1 << 20));
    write_synced(&ma.join("early"), &common::noise(5, 64 << 10));

    use std::os::unix::fs::FileExt;
    let chunk = |i: u64| common::noise(2000 + i, 1 << 20);
    let (f, mut acked) = write_until_enospc(&ma.join("big"), chunk, 256);
    let free = nix::sys::statvfs::statvfs(&fs).unwrap();
    let free = free.blocks_available() * free.fragment_size();
    eprintln!("a stopped after {acked} MiB with {} MiB free", free >> 20);
    assert!(acked > 64, "only {acked} MiB acknowledged");
    assert!(
        free >= 56 << 20,
        "a ran into the reserve: {free} bytes free"
    );
    assert_eq!(mount_stats(&h, "a")["store"]["state"], "writable");
    // b holds less: it still grows, and a's refusal did not touch it.
    write_synced(&mb.join("more"), &common::noise(4, 4 << 20));
    assert_eq!(mount_stats(&h, "b")["store"]["state"], "writable");
    // a still deletes, truncates and overwrites in place: none of that grows it.
    assert_eq!(
        std::fs::write(ma.join("new"), b"x")
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOSPC),
        "a grew past the floor"
    );
    std::fs::remove_file(ma.join("early")).unwrap();
    acked -= 8;
    f.set_len(acked << 20).unwrap();
    f.write_all_at(&chunk(0), 0).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; 1 << 20];
    for i in 0..acked {
        f.read_exact_at(&mut back, i << 20).unwrap();
        assert!(
            back == chunk(i),
            "acknowledged MiB {i} of a is not what was written"
        );
    }
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap_or_default();
    assert!(!log.contains("tenant is read-only"), "{log}");
}
