//! The host daemon through the real binary: READY=1 on a NOTIFY_SOCKET the test listens on,
//! two tenants mounted through it with `tenantfs mount`, I/O, one cache for both, SIGTERM
//! unmounts both and exits 0; kill -9, restart: the configured mounts come back with their
//! data; a non-root client is refused by the control socket.

use crate::common;
use crate::common::guards::{enable_fuse_uring, small_ext4, tenantfs_mounted};
use crate::common::mount::{start_daemon, start_daemon_env, start_daemon_logging_to, Host};
use crate::common::process::{alive, check, cmd, request_as_nobody, wait_gone};
use crate::common::trees::{set_xattr, write_synced, xattrs};

use std::time::{Duration, Instant};

#[test]
fn daemon_serves_two_tenants_and_stops_cleanly() {
    let (ma, mb);
    let h = {
        let h = Host::new("daemon");
        ma = h.dir("ma");
        mb = h.dir("mb");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = format!(
            "[pressure]\ninterval_ms = 200\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n\
             [[mount]]\ntenant = \"a\"\nmountpoint = \"{}\"\n",
            ma.display()
        );
        h.with_config(&cfg)
    };
    h.create_tenant("a");
    h.create_tenant("b");
    let notify = h.root().join("notify");
    let mut d = start_daemon(&h, &notify);
    let pid = d.0.id();
    // a came from the config; b is mounted through the daemon by `tenantfs mount`.
    assert!(tenantfs_mounted(&ma), "the configured mount is missing");
    let out = h.ok(&["mount", "b", mb.to_str().unwrap()]);
    assert!(
        out.contains(&format!("served by the daemon, pid {pid}")),
        "{out}"
    );
    let _guards = (h.guard("a", &ma, pid), h.guard("b", &mb, pid));
    std::fs::write(ma.join("hello"), b"from a").unwrap();
    std::fs::write(mb.join("hello"), b"from b").unwrap();
    assert_eq!(std::fs::read(ma.join("hello")).unwrap(), b"from a");
    assert_eq!(std::fs::read(mb.join("hello")).unwrap(), b"from b");
    // One process, one cache for both.
    let s: serde_json::Value = serde_json::from_str(&h.ok(&["cache", "stats", "--json"])).unwrap();
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{s}");
    assert_eq!(procs[0]["pid"].as_u64(), Some(pid as u64));
    // Per-tenant operations and host numbers: `tenantfs stats` and the metrics endpoint.
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    let mounts = st["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 2, "{st}");
    for m in mounts {
        assert!(m["ops"]["write"]["calls"].as_u64().unwrap() >= 1, "{st}");
        assert!(m["written_bytes"].as_u64().unwrap() >= 6, "{st}");
        assert!(m["ops"]["read"]["calls"].as_u64().unwrap() >= 1, "{st}");
    }
    let table = h.ok(&["stats"]);
    assert!(
        table.contains("2 mounts") && table.contains(ma.to_str().unwrap()),
        "{table}"
    );
    let cfg_text = std::fs::read_to_string(&h.config).unwrap();
    let listen = cfg_text
        .lines()
        .find_map(|l| l.strip_prefix("listen = "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let mut conn = std::net::TcpStream::connect(&listen).unwrap();
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut conn, &mut body).unwrap();
    assert!(
        body.contains("tenantfs_ops_total{tenant=\"a\",op=\"write\"}"),
        "{body}"
    );
    assert!(
        body.contains("tenantfs_written_bytes_total{tenant=\"b\"}"),
        "{body}"
    );
    assert!(body.contains("tenantfs_mounts 2"), "{body}");
    // OpenMetrics: HELP and TYPE lines name the family, a counter's sample ends in _total,
    // and the text ends in # EOF.
    for want in [
        "# HELP tenantfs_cache_hits ",
        "# TYPE tenantfs_cache_hits counter",
        "\ntenantfs_cache_hits_total ",
        "Content-Type: application/openmetrics-text",
    ] {
        assert!(body.contains(want), "{want:?} not in {body}");
    }
    assert!(body.ends_with("# EOF\n"), "{body}");
    let err = h.fails(&["mount", "a", mb.to_str().unwrap()]);
    assert!(
        err.contains("already mounted") || err.contains("in use"),
        "{err}"
    );
    // SIGTERM: both unmounted, exit 0.
    d.terminate_cleanly(&[&ma, &mb]);
    // The data was flushed: a plain mount reads it back.
    let m = h.mount("b", &mb, "");
    assert_eq!(std::fs::read(m.join("hello")).unwrap(), b"from b");
    m.umount();
}

#[test]
fn kill9_then_restart_brings_the_mounts_back() {
    let h = Host::new("daemonkill");
    let ma = h.dir("ma");
    let h = h.with_config(&format!(
        "[[mount]]\ntenant = \"a\"\nmountpoint = \"{}\"\n",
        ma.display()
    ));
    h.create_tenant("a");
    let notify = h.root().join("notify");
    let mut d = start_daemon(&h, &notify);
    let data = common::noise(9, 3 << 20);
    write_synced(&ma.join("f"), &data);
    d.0.kill().unwrap();
    d.0.wait().unwrap();
    // The mount is dead now; a restarted daemon detaches it and mounts the tenant again.
    let d2 = start_daemon(&h, &notify);
    let _g = h.guard("a", &ma, d2.0.id());
    assert!(tenantfs_mounted(&ma));
    assert_eq!(std::fs::read(ma.join("f")).unwrap(), data);
    // A non-root client gets a refusal from the control socket itself (file modes opened so
    // that only the peer-credential check stands in the way).
    use std::os::unix::fs::PermissionsExt;
    for p in [h.root(), h.data.as_path(), &h.data.join("tenantfs.sock")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let out = request_as_nobody(&h.data.join("tenantfs.sock"), r#"{"op":"stats"}"#);
    assert!(out.contains("permission denied"), "{out}");
    std::fs::set_permissions(&h.data, std::fs::Permissions::from_mode(0o700)).unwrap();
    h.ok(&["umount", ma.to_str().unwrap()]);
    assert!(!tenantfs_mounted(&ma));
}

#[test]
fn watchdog_pings_while_the_daemon_answers() {
    let h = Host::new("watchdog");
    let notify = h.root().join("notify");
    let (d, listener) = start_daemon_env(&h, &notify, &[("WATCHDOG_USEC", "200000")]);
    let mut buf = [0u8; 512];
    let t = Instant::now();
    // STATUS= lines may come first.
    let n = loop {
        let n = listener
            .recv(&mut buf)
            .expect("no WATCHDOG=1 after READY=1");
        if !buf[..n].starts_with(b"STATUS=") {
            break n;
        }
    };
    assert_eq!(&buf[..n], b"WATCHDOG=1");
    assert!(t.elapsed() < Duration::from_secs(5));
    drop(d);
}

/// VmRSS of `pid`, bytes.
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .map(|kib: u64| kib << 10)
        .expect("VmRSS")
}

/// Tenants that come and go do not ratchet the daemon's memory up: what 20 mounts took is
/// mostly given back once they are unmounted (closed stores' malloc'd pages are returned,
/// not kept by glibc for reuse).
#[test]
fn unmounting_gives_the_mounts_memory_back() {
    let h = Host::new("daemonrss");
    let names: Vec<String> = (0..20).map(|i| format!("r{i}")).collect();
    for n in &names {
        h.create_tenant(n);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_of(pid);
    let mps: Vec<_> = names.iter().map(|n| h.dir(&format!("m-{n}"))).collect();
    let _guards: Vec<_> = names
        .iter()
        .zip(&mps)
        .map(|(n, mp)| {
            h.ok(&["mount", n, mp.to_str().unwrap()]);
            std::fs::write(mp.join("f"), n.as_bytes()).unwrap();
            h.guard(n, mp, pid)
        })
        .collect();
    let mounted = rss_of(pid);
    for mp in &mps {
        h.ok(&["umount", mp.to_str().unwrap()]);
    }
    let after = rss_of(pid);
    let cost = mounted.saturating_sub(idle);
    let kept = after.saturating_sub(idle);
    assert!(
        cost > 20 * (100 << 10),
        "20 mounts cost only {cost} bytes of RSS"
    );
    assert!(
        kept * 2 < cost,
        "unmounting kept {kept} of the {cost} bytes the mounts took (idle {idle}, mounted \
         {mounted}, after {after})"
    );
}

/// A log the daemon cannot write (stderr on a full disk: here /dev/full, which answers every
/// write with ENOSPC) costs log lines, never the daemon. The damaged tenant's store logs its
/// warning from inside RocksDB's cipher callback, an `extern "C"` frame where the panic that a
/// failed log write used to raise aborted the process and every mount with it.
#[test]
fn a_log_that_cannot_be_written_is_not_fatal() {
    let h = Host::new("fulllog");
    let ma = h.dir("ma");
    let mb = h.dir("mb");
    h.create_tenant("a");
    h.create_tenant("b");
    // Damage the key header of b's MANIFEST: opening b fails inside the cipher callback.
    let db = h.data.join("tenants/b/db");
    let manifest = std::fs::read_dir(&db)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("MANIFEST")
        })
        .expect("a MANIFEST");
    let mut bytes = std::fs::read(&manifest).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&manifest, &bytes).unwrap();

    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let (d, _notify) = start_daemon_logging_to(
        &h,
        &h.root().join("notify"),
        &[("TENANTFS_LOG", "debug")],
        full.into(),
    );
    let pid = d.0.id();
    h.ok(&["mount", "a", ma.to_str().unwrap()]);
    let _g = h.guard("a", &ma, pid);
    write_synced(&ma.join("f"), b"still here");
    let err = h.fails(&["mount", "b", mb.to_str().unwrap()]);
    assert!(err.contains("header"), "{err}");
    assert!(
        alive(pid),
        "the daemon died on a log line it could not write"
    );
    assert_eq!(std::fs::read(ma.join("f")).unwrap(), b"still here");
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    assert!(st["log_lines_dropped"].as_u64().unwrap() > 0, "{st}");
}

/// An idle mounted tenant holds at most 1 MiB of disk beyond its data (its WAL and MANIFEST
/// are preallocated in small steps; they were 64 MiB and 4 MiB), and `tenant list` reports
/// the disk it really takes (allocated, not file sizes).
#[test]
fn idle_mounted_tenants_hold_little_disk() {
    let h = Host::new("idledisk");
    let names = ["i0", "i1", "i2"];
    for n in names {
        h.create_tenant(n);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let _guards: Vec<_> = names
        .iter()
        .map(|n| {
            let mp = h.dir(&format!("m-{n}"));
            h.ok(&["mount", n, mp.to_str().unwrap()]);
            h.guard(n, &mp, d.0.id())
        })
        .collect();
    // One of them used once: 4 KiB written and synced.
    write_synced(&h.root().join("m-i2/f"), &[7u8; 4096]);
    for n in names {
        let bytes = h.disk_bytes(n);
        let allocated: u64 = walk_allocated(&h.data.join("tenants").join(n));
        assert_eq!(bytes, allocated, "tenant list must report allocated disk");
        assert!(
            bytes <= (1 << 20) + 4096,
            "idle mounted tenant {n} holds {bytes} bytes of disk"
        );
    }
}

/// Allocated bytes (st_blocks) of the files under `dir`.
fn walk_allocated(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk_allocated(&e.path())
            } else {
                m.blocks() * 512
            }
        })
        .sum()
}

