//! The mount(8) helper: `mount -t tenantfs`, an fstab line (through `mount -T FSTAB`), and
//! umount(8), with and without the daemon. The helper is installed as /sbin/mount.tenantfs (a
//! symlink to this checkout's mount/mount.tenantfs) unless one is installed already; the
//! binary under test is passed with $TENANTFS.

use crate::common::guards::tenantfs_mounted;
use crate::common::mount::{start_daemon, Host};
use crate::common::process::{check, output, BIN};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn install_helper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ours = Path::new(env!("CARGO_MANIFEST_DIR")).join("mount/mount.tenantfs");
        let target = Path::new("/sbin/mount.tenantfs");
        match std::fs::symlink_metadata(target) {
            // A symlink from an earlier checkout (or CI clone): point it at this one.
            Ok(m) if m.file_type().is_symlink() => {
                let _ = std::fs::remove_file(target);
                std::os::unix::fs::symlink(&ours, target).unwrap();
            }
            Ok(_) => {} // installed by `make install`: it takes $TENANTFS too
            Err(_) => std::os::unix::fs::symlink(&ours, target).unwrap(),
        }
    });
}

fn mount_cmd() -> Command {
    let mut c = Command::new("mount");
    c.env("TENANTFS", BIN).env_remove("TENANTFS_LOG");
    c
}

/// umount(8), then wait until the tenant's serving process let go of its store.
fn umount8(h: &Host, mp: &Path, tenant: &str) {
    check(Command::new("umount").arg(mp));
    let closed =
        tenantfs::tenants::wait_until_closed(&h.data, tenant, Duration::from_secs(20)).unwrap();
    assert!(closed, "tenant {tenant} still open after umount");
}

#[test]
fn mount_t_tenantfs_fstab_and_umount() {
    install_helper();
    let h = Host::new("helper");
    h.create_tenant("a");
    let mp = h.dir("mp");
    let opts = format!("data_dir={},config=/dev/null", h.data.display());
    check(
        mount_cmd()
            .args(["-t", "tenantfs", "a"])
            .arg(&mp)
            .args(["-o", &opts]),
    );
    assert!(tenantfs_mounted(&mp));
    let _g = h.guard("a", &mp, 0);
    std::fs::write(mp.join("via-helper"), b"mounted by mount(8)").unwrap();
    umount8(&h, &mp, "a");
    assert!(!tenantfs_mounted(&mp));
    // An fstab line, with fstab-only options the helper drops and a tenantfs option it keeps.
    let fstab = h.root().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "a {} tenantfs {opts},cache=kernel,nofail,x-systemd.after=network.target 0 0\n",
            mp.display()
        ),
    )
    .unwrap();
    check(mount_cmd().arg("-T").arg(&fstab).arg(&mp));
    assert!(tenantfs_mounted(&mp));
    assert_eq!(
        std::fs::read(mp.join("via-helper")).unwrap(),
        b"mounted by mount(8)"
    );
    umount8(&h, &mp, "a");
    // Errors from tenantfs reach the user: an unknown tenant.
    let out = output(
        mount_cmd()
            .args(["-t", "tenantfs", "nope"])
            .arg(&mp)
            .args(["-o", &opts]),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope"), "{err}");
}

/// The acceptance path: daemon start -> two tenants mounted through the helper (one by
/// `mount -t`, one by an fstab line) -> I/O -> `tenant list` and `stats` show both -> SIGTERM
/// -> both unmounted, exit 0, data durable.
#[test]
fn mount_t_tenantfs_goes_through_the_daemon() {
    install_helper();
    let h = Host::new("helperd");
    h.create_tenant("b");
    h.create_tenant("c");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let (mb, mc) = (h.dir("mb"), h.dir("mc"));
    let opts = format!("data_dir={},config=/dev/null", h.data.display());
    check(
        mount_cmd()
            .args(["-t", "tenantfs", "b"])
            .arg(&mb)
            .args(["-o", &opts]),
    );
    let fstab = h.root().join("fstab");
    std::fs::write(
        &fstab,
        format!("c {} tenantfs {opts},nofail 0 0\n", mc.display()),
    )
    .unwrap();
    check(mount_cmd().arg("-T").arg(&fstab).arg(&mc));
    let _g = (h.guard("b", &mb, pid), h.guard("c", &mc, pid));
    std::fs::write(mb.join("x"), b"into b").unwrap();
    std::fs::write(mc.join("x"), b"into c").unwrap();
    assert_eq!(std::fs::read(mb.join("x")).unwrap(), b"into b");
    assert_eq!(std::fs::read(mc.join("x")).unwrap(), b"into c");
    // Both are served by the daemon: its stats and its tenant list show them.
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    assert_eq!(st["pid"].as_u64(), Some(pid as u64), "{st}");
    let served: Vec<&str> = st["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(served, ["b", "c"], "{st}");
    for m in st["mounts"].as_array().unwrap() {
        assert!(m["written_bytes"].as_u64().unwrap() >= 6, "{st}");
    }
    let list: serde_json::Value =
        serde_json::from_str(&h.ok(&["tenant", "list", "--json"])).unwrap();
    for (t, mp) in [("b", &mb), ("c", &mc)] {
        let e = list
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == t)
            .unwrap_or_else(|| panic!("{t} missing: {list}"));
        assert_eq!(e["mounts"], serde_json::json!([mp]), "{list}");
    }
    let table = h.ok(&["tenant", "list"]);
    assert!(table.contains(mc.to_str().unwrap()), "{table}");
    // umount(8) of a daemon mount: the daemon forgets it and can mount it again.
    check(Command::new("umount").arg(&mb));
    assert!(!tenantfs_mounted(&mb));
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let out = output(h.cmd().args(["mount", "b"]).arg(&mb));
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < end,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read(mb.join("x")).unwrap(), b"into b");
    // SIGTERM: both unmounted, exit 0; the data was flushed.
    d.terminate_cleanly(&[&mb, &mc]);
    let m = h.mount("c", &mc, "");
    assert_eq!(std::fs::read(m.join("x")).unwrap(), b"into c");
    m.umount();
}
