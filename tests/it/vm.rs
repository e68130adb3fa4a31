//! The VM harness (`tests/vm/vm.sh`): Debian's cloud kernel under qemu (TCG) with a busybox
//! initramfs, for the kernel features this host lacks (ublk, nbd) and for the cgroup v2 memory
//! controller (this host mounts v1). The first tests check the harness itself: that the VM
//! has what later tests rely on, that the `tenantfs` binary runs in it, and that a failing
//! script fails its test.

use std::path::Path;
use std::process::Command;

use crate::common::process::BIN;

/// Boots the VM, runs `script` in it (under `sh -e`) with `programs` in its PATH (and `disk`,
/// a raw image, as /dev/vda), and returns whether the script succeeded, and the VM's console
/// output.
pub fn run_in_vm(script: &str, programs: &[&str], disk: Option<&Path>) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.sh");
    std::fs::write(&path, script).unwrap();
    let mut c = harness("vm.sh");
    if let Some(disk) = disk {
        c.env("VM_DISK", disk);
    }
    console_of(c.arg("run").arg(&path).args(programs))
}

/// `bash tests/vm/<script>`, ready for its arguments.
pub fn harness(script: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/vm")
            .join(script),
    );
    c
}

/// Runs a harness command: whether it succeeded, and what it printed (the VM's console).
pub fn console_of(c: &mut Command) -> (bool, String) {
    let out = c.output().expect("run the VM harness");
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit status 2 is the harness's own failure (no kernel, no qemu, the VM did not finish).
    assert_ne!(
        out.status.code(),
        Some(2),
        "the VM harness failed:\n{console}"
    );
    (out.status.success(), console)
}

/// A sparse raw image of `bytes` with an empty ext4 in it, made on the host (the VM's data
/// disk: `run_in_vm(.., Some(&image))`).
pub fn ext4_image(dir: &Path, bytes: u64) -> std::path::PathBuf {
    let disk = dir.join("data.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&disk)
        .output()
        .unwrap();
    assert!(mkfs.status.success(), "{mkfs:?}");
    disk
}

/// The VM has the block drivers as loaded modules, cgroup v2 with the memory controller, PSI
/// and FUSE, and runs the `tenantfs` binary built for this host.
#[test]
fn the_vm_has_ublk_nbd_cgroup_v2_and_runs_tenantfs() {
    let (ok, console) = run_in_vm(
        "test -c /dev/ublk-control\n\
         test -b /dev/nbd0\n\
         grep -qw memory /sys/fs/cgroup/cgroup.controllers\n\
         test -e /proc/pressure/memory\n\
         grep -qw fuse /proc/filesystems\n\
         echo \"version: $(tenantfs --version)\"\n",
        &[BIN],
        None,
    );
    assert!(ok, "{console}");
    let version = format!("version: tenantfs {}", env!("CARGO_PKG_VERSION"));
    assert!(console.contains(&version), "{console}");
}

/// A script that fails in the VM fails its test, with the failing command's status.
#[test]
fn a_failing_script_in_the_vm_fails() {
    let (ok, console) = run_in_vm(
        "echo before\ntest -e /no/such/file\necho after\n",
        &[],
        None,
    );
    assert!(!ok, "{console}");
    assert!(
        console.contains("before") && !console.contains("after"),
        "{console}"
    );
}

/// The value after `key=` on the console line starting with `prefix`.
fn reported(console: &str, prefix: &str, key: &str) -> u64 {
    let line = console
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{console}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// The memory governor on cgroup v2, live (the host has v1; v2 had fixture files only): a
/// server whose cache holds a 128 MiB file runs in a cgroup capped at 256 MiB with a 512 MiB
/// cache budget; a hog beside it takes 160 MiB, 4 MiB every 50 ms. The governor must shrink
/// the cache: no OOM kill, the server stays up, the file reads the same.
#[test]
fn the_governor_shrinks_the_cache_under_a_cgroup_v2_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    let disk = ext4_image(dir.path(), 2 << 30);
    let script = r#"
mkdir -p /mnt/d /tmp/mp
mount /dev/vda /mnt/d
export TENANTFS_DATA_DIR=/mnt/d/data
tenantfs init >/dev/null
tenantfs tenant create alpha >/dev/null
printf '[cache]\nbudget = "512M"\n[pressure]\ninterval_ms = 100\n' > /tmp/cfg.toml
tenantfs --config /tmp/cfg.toml mount alpha /tmp/mp
dd if=/dev/urandom of=/tmp/mp/big bs=1M count=128 2>/dev/null
sync
want=$(sha256sum < /tmp/mp/big)
tenantfs umount /tmp/mp
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/gov
echo 256M > /sys/fs/cgroup/gov/memory.max
echo $$ > /sys/fs/cgroup/gov/cgroup.procs
TENANTFS_LOG=tenantfs=info tenantfs --config /tmp/cfg.toml mount alpha /tmp/mp
test "$(sha256sum < /tmp/mp/big)" = "$want"
pid=$(pidof tenantfs)
grep -qx "$pid" /sys/fs/cgroup/gov/cgroup.procs
report() {
  tenantfs cache stats --json > /tmp/stats
  echo "$1 used=$(grep -m1 '"used_bytes"' /tmp/stats | tr -dc 0-9)"     "budget=$(grep -m1 '"budget_bytes"' /tmp/stats | tr -dc 0-9)"     "shrinks=$(grep -m1 '"shrinks"' /tmp/stats | tr -dc 0-9)"
}
report before
for i in $(seq 40); do (dd if=/dev/zero bs=4M count=1 2>/dev/null | sleep 5) & sleep 0.05; done
wait
report after
echo "events oom_kill=$(grep '^oom_kill ' /sys/fs/cgroup/gov/memory.events | tr -dc 0-9)"
kill -0 "$pid" || { echo "the server died"; exit 1; }
test "$(sha256sum < /tmp/mp/big)" = "$want" || { echo "the file changed"; exit 1; }
log=$TENANTFS_DATA_DIR/tenants/alpha/mount.log
grep -q "cache budget shrunk" "$log" || { echo "no shrink logged:"; cat "$log"; exit 1; }
echo "server alive, file intact, shrink logged"
"#;
    let (ok, console) = run_in_vm(script, &[BIN], Some(&disk));
    assert!(ok, "{console}");
    assert!(console.contains("server alive, file intact, shrink logged"));
    assert!(
        reported(&console, "before", "used") >= 120 << 20,
        "the file was not cached before the hog:\n{console}"
    );
    assert_eq!(reported(&console, "events", "oom_kill"), 0, "{console}");
    assert!(
        reported(&console, "after", "shrinks") > reported(&console, "before", "shrinks"),
        "the hog caused no shrink:\n{console}"
    );
    assert!(
        reported(&console, "after", "budget") < 256 << 20,
        "the budget stayed above the cap:\n{console}"
    );
    assert!(
        reported(&console, "after", "used") < reported(&console, "before", "used"),
        "{console}"
    );
}
