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

/// What `tenant create NAME` (the real binary, every thread, under `strace -f -y`) did under
/// the data dir's `tenants/`: the calls that name a path (`%file`: opens, stats, mkdirs,
/// renames..., absolute or relative to a directory descriptor) and the directory reads
/// (`getdents64`). With `-y` strace writes each descriptor with the path it stands for
/// (`3</…/tenants/x>`), so a call relative to a directory descriptor (`statx(3</…/tenants>,
/// "x", …)`, `openat(4</…/tenants/x>, "y", …)`) is seen with its full path, and a directory
/// read with the directory read.
#[derive(Debug)]
struct CreateTrace {
    /// Paths of other tenants than NAME (the tenant itself, or its staging directory).
    other: Vec<String>,
    /// Paths inside NAME's own directory, `tenants/NAME/…`.
    own: Vec<String>,
    /// Calls that name `tenants/` itself or an entry right in it (any tenant's directory,
    /// NAME's included): the work done at the level where the number of tenants shows.
    at_tenants_level: usize,
    /// `getdents64` calls on `tenants/` or any directory under it, and the directory entries
    /// they returned.
    getdents: usize,
    getdents_entries: usize,
}

/// One line of strace output: its quoted strings and its descriptors' paths (`N<path>`,
/// `AT_FDCWD<cwd>`), in the order they come.
enum Piece {
    Quoted(String),
    Fd(String),
}

fn pieces(line: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    let mut prev = ' ';
    while let Some(ch) = chars.next() {
        match ch {
            '"' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => s.extend(chars.next()),
                        '"' => break,
                        c => s.push(c),
                    }
                }
                out.push(Piece::Quoted(s));
            }
            // A descriptor strace decorated with its path: `3</a/b>`, `AT_FDCWD</a>`.
            '<' if prev.is_ascii_alphanumeric() => {
                out.push(Piece::Fd(
                    chars.by_ref().take_while(|&c| c != '>').collect(),
                ));
            }
            _ => {}
        }
        prev = ch;
    }
    out
}

fn trace_create(c: &Cli, name: &str) -> CreateTrace {
    let trace = c.tmp.path().join(format!("strace-{name}"));
    let out = Command::new("strace")
        .args([
            "-f",
            "-y",
            "-s",
            "4096",
            "-e",
            "trace=%file,getdents64",
            "-o",
        ])
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
    // strace -y shows descriptors by their resolved path, the binary names paths as given.
    let given = c.data().join("tenants");
    let resolved = given.canonicalize().unwrap();
    let prefixes = [given, resolved].map(|p| p.to_str().unwrap().to_owned());
    let staging = format!(".creating-{name}-");
    let mut t = CreateTrace {
        other: Vec::new(),
        own: Vec::new(),
        at_tenants_level: 0,
        getdents: 0,
        getdents_entries: 0,
    };
    let text = std::fs::read_to_string(&trace).unwrap();
    for line in text.lines() {
        // The call's paths: descriptors' as they are; quoted ones absolute, or relative to the
        // descriptor before them (dirfd-relative calls).
        let mut dir: Option<String> = None;
        let mut paths = Vec::new();
        for piece in pieces(line) {
            match piece {
                Piece::Fd(p) => {
                    paths.push(p.clone());
                    dir = Some(p);
                }
                Piece::Quoted(p) if p.starts_with('/') => paths.push(p),
                Piece::Quoted(p) => paths.extend(dir.as_ref().map(|d| format!("{d}/{p}"))),
            }
        }
        let under: Vec<&str> = paths
            .iter()
            .filter_map(|p| prefixes.iter().find_map(|t| p.strip_prefix(t.as_str())))
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .map(|rest| rest.trim_start_matches('/'))
            .collect();
        if under.is_empty() {
            continue;
        }
        if under.iter().any(|rest| !rest.contains('/')) {
            t.at_tenants_level += 1;
        }
        if line.contains("getdents64(") {
            t.getdents += 1;
            t.getdents_entries += line
                .split("/* ")
                .nth(1)
                .and_then(|r| r.split(" entries */").next())
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no entry count in {line}"));
        }
        for rest in under {
            let first = rest.split('/').next().unwrap();
            if first == name && rest.len() > name.len() {
                t.own.push(rest.to_owned());
            } else if !first.is_empty() && first != name && !first.starts_with(&staging) {
                t.other.push(rest.to_owned());
            }
        }
    }
    t
}

