//! The command line contract: init, keys, tenant create/list/delete and their errors; what a
//! command about one tenant reads does not grow with the number of other tenants.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

struct Cli {
    tmp: tempfile::TempDir,
}

impl Cli {
    fn new() -> Self {
        Self {
            tmp: tempfile::Builder::new()
                .prefix("tenantfs-cli-")
                .tempdir_in("/var/tmp")
                .unwrap(),
        }
    }

    fn data(&self) -> std::path::PathBuf {
        self.tmp.path().join("data")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_tenantfs"))
            .env("TENANTFS_DATA_DIR", self.data())
            .env_remove("CREDENTIALS_DIRECTORY")
            .args(["--config", "/dev/null"])
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8(out.stderr).unwrap()
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_create_list_delete() {
    let c = Cli::new();
    let out = c.ok(&["init"]);
    assert!(out.contains("created master key"), "{out}");
    let key = c.data().join("master.key");
    assert_eq!(mode(&key), 0o600);
    assert_eq!(std::fs::read(&key).unwrap().len(), 32);
    // Idempotent, and keeps the key.
    let before = std::fs::read(&key).unwrap();
    assert!(c.ok(&["init"]).contains("already initialised"));
    assert_eq!(std::fs::read(&key).unwrap(), before);

    c.ok(&["tenant", "create", "alpha"]);
    c.ok(&["tenant", "create", "beta", "--block-size", "64K"]);
    let json: serde_json::Value =
        serde_json::from_str(&c.ok(&["tenant", "list", "--json"])).unwrap();
    let names: Vec<_> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert_eq!(json[1]["block_size"], 65536);
    assert!(json[0]["disk_bytes"].as_u64().unwrap() > 4096);
    assert!(c.ok(&["tenant", "list"]).contains("alpha"));

    let err = c.fails(&["tenant", "create", "alpha"]);
    assert!(err.contains("already exists"), "{err}");
    c.ok(&["tenant", "delete", "alpha"]);
    let err = c.fails(&["tenant", "delete", "alpha"]);
    assert!(err.contains("unknown tenant alpha"), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&c.ok(&["tenant", "list", "--json"])).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1);
    // Nothing staged or half-deleted is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(c.data().join("tenants"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers, ["beta"]);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let c = Cli::new();
    let err = c.fails(&["tenant", "create", "alpha"]);
    assert!(
        err.contains("not initialised") && err.contains("init"),
        "{err}"
    );
    c.ok(&["init"]);
    for (name, want) in [
        ("../x", "invalid tenant name"),
        (".x", "invalid tenant name"),
    ] {
        let err = c.fails(&["tenant", "create", name]);
        assert!(err.contains(want), "{err}");
    }
    let err = c.fails(&["tenant", "create", "x", "--block-size", "1000"]);
    assert!(err.contains("power of two"), "{err}");
    let err = c.fails(&["tenant", "create", "x", "--block-size", "lots"]);
    assert!(err.contains("invalid size"), "{err}");
    assert!(c.ok(&["tenant", "list", "--json"]).trim() == "[]");
}

#[test]
fn key_files_are_checked() {
    let c = Cli::new();
    let key = c.tmp.path().join("mk");
    std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let k = key.to_str().unwrap();
    let err = c.fails(&["--master-key", k, "init"]);
    assert!(err.contains("chmod 600"), "{err}");
    assert!(!c.data().join("master.check").exists(), "init half-done");

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    c.ok(&["--master-key", k, "init"]);
    assert!(
        !c.data().join("master.key").exists(),
        "made a key although one was given"
    );
    c.ok(&["--master-key", k, "tenant", "create", "t1"]);

    // Wrong key: clear error, nothing changes.
    let wrong = c.tmp.path().join("wrong");
    std::fs::write(&wrong, [7u8; 32]).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = common::snapshot(&c.data());
    for args in [
        &["tenant", "create", "t2"][..],
        &["tenant", "delete", "t1"],
        &["init"],
    ] {
        let mut full = vec!["--master-key", wrong.to_str().unwrap()];
        full.extend_from_slice(args);
        let err = c.fails(&full);
        assert!(err.contains("not the key"), "{err}");
    }
    assert_eq!(common::snapshot(&c.data()), before);

    // Bad content.
    std::fs::write(&wrong, b"short").unwrap();
    let err = c.fails(&[
        "--master-key",
        wrong.to_str().unwrap(),
        "tenant",
        "create",
        "t3",
    ]);
    assert!(err.contains("32 raw bytes or 64 hex"), "{err}");

    // systemd credential.
    let creds = c.tmp.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::copy(&key, creds.join("tenantfs-master-key")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenantfs"))
        .env("TENANTFS_DATA_DIR", c.data())
        .env("CREDENTIALS_DIRECTORY", &creds)
        .args(["--config", "/dev/null", "tenant", "create", "t4"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn config_check_reports_line() {
    let c = Cli::new();
    let cfg = c.tmp.path().join("t.toml");
    std::fs::write(&cfg, "[cache]\nbudget = \"1G\"\nbogus = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenantfs"))
        .args(["--config", cfg.to_str().unwrap(), "config", "check"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3") && err.contains("bogus"), "{err}");
}

/// The paths under the data dir's `tenants/` that `tenant create NAME` (the real binary,
/// every thread, under `strace -f -e trace=%file`: opens, stats, renames...) names and that
/// belong to other tenants than NAME.
fn other_tenants_touched(c: &Cli, name: &str) -> Vec<String> {
    let trace = c.tmp.path().join(format!("strace-{name}"));
    let out = Command::new("strace")
        .args(["-f", "-s", "4096", "-e", "trace=%file", "-o"])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_tenantfs"))
        .env("TENANTFS_DATA_DIR", c.data())
        .env_remove("CREDENTIALS_DIRECTORY")
        .args(["--config", "/dev/null", "tenant", "create", name])
        .output()
        .expect("strace (make deps installs it)");
    assert!(
        out.status.success(),
        "tenant create {name} under strace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tenants = format!("{}/", c.data().join("tenants").display());
    let own = |first: &str| first == name || first.starts_with(&format!(".creating-{name}-"));
    std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        // A syscall's quoted strings are every other piece between quotes.
        .flat_map(|l| {
            l.split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|p| {
            p.strip_prefix(&tenants)
                .and_then(|rest| rest.split('/').next())
                .is_some_and(|first| !first.is_empty() && !own(first))
        })
        .collect()
}

/// `tenant create` reads the new tenant's own directory only: with 1 other tenant and with
/// 200, it touches the same number of other tenants' paths (none), so each create costs the
/// same however many tenants the host holds.
#[test]
fn tenant_create_reads_no_other_tenant() {
    let c = Cli::new();
    c.ok(&["init"]);
    c.ok(&["tenant", "create", "other-000"]);
    let with_one = other_tenants_touched(&c, "new-a");
    let started = std::time::Instant::now();
    for i in 1..200 {
        c.ok(&["tenant", "create", &format!("other-{i:03}")]);
    }
    eprintln!(
        "199 tenants created in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let with_many = other_tenants_touched(&c, "new-b");
    assert_eq!(
        with_one.len(),
        with_many.len(),
        "tenant create touched {} paths of other tenants with 1 other tenant, {} with 201: {:?}",
        with_one.len(),
        with_many.len(),
        &with_many[..with_many.len().min(20)]
    );
    // And what it printed is the new tenant's own size.
    let out = c.ok(&["tenant", "create", "new-c"]);
    assert!(
        out.contains("created tenant new-c") && out.contains("on disk"),
        "{out}"
    );
}
