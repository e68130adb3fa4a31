//! The shipped systemd units pass `systemd-analyze verify` (with ExecStart pointed at the
//! binary under test), and the shipped example config passes `tenantfs config check`.

use crate::common::process::{check, BIN};
use std::path::Path;
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
