#!/bin/bash
# The VM harness: boots Debian's cloud kernel (ublk, nbd and loop as modules, cgroup v2, FUSE,
# ext4, io_uring, PSI built in) under qemu's TCG with a busybox initramfs, runs one script in it
# and exits with that script's status. For kernel features this host lacks (ublk, nbd) and for
# the cgroup v2 memory controller (this host mounts v1).
#
#   vm.sh prepare                 fetch the kernel and build the boot files (once; cached)
#   vm.sh run SCRIPT [FILE...]    boot, run SCRIPT as /test.sh; each FILE (a program) is put
#                                 in /usr/local/bin with the libraries `ldd` lists for it
#
# Environment: TENANTFS_VM_DIR (cache, default /var/tmp/tenantfs-vm), VM_MEM (MiB, 1024),
# VM_TIMEOUT (s, 300), VM_DISK (an image attached as virtio disk /dev/vda), VM_CPUS (2).
# Needs qemu-system-x86, busybox-static, cpio, xz-utils (`make test` installs them).
# KVM is not used: qemu under KVM fails on this host's CPU (MSR 0x10a), TCG boots in ~4 s.
set -euo pipefail

DIR=${TENANTFS_VM_DIR:-/var/tmp/tenantfs-vm}
MODULES=(virtio_blk nbd ublk_drv loop)

die() { echo "vm.sh: $*" >&2; exit 2; }

# The newest linux-image-6.12.*-cloud-amd64-unsigned the package lists know.
kernel_package() {
  apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb[0-9]+-cloud-amd64-unsigned$' \
    | awk '{print $1}' | sort -V | tail -1
}

prepare() {
  mkdir -p "$DIR"
  # One preparer at a time (tests boot VMs in parallel); the others wait, then find it done.
  ( flock 9 && prepare_locked ) 9>"$DIR/.lock"
}

prepare_locked() {
  local have=1 m
  for m in "${MODULES[@]}"; do [ -s "$DIR/modules/$m.ko" ] || have=0; done
  if [ -s "$DIR/vmlinuz" ] && [ -s "$DIR/busybox" ] && [ $have = 1 ]; then
    return 0
  fi
  for tool in qemu-system-x86_64 cpio xz; do
    command -v $tool >/dev/null || die "$tool not found: apt-get install qemu-system-x86 cpio xz-utils"
  done
  # (ldd fails on a static program: the initramfs has no libraries for busybox.)
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 ||
    die "a static /bin/busybox is needed: apt-get install busybox-static"
  local pkg
  pkg=$(kernel_package)
  if [ -z "$pkg" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(kernel_package)
  fi
  [ -n "$pkg" ] || die "no linux-image-6.12.*-cloud-amd64-unsigned in the package lists (apt-get update?)"
  local work="$DIR/work"
  rm -rf "$work" && mkdir -p "$work"
  # apt's sandbox user (_apt) must be able to write where it downloads.
  (cd "$work" && chmod 777 . && apt-get download "$pkg" >/dev/null 2>&1) ||
    die "cannot download $pkg (network to the package mirror?)"
  dpkg-deb -x "$work"/*.deb "$work/root"
  local ver
  ver=$(ls "$work/root/lib/modules")
  mkdir -p "$work/modules"
  for m in "${MODULES[@]}"; do
    local ko
    ko=$(find "$work/root/lib/modules/$ver" -name "$m.ko.xz" | head -1)
    [ -n "$ko" ] || die "$m.ko.xz not in $pkg"
    xz -dc "$ko" > "$work/modules/$m.ko"
  done
  cp "$work/root/boot/vmlinuz-$ver" "$work/vmlinuz"
  cp /bin/busybox "$work/busybox"
  echo "$pkg" > "$work/kernel"
  rm -rf "$work/root" "$work"/*.deb "$DIR/modules"
  mv "$work/modules" "$DIR/modules"
  mv "$work/kernel" "$work/busybox" "$DIR/"
  mv "$work/vmlinuz" "$DIR/vmlinuz"   # last: its presence says the cache is complete
  rmdir "$work"
}

# Copies program $1 (without debug info) and the libraries it links into the initramfs tree $2.
add_program() {
  local prog=$1 root=$2
  # Without debug info (the release profile keeps it: 450 MB that the VM's RAM would hold).
  strip --strip-debug -o "$root/usr/local/bin/$(basename "$prog")" "$prog"
  ldd "$prog" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

run() {
  local script=$1; shift
  prepare
  local tree
  tree=$(mktemp -d /tmp/tenantfs-vm-tree.XXXXXX)
  trap 'rm -rf "$tree"' EXIT
  mkdir -p "$tree"/{bin,dev,proc,sys,tmp,run,mnt,lib/modules,usr/local/bin}
  cp "$DIR/busybox" "$tree/bin/busybox"
  cp "$DIR"/modules/*.ko "$tree/lib/modules/"
  for prog in "$@"; do add_program "$prog" "$tree"; done
  cp "$script" "$tree/test.sh"
  cat > "$tree/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
# The programs given first. (busybox's shell runs its own applets before any PATH lookup:
# call a program that has an applet's name, such as losetup, by its full path.)
export PATH=/usr/local/bin:/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for m in virtio_blk nbd ublk_drv loop; do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
echo VM-TEST-BEGIN
sh -e /test.sh
echo "VM-TEST-EXIT $?"
poweroff -f
INIT
  chmod +x "$tree/init"
  local initrd="$tree.cpio.gz"
  (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1) > "$initrd"
  local disk=()
  if [ -n "${VM_DISK:-}" ]; then
    disk=(-drive "file=$VM_DISK,format=raw,if=virtio,cache=unsafe")
  fi
  local log="$tree.log"
  # A guest kernel that dies while booting, before the test began, says nothing about the
  # test (seen once: an int3 Oops in a timer interrupt, static-key patching under TCG on two
  # vCPUs): boot it again, once. A test that began is never rerun.
  local attempt
  for attempt in 1 2; do
    timeout "${VM_TIMEOUT:-300}" qemu-system-x86_64 -accel tcg -cpu max -smp "${VM_CPUS:-2}" \
      -m "${VM_MEM:-1024}" -nographic -no-reboot -kernel "$DIR/vmlinuz" -initrd "$initrd" \
      -append "console=ttyS0 panic=-1 quiet" "${disk[@]}" </dev/null | tee "$log" || true
    grep -q "VM-TEST-BEGIN" "$log" && break
    echo "vm.sh: the VM stopped before the test began (boot attempt $attempt)" >&2
  done
  rm -f "$initrd"
  local status
  status=$(sed -n 's/^VM-TEST-EXIT \([0-9]*\).*/\1/p' "$log" | tail -1)
  rm -f "$log"
  [ -n "$status" ] || die "the VM ended without the test's exit status (timeout or crash: see its console above)"
  exit "$status"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; [ $# -ge 1 ] || die "usage: vm.sh run SCRIPT [PROGRAM...]"; run "$@" ;;
  *) die "usage: vm.sh prepare | vm.sh run SCRIPT [PROGRAM...]" ;;
esac
