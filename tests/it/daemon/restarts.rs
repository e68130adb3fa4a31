//! The daemon killed and started again: kill -9 during synced writes (100 rounds), a
//! tenant lock still held by the exiting process, configured mounts that fail at start.

use super::*;

/// Blocks each writer owns per round: a fresh region, each block written once (in a permuted
/// order), so every acknowledged block has exactly one right content.
pub(super) const REGION_BLOCKS: u64 = 1024;

/// The content of block `block` of round `round` in tenant file `t`.
pub(super) fn block_data(t: u64, round: u64, block: u64) -> Vec<u8> {
    common::noise((t << 48) ^ (round << 24) ^ block, 4096)
}

/// Until `mp` answers with a live mount (statfs reaches the server; a dead mount answers
/// ENOTCONN) and lists its root, or `deadline`.
pub(super) fn wait_live(mp: &std::path::Path, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        if tenantfs_mounted(mp)
            && nix::sys::statfs::statfs(mp).is_ok()
            && std::fs::read_dir(mp).is_ok()
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Writes round `round`'s blocks of file `f` (4 KiB, fdatasync each) until an error (the
/// daemon was killed); returns the blocks acknowledged (the sync returned).
pub(super) fn write_until_killed(f: std::path::PathBuf, t: u64, round: u64) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let mut acked = Vec::new();
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&f)
    else {
        return acked;
    };
    for i in 0..REGION_BLOCKS {
        let block = round * REGION_BLOCKS + (i * 617) % REGION_BLOCKS;
        let ok = file
            .write_all_at(&block_data(t, round, block), block * 4096)
            .and_then(|()| file.sync_data());
        if ok.is_err() {
            break;
        }
        acked.push(block);
    }
    acked
}

/// Every acknowledged block of `acked` (round, block) in tenant file `f` has its content.
pub(super) fn verify_acked(f: &std::path::Path, t: u64, acked: &[(u64, u64)]) {
    use std::os::unix::fs::FileExt;
    if acked.is_empty() {
        return;
    }
    let file = std::fs::File::open(f).unwrap();
    let mut buf = vec![0u8; 4096];
    for &(round, block) in acked {
        file.read_exact_at(&mut buf, block * 4096).unwrap();
        assert!(
            buf == block_data(t, round, block),
            "{}: acknowledged block {block} of round {round} is not what was written",
            f.display()
        );
    }
}

/// The restart race: 100 rounds of kill -9 of the daemon during fsync'd random writes to two
/// configured tenants; after each restart both are mounted again within 5 s and every
/// acknowledged write is there. (A restarted daemon used to take a just-killed mount for a live
/// one while the kernel still had the root's attributes cached, refuse it as "already
/// mounted" and skip the configured tenant.)
#[test]
fn kill9_during_synced_writes_then_restart_100_rounds() {
    let h = Host::new("kill100");
    let mps = [h.dir("ma"), h.dir("mb")];
    let h = h.with_config(&format!(
        "[[mount]]\ntenant = \"a\"\nmountpoint = \"{}\"\n\
         [[mount]]\ntenant = \"b\"\nmountpoint = \"{}\"\n",
        mps[0].display(),
        mps[1].display()
    ));
    h.create_tenant("a");
    h.create_tenant("b");
    // Whatever is mounted there at the end (or at a panic) is unmounted.
    let _guards = (h.guard("a", &mps[0], 0), h.guard("b", &mps[1], 0));
    let notify = h.root().join("notify");
    let mut acked: [Vec<(u64, u64)>; 2] = [Vec::new(), Vec::new()];
    let mut slowest = Duration::ZERO;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let rounds = 100;
    for round in 0..=rounds {
        let started = Instant::now();
        let mut d = start_daemon(&h, &notify);
        for mp in &mps {
            assert!(
                wait_live(mp, started + Duration::from_secs(5)),
                "round {round}: {} not mounted 5 s after the restart; daemon log:\n{}",
                mp.display(),
                std::fs::read_to_string(h.root().join("daemon.log")).unwrap_or_default()
            );
        }
        slowest = slowest.max(started.elapsed());
        let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap_or_default();
        assert!(
            !log.contains("cannot mount"),
            "round {round}: a configured mount failed its first attempt:\n{log}"
        );
        // The last round's writes after each restart; all of them after the last one.
        for (t, mp) in mps.iter().enumerate() {
            let last: Vec<(u64, u64)> = if round == rounds {
                acked[t].clone()
            } else {
                acked[t]
                    .iter()
                    .copied()
                    .filter(|&(r, _)| r + 1 == round)
                    .collect()
            };
            verify_acked(&mp.join("f"), t as u64, &last);
        }
        if round == rounds {
            break;
        }
        let writers: Vec<_> = mps
            .iter()
            .enumerate()
            .map(|(t, mp)| {
                let f = mp.join("f");
                std::thread::spawn(move || write_until_killed(f, t as u64, round))
            })
            .collect();
        // Someone looks at the mountpoints (`ls -ld`): the kernel now caches their roots'
        // attributes for the TTL, past the kill below.
        for mp in &mps {
            std::fs::metadata(mp).unwrap();
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(seed % 300));
        d.0.kill().unwrap();
        d.0.wait().unwrap();
        for (t, w) in writers.into_iter().enumerate() {
            acked[t].extend(w.join().unwrap().into_iter().map(|b| (round, b)));
        }
    }
    let total = acked[0].len() + acked[1].len();
    assert!(total > 1000, "only {total} writes were acknowledged");
    eprintln!(
        "{rounds} kill -9 rounds: {total} acknowledged writes kept; slowest remount {slowest:?}"
    );
}

