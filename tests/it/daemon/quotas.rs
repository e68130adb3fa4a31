//! A tenant's quota through the real binary and a real mount: a write or create past it fails
//! with EDQUOT and changes nothing, `df` inside the mount shows the tenant's own numbers, a
//! quota lowered below what the files take refuses growth but lets deletes and truncates
//! through, the counts are exact after kill -9 and after a clean unmount, and bad input is
//! refused with a clear error.

use super::*;

/// Runs `script` (Python) with the mountpoint as `sys.argv[1]`; returns what it prints.
fn py(mp: &std::path::Path, script: &str) -> String {
    check(&mut cmd("python3", &["-c", script, mp.to_str().unwrap()]))
}

/// What `stats` says the tenant's files take: (bytes, inodes).
fn usage(h: &Host, tenant: &str) -> (u64, u64) {
    let m = mount_stats(h, tenant);
    (
        m["usage"]["bytes"].as_u64().unwrap(),
        m["usage"]["inodes"].as_u64().unwrap(),
    )
}

/// `df`'s numbers inside the mount: (size, used, files, files used), in bytes and inodes.
fn df(mp: &std::path::Path) -> (u64, u64, u64, u64) {
    let s = nix::sys::statvfs::statvfs(mp).unwrap();
    let frsize = s.fragment_size();
    (
        s.blocks() * frsize,
        (s.blocks() - s.blocks_free()) * frsize,
        s.files(),
        s.files() - s.files_free(),
    )
}

