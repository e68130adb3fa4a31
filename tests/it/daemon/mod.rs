//! The host daemon through the real binary: READY=1 on a NOTIFY_SOCKET the test listens on,
//! two tenants mounted through it with `tenantfs mount`, I/O, one cache for both, SIGTERM
//! unmounts both and exits 0; kill -9, restart: the configured mounts come back with their
//! data; a non-root client is refused by the control socket, and a non-root `stats` is told
//! permission denied, not that the daemon is not running; WATCHDOG=1 keeps coming while the
//! daemon answers (and not for another pid's WATCHDOG_PID).

use crate::common;
use crate::common::guards::{enable_fuse_uring, small_ext4, tenantfs_mounted};
use crate::common::mount::{
    start_daemon, start_daemon_env, start_daemon_logging_to, start_daemon_under, Host,
};
use crate::common::process::{alive, check, check_fails, cmd, request_as_nobody, wait_gone};
use crate::common::trees::{set_xattr, write_synced, xattrs};

use std::time::{Duration, Instant};

mod cold_reads;
mod crew;
mod disk;
mod dormant;
mod idle;
mod limits;
mod quotas;
mod restarts;
mod transports;

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

/// The datagrams `listener` receives within `window` (STATUS= lines included).
fn notifications(listener: &std::os::unix::net::UnixDatagram, window: Duration) -> Vec<String> {
    let end = Instant::now() + window;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        listener.set_read_timeout(Some(left)).unwrap();
        match listener.recv(&mut buf) {
            Ok(n) => got.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => panic!("notify socket: {e}"),
        }
    }
    got
}

/// With `WatchdogSec=` (WATCHDOG_USEC 400 ms), WATCHDOG=1 comes every half interval after
/// READY=1, again and again while the daemon answers its own socket, and goes on after the
/// socket file is deleted: the daemon still answers (through the socket it holds), and
/// systemd must not kill a healthy daemon for a file gone.
#[test]
fn watchdog_pings_while_the_daemon_answers() {
    let h = Host::new("watchdog");
    let notify = h.root().join("notify");
    let (mut d, listener) = start_daemon_env(&h, &notify, &[("WATCHDOG_USEC", "400000")]);
    let got = notifications(&listener, Duration::from_secs(2));
    let pings = got.iter().filter(|m| *m == "WATCHDOG=1").count();
    // Every 200 ms: about 10 in 2 s; 3 leaves room for a slow machine.
    assert!(pings >= 3, "{pings} WATCHDOG=1 in 2 s: {got:?}");
    std::fs::remove_file(h.data.join("tenantfs.sock")).unwrap();
    let got = notifications(&listener, Duration::from_secs(2));
    let pings = got.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(
        pings >= 3,
        "{pings} WATCHDOG=1 in 2 s once tenantfs.sock was deleted: {got:?}"
    );
    // Going down, the watchdog stops with the socket, without a false alarm.
    d.terminate_cleanly(&[]);
    let log = std::fs::read_to_string(h.root().join("daemon.log")).unwrap();
    assert!(!log.contains("does not answer itself"), "{log}");
}

/// WATCHDOG_PID names another process (the variables were inherited, not meant for this
/// one): the daemon sends no WATCHDOG=1.
#[test]
fn no_watchdog_for_another_pid() {
    let h = Host::new("watchdogpid");
    let notify = h.root().join("notify");
    let (d, listener) = start_daemon_env(
        &h,
        &notify,
        &[("WATCHDOG_USEC", "400000"), ("WATCHDOG_PID", "1")],
    );
    let got = notifications(&listener, Duration::from_millis(1500));
    assert!(
        !got.iter().any(|m| m == "WATCHDOG=1"),
        "WATCHDOG=1 for WATCHDOG_PID=1: {got:?}"
    );
    drop(d);
}

