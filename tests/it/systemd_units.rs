//! The shipped systemd units pass `systemd-analyze verify` (with ExecStart pointed at the
//! binary under test), and the shipped example config passes `tenantfs config check`. The
//! service loads the master key from the very file `tenantfs init` writes for the unit's data
//! dir (so `tenantfs init`, then starting the unit, works as `make install` says), and a daemon
//! the unit starts without a key says where it looked and to run `tenantfs init`.

use crate::common::process::{check, check_fails, BIN};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn units_verify_clean() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze not installed; skipped");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let tmp = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for name in ["tenantfs.service", "srv-tenants-alice.mount"] {
        let text = std::fs::read_to_string(src.join(name))
            .unwrap()
            .replace("/usr/local/bin/tenantfs", BIN);
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        units.push(p);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Lines about the units themselves; systemd-analyze also talks about the host's own units.
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("tenantfs.service") || l.contains("srv-tenants-alice.mount"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify:\n{err}"
    );
}

#[test]
fn example_config_checks_clean() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tenantfs.toml");
    check(
        Command::new(BIN)
            .arg("--config")
            .arg(&cfg)
            .args(["config", "check"]),
    );
}

/// The value of the unit's `key=` lines whose value starts with `prefix`, without the prefix
/// (exactly one such line).
fn unit_setting(unit: &str, key: &str, prefix: &str) -> String {
    let found: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .filter_map(|v| v.strip_prefix(prefix))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{key}={prefix}... in tenantfs.service: {found:?}"
    );
    found[0].to_owned()
}

/// `path` (absolute) as it is under `prefix`: the installed layout in a temp dir.
fn under(prefix: &Path, path: &str) -> PathBuf {
    assert!(path.starts_with('/'), "{path} is not absolute");
    prefix.join(path.trim_start_matches('/'))
}

/// `make install` into a temp DESTDIR, the binary under test as the one installed (`-o
/// build`: nothing is rebuilt).
fn make_install() -> tempfile::TempDir {
    let dest = tempfile::tempdir().unwrap();
    let target = Path::new(BIN).parent().unwrap().parent().unwrap();
    check(
        Command::new("make")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["-s", "-o", "build", "install"])
            .arg(format!("DESTDIR={}", dest.path().display()))
            .arg(format!("CARGO_TARGET_DIR={}", target.display())),
    );
    dest
}

/// `tenantfs` on the data dir at `data`, no config, no credentials unless the test sets them.
fn tenantfs(data: &Path) -> Command {
    tenantfs_at(Path::new(BIN), data)
}

/// As [`tenantfs`], the binary at `bin`.
fn tenantfs_at(bin: &Path, data: &Path) -> Command {
    let mut c = Command::new(bin);
    c.env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("TENANTFS_DATA_DIR")
        .arg("--data-dir")
        .arg(data)
        .args(["--config", "/dev/null"]);
    c
}

/// What the unit's credential setup puts in `$CREDENTIALS_DIRECTORY`: a copy of `key` (a
/// file LoadCredential= found), or a newline (`None`: the unit's SetCredential= fallback).
fn credentials(dir: &Path, key: Option<&Path>) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let cred = dir.join("tenantfs-master-key");
    match key {
        Some(k) => std::fs::copy(k, &cred).map(drop).unwrap(),
        None => std::fs::write(&cred, b"\n").unwrap(),
    }
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o400)).unwrap();
    dir.to_owned()
}

