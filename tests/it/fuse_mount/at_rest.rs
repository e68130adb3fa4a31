//! Nothing written through a mount is left in plaintext under the data dir.

use super::*;

pub(super) const MARKER: &[u8] = b"TENANTFS-FUSE-PLAINTEXT-MARKER-4b1d";

/// Data, names, link targets and xattrs written through a mount leave no plaintext under the
/// data dir, neither while mounted (WAL) nor after unmount and a remount, nor in a snapshot,
/// a restore or a fork of the tenant (their records, WAL copies and store files).
#[test]
fn no_plaintext_at_rest() {
    let h = Host::new("plain");
    h.create_tenant("t");
    let mnt = h.dir("mnt");
    let marker = std::str::from_utf8(MARKER).unwrap();
    let scan = |when: &str| {
        let mut n = 0;
        for p in files_under(&h.data) {
            let bytes = std::fs::read(&p).unwrap();
            n += bytes.len();
            assert!(
                !contains(&bytes, MARKER),
                "{when}: plaintext in {}",
                p.display()
            );
        }
        assert!(n > 1 << 20, "{when}: only {n} bytes under the data dir");
    };
    let m = h.mount("t", &mnt, "");
    let mut small = MARKER.to_vec();
    small.extend_from_slice(b" small\n");
    std::fs::write(mnt.join("small.txt"), &small).unwrap();
    let mut big = Vec::new();
    for i in 0..4000u64 {
        big.extend_from_slice(MARKER);
        big.extend(noise(i, 1000));
    }
    let mut f = std::fs::File::create(mnt.join("big.bin")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    std::fs::create_dir(mnt.join(marker)).unwrap();
    std::fs::write(mnt.join(marker).join(format!("{marker}.txt")), &small).unwrap();
    std::os::unix::fs::symlink(marker, mnt.join("link")).unwrap();
    set_xattr(&mnt.join("small.txt"), "user.m", MARKER);
    sync_dir(&mnt);
    scan("while mounted");
    m.umount();
    scan("after umount");
    let m = h.mount("t", &mnt, "");
    assert!(std::fs::read(mnt.join("big.bin")).unwrap() == big);
    assert_eq!(
        std::fs::read_link(mnt.join("link")).unwrap(),
        Path::new(marker)
    );
    assert_eq!(xattrs(&mnt.join("small.txt"))[&b"user.m"[..]], MARKER);
    std::fs::write(mnt.join("unsynced.txt"), &small).unwrap();
    h.ok(&["snapshot", "create", "t", "s1"]);
    h.ok(&["tenant", "fork", "t", "f"]);
    m.umount();
    scan("after remount, a snapshot and a fork");
    h.ok(&["tenant", "restore", "t", "--snapshot", "s1"]);
    h.ok(&["tenant", "fork", "t", "g", "--snapshot", "s1"]);
    let m = h.mount("g", &mnt, "");
    assert_eq!(std::fs::read(mnt.join("unsynced.txt")).unwrap(), small);
    m.umount();
    scan("after a restore and a fork of the snapshot");
}
