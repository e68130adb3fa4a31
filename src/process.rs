//! Other processes as /proc shows them: whether a process is going away, what it runs.
//!
//! A tenant's lock names its holder's pid ([`crate::tenant_lock::holder`]); a holder that is
//! exiting (killed, its threads still releasing their files) is worth a short wait, a live
//! one is named in the refusal.

use std::fs;

/// Whether process `pid` is gone or going away: no such process, every thread a zombie, or a
/// SIGKILL pending (its threads are on their way out).
pub fn going_away(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    let running = tasks.flatten().any(|t| {
        fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            // "pid (comm) S ...": the state follows the last ')'.
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start())
                .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
        })
    });
    !running || kill_pending(pid)
}

/// Whether SIGKILL is pending for the process (its shared pending mask, /proc/PID/status).
fn kill_pending(pid: u32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("ShdPnd:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGKILL - 1)) != 0)
}

/// The command line of `pid` for one line of a message: the program's file name, then its
/// arguments, whitespace collapsed, at most 60 characters ("?" if the process is gone).
pub fn command(pid: u32) -> String {
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(raw) => one_line(&raw),
        Err(_) => "?".to_owned(),
    }
}

/// A NUL-separated command line as [`command`] shows it.
fn one_line(raw: &[u8]) -> String {
    const MAX: usize = 60;
    let mut args = raw.split(|&c| c == 0).filter(|a| !a.is_empty());
    let Some(program) = args.next() else {
        return "?".to_owned();
    };
    let program = String::from_utf8_lossy(program);
    let mut line = program.rsplit('/').next().unwrap_or(&program).to_owned();
    for a in args {
        line.push(' ');
        line.push_str(&String::from_utf8_lossy(a));
    }
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_fit_one_line() {
        assert_eq!(
            one_line(b"/usr/bin/python3\0-c\0import os\n  x = 1\n\0"),
            "python3 -c import os x = 1"
        );
        assert_eq!(one_line(b""), "?");
        let long = one_line(&[b"a\0".as_slice(), &[b'x'; 100]].concat());
        assert_eq!(long.len(), 63);
        assert!(long.ends_with("..."));
    }

    #[test]
    fn tells_live_exited_and_zombie_processes_apart() {
        assert!(!going_away(std::process::id()));
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!going_away(pid));
        // spawn returns once the child left the parent's memory in execve, a moment before
        // the kernel has set up the new program's arguments.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while command(pid) == "?" && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(command(pid), "sleep 30");
        child.kill().unwrap();
        // Killed but not reaped: a zombie, which holds no files.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !going_away(pid) {
            assert!(std::time::Instant::now() < deadline, "{pid} still running");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(going_away(pid));
        assert_eq!(command(pid), "?");
    }
}
