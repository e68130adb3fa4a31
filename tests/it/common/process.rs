//! This test binary run again as a child process: for crash tests (a child killed in the
//! middle of its work) and for tests that measure the process itself (RSS), which the other
//! tests' threads in this one binary would disturb.

use std::process::{Command, Stdio};

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
