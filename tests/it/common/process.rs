//! Processes: running commands (the `tenantfs` binary, shell scripts) and checking how they
//! ended, whether a process is alive, the daemon as a child; and this test binary run again
//! as a child process, for crash tests (a child killed in the middle of its work) and for
//! tests that measure the process itself (RSS), which the other tests' threads in this one
//! binary would disturb.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The name libtest knows a test by (`module::function`, without the binary's crate name),
/// from `module_path!()` at the test and the function's name.
pub fn test_path(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// This binary, to run only `test` (a [`test_path`]) on one thread, its output not captured.
pub fn this_binary_running(test: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test binary"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    c
}

/// Set in the child that [`alone_in_a_process`] starts.
const ALONE: &str = "TENANTFS_TEST_ALONE";

/// Runs `test` alone in a child process of this binary, unless this is that child. In the
/// child, returns true: the test goes on. In the parent, asserts that the child ran the test
/// and passed, and returns false: the test is done.
pub fn alone_in_a_process(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let out = this_binary_running(test)
        .env(ALONE, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} alone in a process: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// At the start of a test that measures this process: runs the test alone in a child
/// process, and returns from the test in the parent once the child passed.
#[macro_export]
macro_rules! alone_in_a_process {
    ($test:literal) => {
        if !$crate::common::process::alone_in_a_process(&$crate::common::process::test_path(
            module_path!(),
            $test,
        )) {
            return;
        }
    };
}

pub const BIN: &str = env!("CARGO_BIN_EXE_tenantfs");

/// Runs `cmd`, returns its output (spawn failures panic with the program name).
pub fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}

fn show(cmd: &Command, out: &Output) -> String {
    format!(
        "{cmd:?}: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, asserts it succeeded, returns stdout.
pub fn check(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(out.status.success(), "{}", show(cmd, &out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd`, asserts it failed, returns stderr.
pub fn check_fails(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(!out.status.success(), "succeeded: {}", show(cmd, &out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `prog args...` as a Command.
pub fn cmd(prog: &str, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args);
    c
}

/// Runs a shell snippet; asserts success; returns stdout.
pub fn sh(script: &str) -> String {
    check(Command::new("sh").args(["-c", script]))
}

/// Whether a task's stat line shows it running (not a zombie or dead).
fn task_runs(stat: &str) -> bool {
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.trim_start())
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Whether process `pid` still runs: any of its threads is not yet a zombie. (Its leader turns
/// zombie before the other threads are done; until the last one exits, the process still holds
/// its files and locks. A zombie holds none, and nobody may reap it here.)
pub fn alive(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| task_runs(&s)))
}

pub fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Sends one JSON request line to the control socket at `socket` as uid/gid 65534 (python3
/// through setpriv) and returns the response line: what a non-root client gets.
pub fn request_as_nobody(socket: &Path, request: &str) -> String {
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); \
         s.sendall({:?}.encode() + b'\\n'); print(s.makefile().readline())",
        socket.to_str().unwrap(),
        request
    );
    check(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/python3",
        "-c",
        &script,
    ]))
}