/// Appends `n` KiB of `byte` to `name`: "ok" or the errno's name.
const APPEND: &str = r#"
import errno, os, sys
path, n, byte = os.path.join(sys.argv[1], sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
try:
    os.write(fd, bytes([byte]) * (n << 10))
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
finally:
    os.close(fd)
"#;

fn append(mp: &std::path::Path, name: &str, kib: u64, byte: u8) -> String {
    check(&mut cmd(
        "python3",
        &[
            "-c",
            APPEND,
            mp.to_str().unwrap(),
            name,
            &kib.to_string(),
            &byte.to_string(),
        ],
    ))
    .trim()
    .to_owned()
}

#[test]
fn a_quota_stops_writes_and_creates_before_anything_changes() {
    let h = Host::new("quota");
    h.ok(&[
        "tenant",
        "create",
        "t",
        "--quota-bytes",
        "1M",
        "--quota-inodes",
        "6",
    ]);
    let mp = h.dir("m");
    let notify = h.root().join("notify");
    let mut d = start_daemon(&h, &notify);
    let mount = |d: &common::guards::Daemon| {
        h.ok(&["mount", "t", mp.to_str().unwrap()]);
        h.guard("t", &mp, d.0.id())
    };
    let m = mount(&d);
    // df shows the quota, not the host: 1 MiB, 6 inodes, the root one of them.
    assert_eq!(df(&mp), (1 << 20, 0, 6, 1));

    assert_eq!(append(&mp, "f", 512, 1), "ok");
    assert_eq!(usage(&h, "t"), (512 << 10, 2));
    // 512 KiB more would pass 1 MiB by one block's worth of a 4 KiB tail: refused whole.
    assert_eq!(append(&mp, "f", 516, 2), "EDQUOT");
    let f = std::fs::read(mp.join("f")).unwrap();
    assert!(
        f.len() == 512 << 10 && f.iter().all(|&b| b == 1),
        "f changed"
    );
    // A write reaching exactly the quota fits; du inside the mount counts what it charges.
    assert_eq!(append(&mp, "f", 512, 3), "ok");
    assert_eq!(df(&mp).1, 1 << 20);
    let du = check(&mut cmd("du", &["-s", "-B1", mp.to_str().unwrap()]));
    assert!(du.starts_with(&(1u64 << 20).to_string()), "du: {du}");
    // A new file is created (an inode is free) but not one byte of data fits.
    assert_eq!(append(&mp, "g", 4, 4), "EDQUOT");
    assert_eq!(std::fs::metadata(mp.join("g")).unwrap().len(), 0);

    // Inodes: root, f, g; three more nodes fit, the next of any kind is refused.
    let out = py(
        &mp,
        r#"
import errno, os, sys
m = sys.argv[1]
out = []
for make in [lambda: os.mkdir(m + "/d"), lambda: os.symlink("f", m + "/s"),
             lambda: os.mknod(m + "/p", 0o600 | 0o010000), lambda: os.mkdir(m + "/e"),
             lambda: os.close(os.open(m + "/h", os.O_CREAT | os.O_WRONLY)),
             lambda: os.symlink("f", m + "/t")]:
    try:
        make()
        out.append("ok")
    except OSError as e:
        out.append(errno.errorcode[e.errno])
print(" ".join(out))
"#,
    );
    assert_eq!(out.trim(), "ok ok ok EDQUOT EDQUOT EDQUOT");
    assert!(!mp.join("e").exists() && !mp.join("h").exists());
    // Hard links take no inode.
    std::fs::hard_link(mp.join("f"), mp.join("f2")).unwrap();
    assert_eq!(usage(&h, "t"), (1 << 20, 6));
    assert_eq!(df(&mp), (1 << 20, 1 << 20, 6, 6));

    // Lowered below what the files take: growth is refused, deletes and truncates go
    // through, and each gives its space back.
    let out = h.ok(&["tenant", "set", "t", "--quota-bytes", "256K"]);
    assert!(out.contains("quota 256K, 6 inodes"), "{out}");
    assert_eq!(append(&mp, "g", 4, 5), "EDQUOT");
    let out = py(
        &mp,
        "import os, sys; os.truncate(sys.argv[1] + '/f', 300 << 10); print('ok')",
    );
    assert_eq!(out.trim(), "ok");
    assert_eq!(usage(&h, "t").0, 300 << 10);
    std::fs::remove_file(mp.join("f")).unwrap();
    std::fs::remove_file(mp.join("f2")).unwrap();
    std::fs::remove_file(mp.join("s")).unwrap();
    // The freed inode is given back when the kernel forgets it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while usage(&h, "t") != (0, 4) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(usage(&h, "t"), (0, 4));
    assert_eq!(append(&mp, "g", 256, 6), "ok");
    assert_eq!(append(&mp, "g", 4, 6), "EDQUOT");
    assert_eq!(df(&mp), (256 << 10, 256 << 10, 6, 4));
    let table = h.ok(&["stats"]);
    assert!(
        table.contains("tenant t: files take 262144 of 262144 bytes in 4 of 6 inodes"),
        "{table}"
    );

    // The quota is in the record: it holds after a remount, and the counts are exact after
    // a clean unmount and after kill -9 (counted again at the next mount).
    let before = usage(&h, "t");
    h.ok(&["umount", mp.to_str().unwrap()]);
    let out = h.ok(&["tenant", "check", "t"]);
    assert!(
        out.contains("262144 bytes in 4 inodes") && out.contains("were right"),
        "{out}"
    );
    drop(m);
    let m = mount(&d);
    assert_eq!(usage(&h, "t"), before);
    assert_eq!(append(&mp, "g", 4, 7), "EDQUOT");
    h.ok(&["tenant", "set", "t", "--quota-bytes", "unlimited"]);
    assert_eq!(append(&mp, "big", 2048, 8), "ok");
    std::fs::OpenOptions::new()
        .append(true)
        .open(mp.join("big"))
        .unwrap()
        .sync_all()
        .unwrap();
    let written = usage(&h, "t");
    assert_eq!(written, ((256 + 2048) << 10, 5));
    d.0.kill().unwrap();
    d.0.wait().unwrap();
    drop(m);
    if tenantfs_mounted(&mp) {
        h.ok(&["umount", mp.to_str().unwrap()]);
    }
    d = start_daemon(&h, &notify);
    let m = mount(&d);
    assert_eq!(usage(&h, "t"), written);
    let (size, used, files, files_used) = df(&mp);
    assert!(size > 1 << 30, "no byte quota, yet df says {size}");
    assert_eq!((used, files, files_used), ((256 + 2048) << 10, 6, 5));
    let listed = h.ok(&["tenant", "list"]);
    assert!(
        listed.contains("USED BYTES") && listed.contains("2359296"),
        "{listed}"
    );
    h.ok(&["umount", mp.to_str().unwrap()]);
    drop(m);
    let out = h.ok(&["tenant", "check", "t"]);
    assert!(out.contains("were right"), "{out}");
    d.terminate_cleanly(&[]);
}

#[test]
fn a_quota_that_is_not_a_positive_number_is_refused() {
    let h = Host::new("badquota");
    h.create_tenant("t");
    for (args, says) in [
        (
            &["tenant", "set", "t", "--quota-bytes", "0"][..],
            "not a byte quota",
        ),
        (
            &["tenant", "set", "t", "--quota-bytes", "-1G"],
            "not a byte quota",
        ),
        (
            &["tenant", "set", "t", "--quota-bytes", "lots"],
            "not a byte quota",
        ),
        (
            &["tenant", "set", "t", "--quota-inodes", "0"],
            "not an inode quota",
        ),
        (
            &["tenant", "set", "t", "--quota-inodes", "-5"],
            "not an inode quota",
        ),
        (
            &["tenant", "create", "u", "--quota-inodes", "0"],
            "not an inode quota",
        ),
        (
            &["tenant", "set", "nobody", "--quota-bytes", "1G"],
            "unknown tenant nobody",
        ),
        (&["tenant", "check", "nobody"], "unknown tenant nobody"),
    ] {
        let err = h.fails(args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(!h.data.join("tenants/u").exists());
    // Unmounted: the record changes, and the next mount applies it.
    let out = h.ok(&["tenant", "set", "t", "--quota-inodes", "2"]);
    assert!(out.contains("quota unlimited bytes, 2 inodes"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&h.ok(&["tenant", "list", "--json"])).unwrap();
    assert_eq!(v[0]["quota"]["inodes"], 2, "{v}");
    let mp = h.dir("m");
    let _m = h.mount("t", &mp, "");
    std::fs::write(mp.join("a"), b"a").unwrap();
    let e = std::fs::write(mp.join("b"), b"b").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
}