/// Holds tenant `t`'s lock from a python process; `fork_and_exit`: the locker clones a child
/// that shares its descriptor table (so the lock stays, as a killed process's does while its
/// threads finish) for `secs`, and exits itself at once: a holder that is going away, the
/// lock still naming the exited locker. Both leave by `os._exit`: python's own exit would
/// close the shared descriptor. Returns the locker's pid.
pub(super) fn hold_tenant_lock(h: &Host, t: &str, fork_and_exit: bool, secs: f64) -> u32 {
    let lock = h.data.join(tenantfs::tenant_lock::LOCK_FILE);
    // clone(CLONE_FILES | SIGCHLD) with no stack of its own (56 on x86_64, 220 on aarch64):
    // fork, sharing the descriptors.
    let script = format!(
        "import ctypes, fcntl, os, platform, sys, time\n\
         f = open({lock:?}, 'a'); fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {offset})\n\
         print(os.getpid(), flush=True)\n\
         if {fork}:\n    libc = ctypes.CDLL(None, use_errno=True)\n\
         \x20   if libc.syscall({{'x86_64': 56, 'aarch64': 220}}[platform.machine()], 0x400 | 17, 0, 0, 0, 0) == 0:\n        time.sleep({secs})\n\
         else:\n    time.sleep({secs})\n\
         os._exit(0)\n",
        lock = lock.to_str().unwrap(),
        offset = tenantfs::tenant_lock::offset_of(t),
        fork = if fork_and_exit { "True" } else { "False" },
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid = line.trim().parse().unwrap();
    if fork_and_exit {
        child.wait().unwrap();
    } else {
        std::mem::forget(child); // it exits by itself after `secs`
    }
    pid
}

/// A tenant whose lock a live process holds is refused at once, naming that process; one
/// whose holder is going away is waited for (one log line) and then mounted.
#[test]
fn a_tenant_lock_held_by_an_exiting_process_is_waited_for() {
    let h = Host::new("lockwait");
    let mp = h.dir("m");
    h.create_tenant("t");
    let d = start_daemon(&h, &h.root().join("notify"));
    let live = hold_tenant_lock(&h, "t", false, 3.0);
    let t0 = Instant::now();
    let err = h.fails(&["mount", "t", mp.to_str().unwrap()]);
    assert!(
        err.contains(&format!("in use by process {live} (python3")),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "a live holder was waited for"
    );
    assert!(wait_gone(live, Duration::from_secs(10)));

    let exited = hold_tenant_lock(&h, "t", true, 1.5);
    let t0 = Instant::now();
    h.ok(&["mount", "t", mp.to_str().unwrap()]);
    let waited = t0.elapsed();
    let _g = h.guard("t", &mp, d.0.id());
    assert!(
        waited >= Duration::from_secs(1),
        "mounted after {waited:?} while the lock was held"
    );
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    let said: Vec<_> = log
        .lines()
        .filter(|l| l.contains("waiting for an exiting process"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains(&format!("pid={exited}")), "{log}");
}

/// A configured mount that cannot be mounted when the daemon starts (here its mountpoint is
/// missing) is not skipped: the daemon reports it (log, `stats`, systemd STATUS=) and retries
/// it until it mounts.
#[test]
fn a_configured_mount_that_fails_at_start_is_reported_and_retried() {
    let h = Host::new("retry");
    let ma = h.root().join("later");
    let h = h.with_config(&format!(
        "[[mount]]\ntenant = \"a\"\nmountpoint = \"{}\"\n",
        ma.display()
    ));
    h.create_tenant("a");
    let (d, notify) = start_daemon_env(&h, &h.root().join("notify"), &[]);
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).expect("no STATUS= after READY=1");
    let status = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        status.starts_with("STATUS=serving 0 mounts; not mounted yet: a at")
            && status.contains("does not exist"),
        "{status}"
    );
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    let waiting = &st["waiting_mounts"][0];
    assert_eq!(waiting["tenant"], "a", "{st}");
    assert!(
        waiting["error"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{st}"
    );
    let table = h.ok(&["stats"]);
    assert!(table.contains("not mounted yet"), "{table}");
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(
        log.contains("cannot mount a configured tenant; retrying"),
        "{log}"
    );

    std::fs::create_dir(&ma).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tenantfs_mounted(&ma) {
        assert!(
            Instant::now() < deadline,
            "the configured mount was not retried"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _g = h.guard("a", &ma, d.0.id());
    std::fs::write(ma.join("f"), b"x").unwrap();
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    assert_eq!(st["waiting_mounts"].as_array().unwrap().len(), 0, "{st}");
    let n = notify.recv(&mut buf).expect("no STATUS= after the retry");
    assert_eq!(&buf[..n], b"STATUS=serving 1 mounts");
}