/// `tenant create` reads the new tenant's own directory only: beside 1 other tenant and
/// beside 200 it names no other tenant's path, reads as many directory entries under
/// `tenants/` and does as much at the level of `tenants/` itself, so each create costs the
/// same however many tenants the host holds. That it names its own tenant's paths shows the
/// trace and its reading work (no path matched would also find no other tenant).
#[test]
fn tenant_create_reads_no_other_tenant() {
    let c = Cli::new();
    c.ok(&["init"]);
    c.ok(&["tenant", "create", "other-000"]);
    // Same-length names: the two creates do the same work on the same layout.
    let one = trace_create(&c, "new-a");
    let started = std::time::Instant::now();
    for i in 1..200 {
        c.ok(&["tenant", "create", &format!("other-{i:03}")]);
    }
    eprintln!(
        "199 tenants created in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let many = trace_create(&c, "new-b");
    eprintln!(
        "beside 1 tenant: {} own paths, {} calls at tenants/, {} getdents64 ({} entries); \
         beside 200: {} own paths, {} calls at tenants/, {} getdents64 ({} entries)",
        one.own.len(),
        one.at_tenants_level,
        one.getdents,
        one.getdents_entries,
        many.own.len(),
        many.at_tenants_level,
        many.getdents,
        many.getdents_entries
    );
    for (t, name) in [(&one, "new-a"), (&many, "new-b")] {
        // The record it wrote and read back, and the store it made: tenants/NAME/….
        assert!(
            !t.own.is_empty() && t.getdents > 0,
            "the trace of tenant create {name} names nothing inside tenants/{name}/ or reads \
             no directory there: the trace or its parsing is broken: {t:?}"
        );
        assert!(
            t.other.is_empty(),
            "tenant create {name} touched {} paths of other tenants: {:?}",
            t.other.len(),
            &t.other[..t.other.len().min(20)]
        );
    }
    // Exactly equal, no slack: both creates run the same code on the same files (same name
    // length, same block size, a fresh store each), in a process of their own with nothing
    // else on the data dir. A listing of tenants/ would add 200 entries (and getdents64
    // calls once they fill its buffer); a per-tenant step would add calls at this level.
    assert_eq!(
        (one.getdents, one.getdents_entries),
        (many.getdents, many.getdents_entries),
        "getdents64 calls (entries) under tenants/ beside 1 tenant, and beside 200"
    );
    assert_eq!(
        one.at_tenants_level, many.at_tenants_level,
        "calls naming tenants/ or an entry in it beside 1 tenant, and beside 200"
    );
    // And what it printed is the new tenant's own size: what `tenant list` reads for it.
    // Equal, no allowance for growth: the size is taken once the tenant's store is closed
    // and its directory renamed into place, and nothing writes it afterwards (the create's
    // process has exited; no daemon or mount serves this data dir), so its allocated blocks
    // cannot have changed by the time `tenant list` reads them.
    let out = c.ok(&["tenant", "create", "new-c"]);
    let printed = out
        .lines()
        .find_map(|l| l.strip_prefix("created tenant new-c ("))
        .and_then(|rest| rest.split(", ").nth(1))
        .and_then(|size| size.strip_suffix(" on disk"))
        .map(|size| {
            size.parse::<tenantfs::units::ByteSize>()
                .unwrap_or_else(|e| panic!("{size}: {e}"))
                .0
        })
        .unwrap_or_else(|| panic!("no size on disk in: {out}"));
    let list: serde_json::Value =
        serde_json::from_str(&c.ok(&["tenant", "list", "--json"])).unwrap();
    let listed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "new-c")
        .and_then(|t| t["disk_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no disk_bytes for new-c in: {list}"));
    assert!(printed > 0, "{out}");
    assert_eq!(
        printed, listed,
        "tenant create printed {out:?}; tenant list says {listed} bytes"
    );
}