/// `make install` says: `tenantfs init`, then enable the unit. The installed unit's
/// LoadCredential= must therefore read the file the installed `tenantfs init` writes for the
/// data dir the unit runs the daemon on (its Environment=TENANTFS_DATA_DIR), both paths as
/// the installed unit says, under the temp DESTDIR; and the credential systemd makes of that
/// file opens the data dir. The unit's Documentation= and ExecStart= are files `make install`
/// installed, and it sets a watchdog.
#[test]
fn installed_unit_loads_the_key_init_writes() {
    let dest = make_install();
    let unit =
        std::fs::read_to_string(dest.path().join("etc/systemd/system/tenantfs.service")).unwrap();
    let doc = unit_setting(&unit, "Documentation", "file:");
    assert!(
        under(dest.path(), &doc).is_file(),
        "Documentation=file:{doc} is not installed"
    );
    let exec = unit_setting(&unit, "ExecStart", "");
    let bin = under(dest.path(), exec.split(' ').next().unwrap());
    assert!(bin.is_file(), "ExecStart={exec}: not installed");
    // A watchdog the daemon serves (tests/it/daemon: WATCHDOG=1 every half interval).
    let watchdog = unit_setting(&unit, "WatchdogSec", "");
    assert!(
        watchdog
            .strip_suffix('s')
            .and_then(|n| n.parse::<u32>().ok())
            >= Some(10),
        "WatchdogSec={watchdog}: at least 10s, so a busy daemon is not taken for a hung one"
    );
    let data_dir = unit_setting(&unit, "Environment", "TENANTFS_DATA_DIR=");
    let credential = unit_setting(&unit, "LoadCredential", "tenantfs-master-key:");
    // The data dir whose missing key the daemon's error says the unit loads (and no other).
    let default = Path::new(tenantfs::data_dir::DEFAULT_ROOT);
    assert_eq!(Path::new(&data_dir), default);
    assert_eq!(
        Path::new(&credential),
        tenantfs::data_dir::key_file(default)
    );
    // Without the file, systemd falls back to a blank credential instead of failing the unit.
    assert_eq!(
        unit_setting(&unit, "SetCredential", "tenantfs-master-key:"),
        "\\n"
    );
    let data = under(dest.path(), &data_dir);
    let out = check(tenantfs_at(&bin, &data).arg("init"));
    let written = out
        .lines()
        .find_map(|l| l.strip_prefix("created master key "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("init named no key file it created: {out}"));
    let loaded = under(dest.path(), &credential);
    assert_eq!(
        Path::new(written),
        loaded,
        "init writes the key to {written}; the unit loads {credential} (under DESTDIR)"
    );
    assert!(loaded.is_file(), "{} is not there", loaded.display());
    // The daemon's view under the unit: the key only as the credential systemd made of it.
    let creds = credentials(&dest.path().join("creds"), Some(&loaded));
    std::fs::remove_file(&loaded).unwrap();
    check(
        tenantfs(&data)
            .env("CREDENTIALS_DIRECTORY", &creds)
            .args(["tenant", "create", "t"]),
    );
}

/// A daemon started by the unit when the key file is missing gets a blank credential: it
/// fails saying what is missing and where it looked: on a data dir never initialised, to run
/// `tenantfs init`; on one whose key is gone, to put the key back. With the key file there, a
/// blank credential is no obstacle (the data dir's key is used).
#[test]
fn daemon_without_a_key_says_where_it_looked() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    check(tenantfs(&data).arg("init"));
    let creds = credentials(&tmp.path().join("creds"), None);
    let socket = tmp.path().join("tenantfs.sock");
    // The key file is there: the blank credential is passed over.
    check(
        tenantfs(&data)
            .env("CREDENTIALS_DIRECTORY", &creds)
            .args(["tenant", "create", "t"]),
    );
    std::fs::remove_file(data.join("master.key")).unwrap();
    let err = check_fails(
        tenantfs(&data)
            .env("CREDENTIALS_DIRECTORY", &creds)
            .arg("daemon")
            .arg("--socket")
            .arg(&socket),
    );
    // Not the unit's data dir: the unit, which loads another file, goes unmentioned.
    assert!(!err.contains("tenantfs.service"), "{err}");
    for want in [
        "no master key".to_owned(),
        format!("{} (blank", creds.join("tenantfs-master-key").display()),
        format!("{} (not there)", data.join("master.key").display()),
        format!(
            "put that key file back at {}",
            data.join("master.key").display()
        ),
    ] {
        assert!(err.contains(&want), "{want:?} not in: {err}");
    }
    assert!(!socket.exists(), "the daemon served without a key");
    // `init` does not paper over it with a new key that would open nothing.
    let err = check_fails(tenantfs(&data).arg("init"));
    assert!(err.contains("no master key"), "{err}");
    assert!(
        !data.join("master.key").exists(),
        "init made a key for an initialised data dir"
    );
    // Not initialised at all (no `tenantfs init` ever): that, and what to run.
    let fresh = tmp.path().join("fresh");
    let err = check_fails(
        tenantfs(&fresh)
            .env("CREDENTIALS_DIRECTORY", &creds)
            .arg("daemon")
            .arg("--socket")
            .arg(&socket),
    );
    assert!(
        err.contains("not initialised")
            && err.contains(&format!("tenantfs --data-dir {} init", fresh.display())),
        "{err}"
    );
}
