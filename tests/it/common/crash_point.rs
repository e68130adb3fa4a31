//! Crash points: a crash test's child process stops at a named failpoint of the library (the
//! `fail` crate, armed by tenantfs's `failpoints` feature, which `make test` turns on) and says
//! so on stdout; the parent, reading the child's lines, kills it -9 there. The kill lands
//! where the test names, every run, where a sleep before the kill landed wherever the
//! machine's speed put it.

use std::io::BufRead;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The line a parked child prints.
pub const PARKED: &str = "PARKED";

/// Arms failpoint `name` in this process: its `nth` hit (from 1), among the hits for which
/// `counts()` holds, prints [`PARKED`] on stdout and parks the thread that hit it for good (the
/// parent kills the process). Other hits, before and after, pass through.
pub fn park_at(name: &str, nth: u64, counts: impl Fn() -> bool + Send + Sync + 'static) {
    assert!(
        fail::has_failpoints(),
        "crash tests need the crash points: run the tests with `--features failpoints` (make test does)"
    );
    let hits = AtomicU64::new(0);
    fail::cfg_callback(name, move || {
        if counts() && hits.fetch_add(1, Ordering::Relaxed) + 1 == nth {
            park_here();
        }
    })
    .unwrap();
}

/// Prints [`PARKED`] on stdout and parks the calling thread for good (the parent kills the
/// process): a crash point of the child's own, where no failpoint is needed.
pub fn park_here() -> ! {
    let mut out = std::io::stdout().lock();
    std::io::Write::write_all(&mut out, format!("{PARKED}\n").as_bytes()).unwrap();
    std::io::Write::flush(&mut out).unwrap();
    drop(out);
    loop {
        std::thread::park();
    }
}

/// Waits until `child` (its stdout piped) parks at its crash point, kills it -9 there and
/// reaps it; returns the lines it printed, [`PARKED`] last. Panics, naming what the child
/// printed, if it ends or takes over two minutes before it parks.
pub fn kill_when_parked(child: &mut Child) -> Vec<String> {
    let seen = ChildLines::of(child).until_parked(Duration::from_secs(120));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    seen
}

/// A child's stdout, its own lines one by one, read on a thread of its own so that waiting
/// for a line can time out.
struct ChildLines(mpsc::Receiver<String>);

impl ChildLines {
    /// Takes `child`'s (piped) stdout.
    fn of(child: &mut Child) -> Self {
        let out = child.stdout.take().expect("the child's stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                // libtest's own lines, and the `test name ... ` it prints before the first
                // line of the test's output, are not the child's.
                let line = match line.split_once(" ... ") {
                    Some((test, rest)) if test.starts_with("test ") => rest.to_owned(),
                    _ => line,
                };
                if line.is_empty() || line.starts_with("running ") {
                    continue;
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildLines(rx)
    }

    /// The lines up to and including the first [`PARKED`]; panics (naming what the child
    /// printed) if the child ends or takes longer than `timeout` before it parks.
    fn until_parked(&self, timeout: Duration) -> Vec<String> {
        let t0 = Instant::now();
        let mut seen = Vec::new();
        loop {
            let left = timeout.saturating_sub(t0.elapsed());
            match self.0.recv_timeout(left) {
                Ok(line) => {
                    let parked = line == PARKED;
                    seen.push(line);
                    if parked {
                        return seen;
                    }
                }
                Err(e) => {
                    panic!("the child did not reach its crash point ({e:?}); it printed {seen:?}")
                }
            }
        }
    }
}
