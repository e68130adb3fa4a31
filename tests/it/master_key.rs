//! `tenantfs key rotate-master` through the real binary and daemon: a data dir with a
//! tenant, a tenant of a base (its template's key, the host's base keys) and both mounted
//! moves to a new master key while the daemon serves them; they read and write on, the
//! daemon forks and the CLI creates under the new key, the old key opens nothing, and a
//! daemon started again serves everything from the key the data dir keeps.

use crate::common::mount::{start_daemon, Host};
use crate::common::trees::write_synced;

#[test]
fn the_master_key_is_rotated_while_the_daemon_serves_its_tenants() {
    let h = Host::new("master-key");
    let src = h.dir("base-src");
    let base_file = crate::common::noise(3, 300_000);
    std::fs::write(src.join("big"), &base_file).unwrap();
    std::fs::write(src.join("small"), b"seven b").unwrap();
    h.ok(&["base", "import", "b", src.to_str().unwrap()]);
    h.create_tenant("t");
    h.ok(&["tenant", "create", "u", "--base", "b"]);
    let old = h.root().join("old.key");
    std::fs::copy(h.data.join("master.key"), &old).unwrap();
    let (mt, mu) = (h.dir("mt"), h.dir("mu"));
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let mount = |name: &str, at: &std::path::Path, pid: u32| {
        h.ok(&["mount", name, at.to_str().unwrap()]);
        h.guard(name, at, pid)
    };
    let (gt, gu) = (mount("t", &mt, d.0.id()), mount("u", &mu, d.0.id()));
    write_synced(&mt.join("before"), b"under the old key");

    let new = h.root().join("new.key");
    let out = h.ok(&["key", "rotate-master", "--new-key", new.to_str().unwrap()]);
    assert!(
        out.contains("made a new master key in")
            && out.contains("the keys of 2 tenant(s), 1 base template(s) and the host's base keys")
            && out.contains("master.key holds the new key"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(h.data.join("master.key")).unwrap(),
        std::fs::read(&new).unwrap()
    );
    // The mounts go on; the daemon forks and the CLI creates under the new key.
    assert_eq!(
        std::fs::read(mt.join("before")).unwrap(),
        b"under the old key"
    );
    write_synced(&mt.join("after"), b"under the new key");
    assert!(std::fs::read(mu.join("big")).unwrap() == base_file);
    assert_eq!(std::fs::read(mu.join("small")).unwrap(), b"seven b");
    let out = h.ok(&["tenant", "fork", "t", "f"]);
    assert!(out.contains("while it is served"), "{out}");
    h.ok(&["tenant", "create", "v", "--base", "b"]);
    let e = h.fails(&["key", "rotate-master", "--new-key", new.to_str().unwrap()]);
    assert!(e.contains("is the data dir's master key already"), "{e}");
    // The old key opens nothing.
    let e = h.fails(&[
        "--master-key",
        old.to_str().unwrap(),
        "tenant",
        "create",
        "w",
    ]);
    assert!(e.contains("is not the key data dir"), "{e}");
    h.ok(&["umount", mt.to_str().unwrap()]);
    h.ok(&["umount", mu.to_str().unwrap()]);
    drop((gt, gu));
    d.terminate_cleanly(&[]);

    // A daemon started again serves them all under the key the data dir keeps.
    let d = start_daemon(&h, &h.root().join("notify2"));
    let mf = h.dir("mf");
    for (name, at) in [("t", &mt), ("f", &mf), ("v", &mu)] {
        let g = mount(name, at, d.0.id());
        if name == "v" {
            assert!(std::fs::read(at.join("big")).unwrap() == base_file);
        } else {
            assert_eq!(
                std::fs::read(at.join("before")).unwrap(),
                b"under the old key"
            );
            assert_eq!(
                std::fs::read(at.join("after")).unwrap(),
                b"under the new key"
            );
        }
        h.ok(&["umount", at.to_str().unwrap()]);
        drop(g);
    }
    let out = h.ok(&["base", "verify"]);
    assert!(out.contains("all intact"), "{out}");
    let mut d = d;
    d.terminate_cleanly(&[]);
}
