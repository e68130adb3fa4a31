//! Disk: idle mounted tenants hold little of it, and a full disk stops only the tenant on
//! it, until space is freed.

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
    let _guards: Vec<_> = names
        .iter()
        .map(|n| {
            let mp = h.dir(&format!("m-{n}"));
            h.ok(&["mount", n, mp.to_str().unwrap()]);
            h.guard(n, &mp, d.0.id())
        })
        .collect();
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
    let mut h = Host::new("diskfull").with_config("[store]\nwrite_buffers = \"16M\"\n");
    let (fs, _fs) = small_ext4(h.root(), 128 << 20);
    h.data = fs.join("data");
    h.ok(&["init"]);
    let names = ["a", "b", "c"];
    let mps: Vec<_> = names.iter().map(|n| h.dir(&format!("m{n}"))).collect();
    for n in names {
        h.create_tenant(n);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let _guards: Vec<_> = names
        .iter()
        .zip(&mps)
        .map(|(n, mp)| {
            h.ok(&["mount", n, mp.to_str().unwrap()]);
            h.guard(n, mp, pid)
        })
        .collect();
    let b_data = common::noise(2, 1 << 20);
    write_synced(&mps[1].join("kept"), &b_data);
    std::fs::create_dir(mps[2].join("dir")).unwrap();
    // Room to give back later.
    let ballast = fs.join("ballast");
    std::fs::write(&ballast, vec![1u8; 48 << 20]).unwrap();

    // a writes 1 MiB chunks, each synced, until the disk is full.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mps[0].join("big"))
        .unwrap();
    let chunk = |i: u64| common::noise(1000 + i, 1 << 20);
    let mut acked = 0u64;
    let err = loop {
        match f
            .write_all_at(&chunk(acked), acked << 20)
            .and_then(|()| f.sync_data())
        {
            Ok(()) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 1024, "the disk never filled up");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
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
