//! The kernel's NBD client against a volume's export, in the VM (this host's kernel has no
//! nbd driver): `nbd-client` attaches /dev/nbd0 to the daemon's unix socket, mkfs.ext4 and a
//! tree of files go on it, e2fsck -fn finds it clean, and after a detach and attach of both
//! the client and the volume, every file reads back the same.

use crate::common::process::BIN;
use crate::vm::{ext4_image, run_in_vm};

#[test]
fn the_kernel_nbd_client_takes_an_ext4_that_survives_detach_and_attach() {
    let dir = tempfile::tempdir().unwrap();
    let disk = ext4_image(dir.path(), 2 << 30);
    let script = r#"
mkdir -p /etc && ln -sf /proc/mounts /etc/mtab
mkdir -p /mnt/d /mnt/fs
mount /dev/vda /mnt/d
export TENANTFS_DATA_DIR=/mnt/d/data
tenantfs init >/dev/null
tenantfs volume create v --size 256M >/dev/null
tenantfs daemon 2>/tmp/daemon.log &
while [ ! -S $TENANTFS_DATA_DIR/tenantfs.sock ]; do sleep 0.1; done
attach() {
  tenantfs volume attach v --nbd unix:/tmp/v.sock
  nbd-client -u /tmp/v.sock /dev/nbd0 -b 4096
}
sums() { (cd /mnt/fs && find . -type f | sort | xargs sha256sum); }
attach
mkfs.ext4 -q /dev/nbd0
mount /dev/nbd0 /mnt/fs
mkdir -p /mnt/fs/a/b /mnt/fs/c
for i in $(seq 40); do dd if=/dev/urandom of=/mnt/fs/a/b/f$i bs=4k count=$i 2>/dev/null; done
dd if=/dev/urandom of=/mnt/fs/c/big bs=1M count=24 2>/dev/null
cp /bin/busybox /mnt/fs/c/
sums > /tmp/sums
echo "files: $(wc -l < /tmp/sums)"
umount /mnt/fs
e2fsck -fn /dev/nbd0 && echo "e2fsck clean"
nbd-client -d /dev/nbd0
tenantfs volume detach v
attach
mount /dev/nbd0 /mnt/fs
sums | cmp - /tmp/sums && echo "same files after detach and attach"
umount /mnt/fs
nbd-client -d /dev/nbd0
tenantfs stats | grep -q "nbd unix:/tmp/v.sock" && echo "stats show the volume"
"#;
    let (ok, console) = run_in_vm(
        script,
        &[
            BIN,
            "/usr/sbin/nbd-client",
            "/usr/sbin/mkfs.ext4",
            "/usr/sbin/e2fsck",
        ],
        Some(&disk),
    );
    assert!(ok, "{console}");
    for want in [
        "files: 42",
        "e2fsck clean",
        "same files after detach and attach",
        "stats show the volume",
    ] {
        assert!(console.contains(want), "no {want:?} in:\n{console}");
    }
}
