//! tenantfs as installed, under a real systemd: the systemd guest (`tests/vm/systemd-guest.sh`,
//! Debian 12 with systemd as PID 1 under the VM harness's kernel) with the binary, the mount
//! helper and the unit installed as `make install` installs them. `tenantfs init`, `systemctl
//! enable --now tenantfs`, a tenant mounted through mount(8) and an fstab line; a reboot
//! finds the daemon and the mount back; a daemon killed with -9 is restarted by systemd, and
//! so is one that stops answering (the watchdog); `systemctl stop` leaves no mount behind.

use std::path::Path;

use crate::common::process::BIN;
use crate::vm::{console_of, harness};

/// Runs `script` in the guest booted from `disk`; its exit status and console.
fn boot(disk: &Path, script: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.sh");
    std::fs::write(&path, script).unwrap();
    console_of(harness("systemd-guest.sh").arg("boot").arg(disk).arg(&path))
}

fn wants(console: &str, lines: &[&str]) {
    for line in lines {
        assert!(console.contains(line), "no {line:?} in:\n{console}");
    }
}

#[test]
fn the_installed_daemon_runs_under_systemd_across_a_reboot_a_kill_and_a_stop() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let disk = dir.path().join("guest.img");
    let (made, console) = console_of(harness("systemd-guest.sh").arg("image").arg(&disk).arg(BIN));
    assert!(made, "{console}");
    let (ok, console) = boot(
        &disk,
        r#"
echo "pid 1: $(cat /proc/1/comm)"
tenantfs init >/dev/null && echo "initialised"
systemctl enable --now tenantfs 2>/dev/null
systemctl is-active tenantfs && echo "the daemon runs"
tenantfs tenant create alice >/dev/null
mkdir -p /srv/alice
echo "alice /srv/alice tenantfs data_dir=/var/lib/tenantfs,_netdev,x-systemd.requires=tenantfs.service 0 0" >> /etc/fstab
mount /srv/alice && echo "mounted through fstab"
echo "written before the reboot" > /srv/alice/f && sync
"#,
    );
    assert!(ok, "{console}");
    wants(
        &console,
        &[
            "pid 1: systemd",
            "initialised",
            "the daemon runs",
            "mounted through fstab",
        ],
    );
    let (ok, console) = boot(
        &disk,
        r#"
systemctl is-system-running --wait >/dev/null || true
systemctl is-active tenantfs && echo "the daemon is back"
grep -q " /srv/alice fuse.tenantfs " /proc/mounts && echo "the fstab mount is back"
cat /srv/alice/f
pid=$(systemctl show -p MainPID --value tenantfs)
kill -9 $pid
for i in $(seq 60); do
  new=$(systemctl show -p MainPID --value tenantfs)
  [ "$new" != 0 ] && [ "$new" != "$pid" ] && tenantfs stats >/dev/null 2>&1 && break
  sleep 1
done
[ "$new" != "$pid" ] && echo "systemd restarted the daemon"
# A daemon that stops answering: no WATCHDOG=1 for WatchdogSec (30 s), so systemd aborts it
# (after 5 s here, not the unit's 120: a stopped process handles no SIGABRT) and restarts it.
mkdir -p /etc/systemd/system/tenantfs.service.d
printf '[Service]\nTimeoutAbortSec=5s\n' > /etc/systemd/system/tenantfs.service.d/test.conf
systemctl daemon-reload
pid=$(systemctl show -p MainPID --value tenantfs)
kill -STOP $pid
for i in $(seq 120); do
  new=$(systemctl show -p MainPID --value tenantfs)
  [ "$new" != 0 ] && [ "$new" != "$pid" ] && tenantfs stats >/dev/null 2>&1 && break
  sleep 1
done
[ "$new" != "$pid" ] && journalctl -u tenantfs | grep -q "Watchdog timeout" &&
  echo "the watchdog restarted a daemon that stopped answering"
systemctl stop tenantfs
grep -q "fuse.tenantfs" /proc/mounts || echo "stop left no mount"
"#,
    );
    assert!(ok, "{console}");
    wants(
        &console,
        &[
            "the daemon is back",
            "the fstab mount is back",
            "written before the reboot",
            "systemd restarted the daemon",
            "the watchdog restarted a daemon that stopped answering",
            "stop left no mount",
        ],
    );
}
