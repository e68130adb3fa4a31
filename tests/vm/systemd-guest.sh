#!/bin/bash
# The systemd guest: Debian 12 (a minbase root filesystem built from Debian's packages with
# mmdebstrap, cached) booted with systemd as PID 1 under the VM harness's kernel, with tenantfs
# installed as `make install` installs it (binary, mount helper, unit). A test script runs
# as a service once the system is up; its exit status ends the run. The guest's disk is an
# image the caller keeps, so a run may boot it again ("reboot") and find what the last run
# left.
#
#   systemd-guest.sh prepare                     build the root filesystem (once; cached)
#   systemd-guest.sh image DISK BIN              a fresh guest disk at DISK, tenantfs BIN in it
#   systemd-guest.sh boot DISK SCRIPT            boot DISK, run SCRIPT as root once up
#
# SCRIPT's lines on the console go through; the run's exit status is SCRIPT's (2: the harness
# failed, the guest did not come up, or it ran out of time). Environment: as vm.sh
# (TENANTFS_VM_DIR, VM_MEM, VM_TIMEOUT, VM_CPUS). Needs what vm.sh needs and mmdebstrap (`make
# test` installs it).
set -euo pipefail

DIR=${TENANTFS_VM_DIR:-/var/tmp/tenantfs-vm}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROOT_TAR="$DIR/systemd-root.tar"
PACKAGES=systemd,systemd-sysv,udev,kmod,fuse3,e2fsprogs,util-linux,procps,mount

die() { echo "systemd-guest.sh: $*" >&2; exit 2; }

prepare() {
  bash "$HERE/vm.sh" prepare
  mkdir -p "$DIR"
  ( flock 9 && prepare_locked ) 9>"$DIR/.systemd-lock"
}

prepare_locked() {
  [ -s "$ROOT_TAR" ] && return 0
  command -v mmdebstrap >/dev/null || die "mmdebstrap not found: apt-get install mmdebstrap"
  mmdebstrap --quiet --variant=minbase --include="$PACKAGES" bookworm "$ROOT_TAR.tmp" \
    http://deb.debian.org/debian || die "mmdebstrap failed (network to the Debian mirror?)"
  mv "$ROOT_TAR.tmp" "$ROOT_TAR"
}

# A new guest disk at $1 holding the root filesystem, tenantfs $2 installed as `make install`
# installs it, and the test service that runs /vm-test.sh once the system is up.
image() {
  local disk=$1 bin=$2
  prepare
  local root
  root=$(mktemp -d /var/tmp/tenantfs-sdroot.XXXXXX)
  trap 'rm -rf "$root"' RETURN
  tar -xf "$ROOT_TAR" -C "$root"
  strip --strip-debug -o "$root/usr/local/bin/tenantfs" "$bin"
  install -D -m 755 "$REPO/mount/mount.tenantfs" "$root/sbin/mount.tenantfs"
  install -D -m 644 "$REPO/systemd/tenantfs.service" "$root/etc/systemd/system/tenantfs.service"
  install -D -m 644 "$REPO/config/tenantfs.toml" "$root/etc/tenantfs/tenantfs.toml.example"
  echo vm > "$root/etc/hostname"
  # No login prompt on the console: a getty starting on ttyS0 hangs up the tty, and every
  # later write of a process that had it open (the test's) fails with EIO.
  for unit in serial-getty@ttyS0.service getty@tty1.service console-getty.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  # The test: a simple service, so the boot finishes while it runs (a oneshot would hold
  # `systemctl is-system-running --wait` until it ends).
  cat > "$root/etc/systemd/system/vm-test.service" <<'UNIT'
[Unit]
Description=tenantfs VM test
After=multi-user.target
ConditionPathExists=/vm-test.sh
[Service]
Type=exec
ExecStart=/bin/sh -c 'echo VM-TEST-BEGIN > /dev/ttyS0; sh -e /vm-test.sh > /dev/ttyS0 2>&1; \
  echo "VM-TEST-EXIT $?" > /dev/ttyS0; rm -f /vm-test.sh; systemctl poweroff'
[Install]
WantedBy=multi-user.target
UNIT
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
  ln -s /etc/systemd/system/vm-test.service \
    "$root/etc/systemd/system/multi-user.target.wants/vm-test.service"
  rm -f "$disk"
  mkfs.ext4 -q -F -d "$root" "$disk" 2G
}

# Boots disk $1 and runs script $2 in it once the system is up.
boot() {
  local disk=$1 script=$2
  prepare
  local tree
  tree=$(mktemp -d /tmp/tenantfs-sdboot.XXXXXX)
  trap 'rm -rf "$tree"' EXIT
  # The script goes in through debugfs: the disk is not mounted on the host.
  debugfs -w -R "write $script vm-test.sh" "$disk" >/dev/null 2>&1 ||
    die "cannot put $script on $disk"
  mkdir -p "$tree"/{bin,dev,proc,sys,newroot,lib/modules}
  cp "$DIR/busybox" "$tree/bin/busybox"
  cp "$DIR"/modules/*.ko "$tree/lib/modules/"
  cat > "$tree/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_blk nbd ublk_drv loop; do insmod /lib/modules/$m.ko 2>/dev/null; done
mount -t ext4 /dev/vda /newroot || { echo "no root filesystem on /dev/vda"; poweroff -f; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
INIT
  chmod +x "$tree/init"
  local initrd="$tree/initrd.cpio.gz"
  (cd "$tree" && find . -path ./initrd.cpio.gz -prune -o -print | cpio -o -H newc --quiet |
    gzip -1) > "$initrd"
  local log="$tree/console.log"
  timeout "${VM_TIMEOUT:-300}" qemu-system-x86_64 -accel tcg -cpu max -smp "${VM_CPUS:-2}" \
    -m "${VM_MEM:-1024}" -nographic -no-reboot -kernel "$DIR/vmlinuz" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 quiet" \
    -drive "file=$disk,format=raw,if=virtio,cache=unsafe" </dev/null | tee "$log" || true
  grep -q "VM-TEST-BEGIN" "$log" || die "the guest did not come up to run the test"
  local status
  status=$(sed -n 's/^VM-TEST-EXIT \([0-9]*\).*/\1/p' "$log" | tail -1)
  [ -n "$status" ] || die "the guest ended without the test's exit status (timeout or crash)"
  exit "$status"
}

case "${1:-}" in
  prepare) prepare ;;
  image) [ $# -eq 3 ] || die "usage: systemd-guest.sh image DISK BIN"; image "$2" "$3" ;;
  boot) [ $# -eq 3 ] || die "usage: systemd-guest.sh boot DISK SCRIPT"; boot "$2" "$3" ;;
  *) die "usage: systemd-guest.sh prepare | image DISK BIN | boot DISK SCRIPT" ;;
esac
