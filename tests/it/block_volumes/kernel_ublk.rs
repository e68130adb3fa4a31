//! Volumes as /dev/ublkbN, in the VM (this host's kernel has no ublk driver): an ext4 made,
//! filled, checked and read back across a detach and attach; detach refused while mounted; a
//! daemon killed with -9 in the middle of a fio verify job and started again recovers the
//! device, and the job, which never saw the device go, completes without an error; so does
//! one across a daemon stopped with SIGTERM and started again.

use super::in_vm;

#[test]
fn a_ublk_device_takes_an_ext4_that_survives_detach_and_attach() {
    let console = in_vm(
        r#"
tenantfs volume create v --size 256M >/dev/null
start_daemon
tenantfs volume attach v --ublk
test -b /dev/ublkb0
echo "size: $(blockdev --getsize64 /dev/ublkb0)"
mkfs.ext4 -q /dev/ublkb0
mount /dev/ublkb0 /mnt/fs
fill_tree
tenantfs volume detach v 2>/tmp/err && exit 1
grep -q "in use" /tmp/err && echo "detach refused while mounted"
sync
fstrim -v /mnt/fs
umount /mnt/fs
e2fsck -fn /dev/ublkb0 && echo "e2fsck clean"
tenantfs stats | grep -q "ublk /dev/ublkb0" && echo "stats show the device"
tenantfs volume list | grep -q "ublk /dev/ublkb0" && echo "list shows the device"
tenantfs volume detach v
test ! -e /dev/ublkb0 && echo "device gone after detach"
tenantfs volume attach v --ublk
mount /dev/ublkb0 /mnt/fs
sums | cmp - /tmp/sums && echo "same files after detach and attach"
umount /mnt/fs
tenantfs volume detach v
"#,
        &["/usr/sbin/mkfs.ext4", "/usr/sbin/e2fsck"],
        &[
            "size: 268435456",
            "files: 42",
            "detach refused while mounted",
            "e2fsck clean",
            "stats show the device",
            "list shows the device",
            "device gone after detach",
            "same files after detach and attach",
        ],
    );
    // fstrim went down to the device as DISCARDs.
    assert!(console.contains("/mnt/fs: "), "{console}");
}

#[test]
fn a_daemon_killed_or_stopped_during_fio_verify_recovers_the_device_and_the_job_passes() {
    in_vm(
        r#"
tenantfs volume create v --size 128M >/dev/null
start_daemon
tenantfs volume attach v --ublk
across_kill /dev/ublkb0
# A daemon stopped (SIGTERM) with the device attached keeps it for the next one too.
across_stop /dev/ublkb0 64k
tenantfs stats | grep -q "ublk /dev/ublkb0" && echo "stats show the device"
tenantfs volume detach v
"#,
        &["/usr/bin/fio"],
        &[
            "fio running at the kill",
            "daemon recovered the device",
            "fio passed across the kill",
            "fio running at the stop",
            "the stopping daemon kept the device",
            "fio passed across the stop",
            "stats show the device",
        ],
    );
}
