//! The kernel's NBD client against a volume's export, in the VM (this host's kernel has no
//! nbd driver): `nbd-client` attaches /dev/nbd0 to the daemon's unix socket, mkfs.ext4 and a
//! tree of files go on it, e2fsck -fn finds it clean, and after a detach and attach of both
//! the client and the volume, every file reads back the same. Then the daemon's own
//! /dev/nbdN (`--nbd-device`), which passes the same and more: detach refused while mounted,
//! and a daemon killed with -9 (or stopped) in the middle of a fio verify job and started
//! again gives the kernel a new socket, and the job completes without an error; so does one
//! across a daemon frozen past the kernel's request timeout.

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

/// `attach` puts volume v on the daemon's own /dev/nbdN, in `$DEV`.
const ATTACH_DEVICE: &str = r#"
tenantfs volume create v --size 256M >/dev/null
start_daemon
attach() { tenantfs volume attach v --nbd-device | tee /tmp/attach; DEV=$(sed 's/.* as //' /tmp/attach); }
attach
"#;

#[test]
fn the_daemons_nbd_device_takes_an_ext4_and_survives_a_kill_during_fio_verify() {
    in_vm(
        &(ATTACH_DEVICE.to_owned()
            + r#"
test -b $DEV && echo "size: $(blockdev --getsize64 $DEV)"
cat /sys/block/${DEV#/dev/}/backend
mkfs.ext4 -q $DEV
mount $DEV /mnt/fs
fill_tree
tenantfs volume detach v 2>/tmp/err && exit 1
grep -q "in use" /tmp/err && echo "detach refused while mounted"
umount /mnt/fs
e2fsck -fn $DEV && echo "e2fsck clean"
tenantfs stats | grep -q "nbd-device $DEV" && echo "stats show the device"
tenantfs volume detach v
test ! -e /sys/block/${DEV#/dev/}/backend && echo "device disconnected at detach"
attach
mount $DEV /mnt/fs
sums | cmp - /tmp/sums && echo "same files after detach and attach"
umount /mnt/fs
across_kill $DEV
# 1 MiB writes over the 4k ones (folded into their chunks by now) across a second kill:
# acknowledged means logged, so none is lost with the daemon (unlogged, every one of them
# was), and no block the lost folds had merged comes back over them (one did, before the
# writes deleted their blocks unconditionally).
across_kill $DEV --rw=write --bs=1M --size=96M && echo "1M writes passed across the kill"
tenantfs volume detach v
"#),
        &["/usr/sbin/mkfs.ext4", "/usr/sbin/e2fsck", "/usr/bin/fio"],
        &[
            "size: 268435456",
            "tenantfs:v:/mnt/d/data",
            "files: 42",
            "detach refused while mounted",
            "e2fsck clean",
            "stats show the device",
            "device disconnected at detach",
            "same files after detach and attach",
            "fio running at the kill",
            "daemon recovered the device",
            "fio passed across the kill",
            "1M writes passed across the kill",
        ],
    );
}

/// The other half of the device's tests, in a VM of its own (together they outlast the VM's
/// time limit under TCG when another test shares the host's two CPUs).
#[test]
fn the_daemons_nbd_device_survives_a_frozen_daemon_and_a_stop_during_fio_verify() {
    in_vm(
        &(ATTACH_DEVICE.to_owned()
            + r#"
# A daemon frozen past the request timeout: the kernel gives the socket up, the daemon gives
# it a new one when it runs again, and the requeued requests complete.
# (Frozen once fio's writes reach the device: fio can take seconds to start under TCG, and
# requests sent less than the timeout before the daemon goes on never time out.)
fio_verify frozen $DEV --rw=randwrite --bs=4k --size=16M --iodepth=8
writes() { awk '{print $5}' /sys/block/${DEV#/dev/}/stat; }
before=$(writes)
for i in $(seq 300); do [ $(writes) -gt $before ] && break; sleep 0.1; done
kill -STOP $DAEMON
sleep 7
kill -CONT $DAEMON
fio_passed frozen && echo "fio passed across a frozen daemon"
for i in $(seq 100); do grep -q "gave it a new one" /tmp/daemon.log && break; sleep 0.1; done
grep -q "gave it a new one" /tmp/daemon.log && echo "the daemon replaced the socket"
# Large writes across a stop.
across_stop $DEV 1M
tenantfs volume detach v
"#),
        &["/usr/bin/fio"],
        &[
            "fio passed across a frozen daemon",
            "the daemon replaced the socket",
            "fio running at the stop",
            "the stopping daemon kept the device",
            "fio passed across the stop",
        ],
    );
}