/// `tenantfs ARGS` as uid/gid 65534 on the data dir at `data`: its stderr (it must fail).
fn as_nobody(data: &std::path::Path, args: &[&str]) -> String {
    let out = check_fails(
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(crate::common::process::BIN)
            .arg("--data-dir")
            .arg(data)
            .args(["--config", "/dev/null"])
            .args(args),
    );
    assert!(!out.contains("panicked"), "{out}");
    out
}

/// Who may use a control socket, in the one wording the client (connect refused by file
/// modes) and the server (peer credentials) both give.
const WHO_MAY_CONNECT: &str =
    "the control socket takes requests from root and the serving process's own user only";

/// A daemon that runs but may not be talked to is not one that is not running: `stats` as
/// another user says permission denied and to run as root, whether the data dir (0700) or
/// the socket itself (0600) stands in the way, and the server's own refusal (modes opened)
/// says who may connect in the same words; with the daemon killed (its socket file left) or
/// its socket gone, `stats` says it is not running. A `run/` directory another user cannot
/// list is called that, not a control socket.
#[test]
fn stats_tells_permission_denied_from_not_running() {
    use std::os::unix::fs::PermissionsExt;
    let h = Host::new("daemonperm");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let socket = h.data.join("tenantfs.sock");
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    for data_mode in [0o700, 0o711] {
        mode(&h.data, data_mode);
        let err = as_nobody(&h.data, &["stats"]);
        assert!(
            err.contains("permission denied")
                && err.contains(socket.to_str().unwrap())
                && err.contains(WHO_MAY_CONNECT)
                && err.contains("run this as root"),
            "data dir mode {data_mode:o}: {err}"
        );
        assert!(
            !err.contains("not running"),
            "data dir mode {data_mode:o}: {err}"
        );
    }
    // Only the peer-credential check in the way: the server's refusal, in the same words.
    mode(&socket, 0o666);
    let err = as_nobody(&h.data, &["stats"]);
    assert!(
        err.contains("permission denied") && err.contains(WHO_MAY_CONNECT),
        "refused by the server: {err}"
    );
    mode(&socket, 0o600);
    mode(&h.data, 0o700);
    assert!(h.ok(&["stats"]).contains("daemon pid"));
    d.0.kill().unwrap();
    d.0.wait().unwrap();
    assert!(socket.exists(), "the killed daemon's socket file is gone");
    for case in ["socket file left (ECONNREFUSED)", "no socket file (ENOENT)"] {
        let err = h.fails(&["stats"]);
        assert!(
            err.contains("not running") && err.contains("tenantfs daemon"),
            "{case}: {err}"
        );
        let _ = std::fs::remove_file(&socket);
    }
    // No daemon; the per-mount sockets' directory is root's (0700): `cache stats` as another
    // user cannot list it, and says so about a directory.
    let run = h.data.join("run");
    std::fs::create_dir_all(&run).unwrap();
    mode(&run, 0o700);
    mode(&h.data, 0o711);
    let err = as_nobody(&h.data, &["cache", "stats"]);
    mode(&h.data, 0o700);
    assert!(
        err.contains(&format!("permission denied listing {}", run.display()))
            && err.contains("directory where the processes serving mounts put their control")
            && err.contains("run this as root"),
        "{err}"
    );
    assert!(
        !err.contains(WHO_MAY_CONNECT) && !err.contains("not running"),
        "{err}"
    );
}

/// VmRSS of `pid`, bytes.
pub(super) fn rss_of(pid: u32) -> u64 {
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

/// Stats of the mount of `tenant` in `stats --json`.
/// Mounts each of `tenants` at `m-NAME` in the temp dir through daemon `d`; guards for them.
fn mount_each(
    h: &Host,
    d: &common::guards::Daemon,
    tenants: &[&str],
) -> Vec<common::guards::Mount> {
    tenants
        .iter()
        .map(|n| {
            let mp = h.dir(&format!("m-{n}"));
            h.ok(&["mount", n, mp.to_str().unwrap()]);
            h.guard(n, &mp, d.0.id())
        })
        .collect()
}

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