/// Blocks each writer owns per round: a fresh region, each block written once (in a permuted
/// order), so every acknowledged block has exactly one right content.
const REGION_BLOCKS: u64 = 1024;

/// The content of block `block` of round `round` in tenant file `t`.
fn block_data(t: u64, round: u64, block: u64) -> Vec<u8> {
    common::noise((t << 48) ^ (round << 24) ^ block, 4096)
}

/// Until `mp` answers with a live mount (statfs reaches the server; a dead mount answers
/// ENOTCONN) and lists its root, or `deadline`.
fn wait_live(mp: &std::path::Path, deadline: Instant) -> bool {
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
fn write_until_killed(f: std::path::PathBuf, t: u64, round: u64) -> Vec<u64> {
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
fn verify_acked(f: &std::path::Path, t: u64, acked: &[(u64, u64)]) {
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

/// Holds tenant `t`'s lock from a python process; `fork_and_exit`: the locker forks a child
/// that keeps the descriptor for `secs` and exits itself at once (a holder that is going
/// away: /proc/locks still names the exited locker). Returns the locker's pid.
fn hold_tenant_lock(h: &Host, t: &str, fork_and_exit: bool, secs: f64) -> u32 {
    let lock = h.data.join("tenants").join(t).join("tenant.lock");
    let script = format!(
        "import fcntl, os, sys, time\n\
         f = open({lock:?}, 'a'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
         print(os.getpid(), flush=True)\n\
         if {fork} and os.fork() == 0:\n    time.sleep({secs}); os._exit(0)\n\
         if not {fork}: time.sleep({secs})\n",
        lock = lock.to_str().unwrap(),
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

/// Stats of the mount of `tenant` in `stats --json`.
fn mount_stats(h: &Host, tenant: &str) -> serde_json::Value {
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    st["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tenant"] == tenant)
        .unwrap_or_else(|| panic!("no mount of {tenant} in {st}"))
        .clone()
}

/// A full disk is one tenant's error, never the daemon's end. The data dir is on a small
/// loop-mounted ext4 (the log elsewhere); tenant a writes until the disk is full: the daemon
/// stays up, b and c keep serving reads, a's writes fail with ENOSPC, `stats` shows a
/// read-only and every store still on O_DIRECT. Space is freed (a ballast file deleted): a
/// takes writes again by itself, without a remount, and every acknowledged write is there.
#[test]
fn a_full_disk_stops_one_tenant_until_space_is_freed() {
    // Memtables of at most 16 MiB: what a stopped store must write out to take writes again.
    let mut h = Host::new("diskfull").with_config("[store]\nwrite_buffers = \"16M\"\n");
    let (fs, _fs) = small_ext4(h.root(), 128 << 20);
    h.data = fs.join("data");
    h.ok(&["init"]);
    let names = ["a", "b", "c"];
    let mps: Vec<_> = names.iter().map(|n| h.dir(&format!("m{n}"))).collect();
    for n in names {
        h.create_tenant(n);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let _guards: Vec<_> = names
        .iter()
        .zip(&mps)
        .map(|(n, mp)| {
            h.ok(&["mount", n, mp.to_str().unwrap()]);
            h.guard(n, mp, pid)
        })
        .collect();
    let b_data = common::noise(2, 1 << 20);
    write_synced(&mps[1].join("kept"), &b_data);
    std::fs::create_dir(mps[2].join("dir")).unwrap();
    // Room to give back later.
    let ballast = fs.join("ballast");
    std::fs::write(&ballast, vec![1u8; 48 << 20]).unwrap();

    // a writes 1 MiB chunks, each synced, until the disk is full.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mps[0].join("big"))
        .unwrap();
    let chunk = |i: u64| common::noise(1000 + i, 1 << 20);
    let mut acked = 0u64;
    let err = loop {
        match f
            .write_all_at(&chunk(acked), acked << 20)
            .and_then(|()| f.sync_data())
        {
            Ok(()) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 1024, "the disk never filled up");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(acked > 10, "only {acked} MiB acknowledged");
    assert!(alive(pid), "the daemon died on a full disk");
    // The others keep serving reads; a still refuses writes.
    assert_eq!(std::fs::read(mps[1].join("kept")).unwrap(), b_data);
    assert!(mps[2].join("dir").is_dir());
    assert_eq!(std::fs::read_dir(&mps[2]).unwrap().count(), 1);
    let again = f
        .write_all_at(&[9u8; 4096], acked << 20)
        .and_then(|()| f.sync_data())
        .expect_err("a wrote to a full disk");
    assert_eq!(again.raw_os_error(), Some(libc::ENOSPC), "{again}");
    let a = mount_stats(&h, "a");
    assert_eq!(a["store"]["state"], "no_space", "{a}");
    for n in names {
        assert_eq!(
            mount_stats(&h, n)["direct_io"],
            true,
            "{n} fell back to buffered I/O"
        );
    }
    let table = h.ok(&["stats"]);
    assert!(table.contains("tenant a is read-only"), "{table}");
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(!log.contains("buffered I/O"), "{log}");
    assert_eq!(log.matches("tenant is read-only").count(), 1, "{log}");

    // Space comes back: a takes writes again without a remount.
    std::fs::remove_file(&ballast).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = f
            .write_all_at(&chunk(acked), acked << 20)
            .and_then(|()| f.sync_data());
        if ok.is_ok() {
            acked += 1;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a takes no writes 30 s after space was freed: {ok:?}; stats: {}",
            mount_stats(&h, "a")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(mount_stats(&h, "a")["store"]["state"], "writable");
    let mut back = vec![0u8; 1 << 20];
    for i in 0..acked {
        f.read_exact_at(&mut back, i << 20).unwrap();
        assert!(
            back == chunk(i),
            "acknowledged MiB {i} of a is not what was written"
        );
    }
}

/// Python's open() asks isatty() (an ioctl) of every file; select.poll and copy_file_range
/// reach the filesystem too. None of them leaves a warning in the daemon's log (fuser's
/// defaults logged "[Not Implemented]" for each), and the mount table shows the filesystem as
/// `fuse.tenantfs`.
#[test]
fn python_file_io_leaves_no_warnings_and_the_mount_type_is_fuse_tenantfs() {
    let h = Host::new("pyio");
    let mp = h.dir("m");
    h.create_tenant("t");
    let (d, _notify) = start_daemon_env(&h, &h.root().join("notify"), &[("TENANTFS_LOG", "info")]);
    h.ok(&["mount", "t", mp.to_str().unwrap()]);
    let _g = h.guard("t", &mp, d.0.id());
    let listed = check(&mut cmd(
        "findmnt",
        &[
            "-n",
            "-r",
            "-t",
            "fuse.tenantfs",
            "-o",
            "FSTYPE,SOURCE",
            "--mountpoint",
            mp.to_str().unwrap(),
        ],
    ));
    assert_eq!(
        listed.trim(),
        "fuse.tenantfs tenantfs:t",
        "findmnt -t fuse.tenantfs"
    );
    let script = format!(
        "import os, select\n\
         d = {dir:?}\n\
         for i in range(20):\n\
         \x20   with open(f'{{d}}/f{{i}}', 'w') as f: f.write('x' * i)\n\
         \x20   with open(f'{{d}}/f{{i}}') as f: assert f.read() == 'x' * i\n\
         fd = os.open(f'{{d}}/f19', os.O_RDONLY)\n\
         assert not os.isatty(fd)\n\
         p = select.poll(); p.register(fd, select.POLLIN); assert p.poll(1000)\n\
         out = os.open(f'{{d}}/copy', os.O_WRONLY | os.O_CREAT, 0o644)\n\
         n = 0\n\
         while n < 19: n += os.copy_file_range(fd, out, 19 - n)\n\
         os.close(out); os.close(fd)\n\
         assert open(f'{{d}}/copy').read() == 'x' * 19\n",
        dir = mp.to_str().unwrap()
    );
    check(&mut cmd("python3", &["-c", &script]));
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(
        log.contains("mounted"),
        "the log is not at info level: {log}"
    );
    assert!(!log.contains("Not Implemented"), "{log}");
}

/// Threads of `pid` whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .count()
}

/// FUSE over io_uring through the daemon: a mount with transport=uring answers its requests
/// on per-CPU ring queues (`stats` counts them), one with transport=dev only over /dev/fuse;
/// unmounting ends the queue threads; a transport the kernel lacks or a misspelt one is a
/// clear error.
#[test]
fn io_uring_and_dev_fuse_transports_serve_side_by_side() {
    enable_fuse_uring();
    let h = Host::new("transport");
    let (mr, md) = (h.dir("ring"), h.dir("dev"));
    h.create_tenant("r");
    h.create_tenant("d");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    h.ok(&["mount", "-o", "transport=uring", "r", mr.to_str().unwrap()]);
    h.ok(&["mount", "-o", "transport=dev", "d", md.to_str().unwrap()]);
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let possible = cpus
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum::<usize>();
    assert_eq!(
        threads_named(pid, "fuse-ring-"),
        possible,
        "one queue per CPU"
    );
    for m in [&mr, &md] {
        std::fs::create_dir(m.join("dir")).unwrap();
        std::fs::write(m.join("dir/f"), vec![5u8; 300_000]).unwrap();
        std::fs::rename(m.join("dir/f"), m.join("g")).unwrap();
        assert_eq!(std::fs::read(m.join("g")).unwrap(), vec![5u8; 300_000]);
        set_xattr(&m.join("g"), "user.k", b"v");
        assert_eq!(
            xattrs(&m.join("g")).get(&b"user.k"[..]).map(|v| &v[..]),
            Some(&b"v"[..])
        );
        std::os::unix::fs::symlink("g", m.join("s")).unwrap();
        assert_eq!(std::fs::read_link(m.join("s")).unwrap().to_str(), Some("g"));
        let names: Vec<_> = std::fs::read_dir(m)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        std::fs::remove_file(m.join("s")).unwrap();
        std::fs::remove_dir(m.join("dir")).unwrap();
    }
    // A 1 MiB write from a buffer 16 bytes into a page (where malloc puts large buffers)
    // spans 257 pages: one request on either transport (max_write 2 MiB asks for 512 pages;
    // the kernel allows what fs.fuse.max_pages_limit does, which `make test` raises), not
    // 1 MiB - 16 bytes and then 16 bytes.
    let limit: u32 = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(256);
    assert!(
        limit >= 257,
        "fs.fuse.max_pages_limit is {limit}: run `make test`, or as root \
         `echo 512 > /proc/sys/fs/fuse/max_pages_limit`"
    );
    let mut buf = vec![0u8; (1 << 20) + 8192];
    let skip = 4096 - buf.as_ptr() as usize % 4096 + 16;
    buf[skip..skip + (1 << 20)].fill(9);
    for (m, t) in [(&mr, "r"), (&md, "d")] {
        let calls = || {
            mount_stats(&h, t)["ops"]["write"]["calls"]
                .as_u64()
                .unwrap()
        };
        let before = calls();
        std::fs::write(m.join("big"), &buf[skip..skip + (1 << 20)]).unwrap();
        assert_eq!(calls(), before + 1, "{t}: a 1 MiB write came in pieces");
        assert_eq!(std::fs::read(m.join("big")).unwrap(), vec![9u8; 1 << 20]);
        std::fs::remove_file(m.join("big")).unwrap();
    }
    let (r, dv) = (mount_stats(&h, "r"), mount_stats(&h, "d"));
    assert!(r["ring_requests"].as_u64().unwrap() >= 15, "{r}");
    assert_eq!(dv["ring_requests"].as_u64(), Some(0), "{dv}");
    assert!(r["ops"]["write"]["calls"].as_u64().unwrap() >= 1, "{r}");
    h.ok(&["umount", mr.to_str().unwrap()]);
    let t = Instant::now();
    while threads_named(pid, "fuse-ring-") > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "ring threads outlive their mount"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The data written over the ring is there after a remount over /dev/fuse.
    h.ok(&["mount", "-o", "transport=dev", "r", mr.to_str().unwrap()]);
    assert_eq!(std::fs::read(mr.join("g")).unwrap(), vec![5u8; 300_000]);
    let err = h.fails(&[
        "mount",
        "-o",
        "transport=carrier-pigeon",
        "r",
        h.dir("x").to_str().unwrap(),
    ]);
    assert!(err.contains("transport=uring"), "{err}");
    d.terminate_cleanly(&[&mr, &md]);
}

/// A ring queue that cannot submit (failpoint: its io_uring refuses the queue thread, EEXIST)
/// after FUSE over io_uring was negotiated: the kernel would hold every request until all
/// queues register, so the queue turns the ring off for that mount and it serves over
/// /dev/fuse; nothing hangs, nothing is lost.
#[test]
fn a_ring_queue_that_cannot_submit_falls_back_to_dev_fuse() {
    enable_fuse_uring();
    let h = Host::new("ringfail");
    let m = h.dir("m");
    h.create_tenant("f");
    let notify = h.root().join("notify");
    let (mut d, _n) = start_daemon_env(&h, &notify, &[("TENANTFS_FAILPOINTS", "fuse-ring-submit")]);
    h.ok(&["mount", "-o", "transport=uring", "f", m.to_str().unwrap()]);
    std::fs::write(m.join("a"), b"still served").unwrap();
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"still served");
    assert_eq!(mount_stats(&h, "f")["ring_requests"].as_u64(), Some(0));
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(
        log.contains("FUSE over io_uring turned off for this mount: serving over /dev/fuse"),
        "{log}"
    );
    d.terminate_cleanly(&[&m]);
}
