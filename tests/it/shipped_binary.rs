//! The binary users get is not the test build. The tests run a `tenantfs` with the kill -9
//! tests' crash points (the `failpoints` feature); `make build` and `make install` ship one
//! without them, which holds no failpoint registry and does not obey `FAILPOINTS`. `make
//! test` builds that binary first, as `make build` does, and names its copy in
//! `TENANTFS_SHIPPED_BIN`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::process::{check, output, BIN};

/// The binary `cargo build --release --bins` made without test features.
fn shipped_binary() -> PathBuf {
    let path = std::env::var_os("TENANTFS_SHIPPED_BIN").unwrap_or_else(|| {
        panic!(
            "TENANTFS_SHIPPED_BIN is not set: it names a copy of the binary that \
             `cargo build --release --bins` builds without test features (make test sets it)"
        )
    });
    let path = PathBuf::from(path);
    assert!(path.is_file(), "no binary at {}", path.display());
    path
}

/// The failpoint registry's symbols in `bin` (demangled names of the fail crate's types).
fn failpoint_symbols(bin: &Path) -> Vec<String> {
    let out = check(Command::new("nm").arg("--demangle").arg(bin));
    out.lines()
        .filter(|l| l.contains("fail::FailPoint") || l.contains("fail::REGISTRY"))
        .map(str::to_owned)
        .collect()
}

/// `tenantfs` at `bin` run on `data` with `FAILPOINTS` set to panic at every store cipher call.
fn with_failpoints(bin: &Path, data: &Path, args: &[&str]) -> std::process::Output {
    output(
        Command::new(bin)
            .env_remove("CREDENTIALS_DIRECTORY")
            .env("FAILPOINTS", "store-cipher=panic")
            .arg("--data-dir")
            .arg(data)
            .args(["--config", "/dev/null"])
            .args(args),
    )
}

#[test]
fn shipped_binary_has_no_failpoints() {
    let shipped = shipped_binary();
    // The test build holds the registry, so the check below can fail.
    let test_build = failpoint_symbols(Path::new(BIN));
    assert!(
        !test_build.is_empty(),
        "the test build of {BIN} has no failpoint registry: the tests are not built with \
         `--features failpoints`, or its symbols were renamed"
    );
    let found = failpoint_symbols(&shipped);
    assert!(
        found.is_empty(),
        "the shipped binary {} holds the failpoint registry (a test feature): {:?}",
        shipped.display(),
        &found[..found.len().min(5)]
    );

    // And it behaves so: FAILPOINTS stops the test build at its first store write, not the
    // shipped binary.
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-shipped-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let data = tmp.path().join("data");
    check(
        Command::new(&shipped)
            .env_remove("CREDENTIALS_DIRECTORY")
            .arg("--data-dir")
            .arg(&data)
            .args(["--config", "/dev/null", "init"]),
    );
    let test_run = with_failpoints(Path::new(BIN), &data, &["tenant", "create", "a"]);
    assert!(
        !test_run.status.success(),
        "the test build ignored FAILPOINTS=store-cipher=panic"
    );
    let shipped_run = with_failpoints(&shipped, &data, &["tenant", "create", "b"]);
    assert!(
        shipped_run.status.success(),
        "the shipped binary obeyed FAILPOINTS: {}",
        String::from_utf8_lossy(&shipped_run.stderr)
    );
}
