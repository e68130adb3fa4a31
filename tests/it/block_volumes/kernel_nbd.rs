//! The kernel's NBD client against a volume's export, in the VM (this host's kernel has no
//! nbd driver): `nbd-client` attaches /dev/nbd0 to the daemon's unix socket, mkfs.ext4 and a
//! tree of files go on it, e2fsck -fn finds it clean, and after a detach and attach of both
//! the client and the volume, every file reads back the same.

use super::in_vm;

#[test]
fn the_kernel_nbd_client_takes_an_ext4_that_survives_detach_and_attach() {
    in_vm(
        r#"
tenantfs volume create v --size 256M >/dev/null
start_daemon
attach() {
  tenantfs volume attach v --nbd unix:/tmp/v.sock
  nbd-client -u /tmp/v.sock /dev/nbd0 -b 4096
}
attach
mkfs.ext4 -q /dev/nbd0
mount /dev/nbd0 /mnt/fs
fill_tree
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
"#,
        &[
            "/usr/sbin/nbd-client",
            "/usr/sbin/mkfs.ext4",
            "/usr/sbin/e2fsck",
        ],
        &[
            "files: 42",
            "e2fsck clean",
            "same files after detach and attach",
            "stats show the volume",
        ],
    );
}
