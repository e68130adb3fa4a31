//! The host cache as an operator meets it: `tenantfs cache stats|release|budget` acting on the
//! process that serves a real mount, the control socket refusing other users (real peer
//! credentials), and the governor in a real memory-capped cgroup (v1 here) with a memory hog
//! beside the server: the cache shrinks, nothing is OOM-killed, every read stays correct.

use crate::common;
use crate::common::cgroup;
use crate::common::mount::Host;
use crate::common::process::{alive, check_fails, request_as_nobody, BIN};
use crate::common::trees::write_synced;
use cgroup::Cgroup;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::noise;

const MIB: u64 = 1 << 20;

fn stats(h: &Host) -> serde_json::Value {
    serde_json::from_str(&h.ok(&["cache", "stats", "--json"])).unwrap()
}

fn blake(path: &Path) -> blake3::Hash {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut f, &mut h).unwrap();
    h.finalize()
}

/// Writes `len` bytes of noise to `rel` in a fresh mount, unmounts (so the data is flushed to
/// SSTs, whose blocks are what the cache holds) and returns the content's hash.
fn write_and_flush(h: &Host, tenant: &str, mp: &Path, len: usize) -> blake3::Hash {
    let m = h.mount(tenant, mp, "");
    let data = noise(7, len);
    write_synced(&m.join("big"), &data);
    m.umount();
    blake3::hash(&data)
}

#[test]
fn cache_commands_act_on_the_serving_process() {
    let h = Host::new("cachecli");
    let err = h.fails(&["cache", "stats"]);
    assert!(
        err.contains("no tenantfs process is serving mounts"),
        "{err}"
    );
    h.create_tenant("alpha");
    let mp = h.dir("mp");
    let want = write_and_flush(&h, "alpha", &mp, 96 << 20);
    let m = h.mount("alpha", &mp, "");
    assert_eq!(blake(&m.join("big")), want);
    let s = stats(&h);
    let p = &s["processes"][0];
    assert_eq!(p["pid"].as_u64(), Some(m.pid as u64), "{s}");
    for key in [
        "budget_bytes",
        "used_bytes",
        "resident_bytes",
        "hits",
        "misses",
        "evictions",
        "released_bytes",
    ] {
        assert!(s[key].is_u64(), "{key} missing in {s}");
    }
    assert_eq!(
        s["budget_bytes"].as_u64(),
        Some(512 * MIB),
        "default budget: {s}"
    );
    assert!(
        s["used_bytes"].as_u64().unwrap() >= 90 * MIB,
        "the read filled the cache: {s}"
    );
    assert!(s["misses"].as_u64().unwrap() > 0);
    // Read again: served from the cache.
    assert_eq!(blake(&m.join("big")), want);
    let s2 = stats(&h);
    assert!(s2["hits"].as_u64() > s["hits"].as_u64(), "{s2}");

    let out = h.ok(&["cache", "release", "32M"]);
    assert!(out.contains("released"), "{out}");
    let s3 = stats(&h);
    let released = s3["released_bytes"].as_u64().unwrap() - s2["released_bytes"].as_u64().unwrap();
    assert!(released >= 30 * MIB, "released only {released}: {out}");
    assert!(s3["used_bytes"].as_u64().unwrap() + 30 * MIB <= s2["used_bytes"].as_u64().unwrap());
    assert_eq!(
        s3["budget_bytes"], s2["budget_bytes"],
        "release keeps the budget"
    );

    h.ok(&["cache", "budget", "48M"]);
    let s4 = stats(&h);
    assert_eq!(s4["budget_bytes"].as_u64(), Some(48 * MIB), "{s4}");
    assert_eq!(s4["ceiling_bytes"].as_u64(), Some(48 * MIB), "{s4}");
    assert!(s4["used_bytes"].as_u64().unwrap() <= 48 * MIB, "{s4}");
    // Reads stay right with the smaller cache.
    assert_eq!(blake(&m.join("big")), want);
    let text = h.ok(&["cache", "stats"]);
    assert!(
        text.contains("budget 48 MiB") && text.contains("tenant alpha"),
        "{text}"
    );
    // Another user is told the socket is root's, not that nothing is serving.
    let mut other = Command::new("setpriv");
    other
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "--data-dir",
        ])
        .arg(&h.data)
        .args(["cache", "stats"]);
    let err = check_fails(&mut other);
    assert!(err.contains("run this as root"), "{err}");
    let bad = h.fails(&["cache", "budget", "lots"]);
    assert!(bad.contains("invalid size"), "{bad}");
    m.umount();
    let err = h.fails(&["cache", "release", "1M"]);
    assert!(
        err.contains("no tenantfs process is serving mounts"),
        "{err}"
    );
}

#[test]
fn control_socket_refuses_other_users() {
    use tenantfs::control::{Client, Server};
    use tenantfs::host::{Role, ServingHost};
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = tmp.path().join("run").join("t.sock");
    // A real serving host (data dir, key, host cache, governor) answers on the socket.
    let host = |budget: &str| {
        let root = tmp.path().join(format!("data-{budget}"));
        tenantfs::data_dir::DataDir::init(&root, None).unwrap();
        let data = tenantfs::data_dir::DataDir::open(&root, None).unwrap();
        let config = tenantfs::config::Config::parse(
            &format!("[cache]\nbudget = \"{budget}\"\n"),
            Path::new("t.toml"),
        )
        .unwrap();
        let host = Arc::new(ServingHost::start(data, &config, Role::Daemon).unwrap());
        let handler: tenantfs::control::Handler = Arc::new(move |req| host.handle(req));
        handler
    };
    let server = Server::start(&path, host("64M")).unwrap();
    let mode = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    // Root is served.
    let client = Client::new(&path);
    assert_eq!(client.cache_stats().unwrap().cache.budget_bytes, 64 << 20);
    // Open the file modes so that only the peer-credential check stands in the way.
    for p in [tmp.path(), path.parent().unwrap(), &path] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    }
    let out = request_as_nobody(&path, r#"{"op":"cache_budget","bytes":1}"#);
    assert!(out.contains("permission denied"), "{out}");
    assert_eq!(
        client.cache_stats().unwrap().cache.budget_bytes,
        64 << 20,
        "a refused request changed nothing"
    );
    // A second server on a live socket is refused; after drop the socket is gone.
    assert!(Server::start(&path, host("16M")).is_err());
    drop(server);
    assert!(!path.exists());
}

#[test]
fn governor_shrinks_the_cache_in_a_capped_cgroup() {
    // The server runs in a 640 MiB cgroup with a 1 GiB cache budget (above the limit). Its
    // cache fills with 320 MiB of blocks (the governor may already hold the budget under the
    // limit); then a memory hog in the same cgroup takes 360 MiB. The governor must shrink the
    // cache so that the hog fits: no OOM kill, the server stays up, every read stays correct.
    let h = Host::new("cgroup")
        .with_config("[cache]\nbudget = \"1G\"\n[pressure]\ninterval_ms = 100\n");
    let Some(cg) = Cgroup::new("governor", 640 * MIB) else {
        return;
    };
    h.create_tenant("alpha");
    let mp = h.dir("mp");
    let want = write_and_flush(&h, "alpha", &mp, 320 << 20);
    let mut c = cg.command(BIN);
    c.env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("TENANTFS_DATA_DIR")
        .env("TENANTFS_LOG", "tenantfs=info")
        .arg("--data-dir")
        .arg(&h.data)
        .arg("--config")
        .arg(&h.config);
    let m = h.mount_with(c, "alpha", &mp, "");
    let in_cgroup = cg.file("cgroup.procs");
    assert!(
        in_cgroup.lines().any(|l| l.trim() == m.pid.to_string()),
        "server not in the cgroup: {in_cgroup}"
    );
    assert_eq!(blake(&m.join("big")), want);
    let before = stats(&h);
    assert!(
        before["used_bytes"].as_u64().unwrap() >= 300 * MIB,
        "{before}"
    );
    let shrinks =
        |s: &serde_json::Value| s["processes"][0]["governor"]["shrinks"].as_u64().unwrap();

    // The hog: 8 MiB more every 50 ms up to 360 MiB, each page touched; holds it 2 s.
    let hog = cg
        .command("python3")
        .args([
            "-c",
            "import time\nheld = []\nfor _ in range(45):\n    held.append(bytearray(b'x' * (8 << 20)))\n    time.sleep(0.05)\ntime.sleep(2)\nprint('hog done')",
        ])
        .output()
        .unwrap();
    let hog_out = String::from_utf8_lossy(&hog.stdout);
    assert!(
        hog.status.success() && hog_out.contains("hog done"),
        "hog died: {:?} {hog_out}",
        hog.status
    );
    assert_eq!(cg.oom_kills(), 0, "something was OOM-killed");
    assert!(alive(m.pid), "the server died");
    let after = stats(&h);
    assert!(
        shrinks(&after) > shrinks(&before),
        "the hog caused no shrink: {after}"
    );
    assert!(
        after["budget_bytes"].as_u64().unwrap() < 640 * MIB,
        "{after}"
    );
    assert!(
        after["used_bytes"].as_u64().unwrap() < before["used_bytes"].as_u64().unwrap(),
        "{after}"
    );
    let log = std::fs::read_to_string(h.data.join("tenants/alpha/mount.log")).unwrap_or_default();
    assert!(
        log.contains("cache budget shrunk"),
        "no decision logged: {log}"
    );
    // Still correct, and the cache grows back towards its ceiling once the hog is gone.
    assert_eq!(blake(&m.join("big")), want);
    let t = Instant::now();
    while stats(&h)["processes"][0]["governor"]["grows"]
        .as_u64()
        .unwrap_or(0)
        == 0
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "budget never grew back: {}",
            stats(&h)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    m.umount();
}

/// A directory listed, then its small files read in listing order (`tar c`, `cp -a`): the
/// first file's read warms the files after it in one background multi-get, so they come
/// from the cache instead of a disk read each. The listing alone fetches no file data.
#[test]
fn reading_a_listed_directory_in_order_warms_its_next_small_files() {
    const FILES: u64 = 24;
    const NEIGHBOURS: u64 = 64;
    // Large enough that the file data dwarfs the inode records the listing reads (spread
    // over more blocks by the empty files between them).
    const LEN: usize = 48 << 10;
    let h = Host::new("listwarm");
    h.create_tenant("t");
    let mp = h.dir("mp");
    let m = h.mount("t", &mp, "");
    std::fs::create_dir(m.join("d")).unwrap();
    std::fs::create_dir(m.join("pad")).unwrap();
    for i in 0..FILES {
        write_synced(&m.join(&format!("d/f{i:02}")), &noise(i, LEN));
        // Empty files between them: no two listed files are created next to each other, so
        // only the listing can warm them (not the warming of a cold file's neighbours).
        for j in 0..NEIGHBOURS {
            std::fs::File::create(m.join(&format!("pad/{i}-{j}"))).unwrap();
        }
    }
    m.umount(); // the files go to the store's files; the next process starts cold
    let m = h.mount("t", &mp, "");
    let used = || stats(&h)["used_bytes"].as_u64().unwrap();
    let before_listing = used();
    let listed: Vec<_> = std::fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(listed.len() as u64, FILES);
    let data_bytes = FILES * LEN as u64;
    assert!(
        used() - before_listing < data_bytes / 4,
        "listing fetched file data: {} bytes",
        used() - before_listing
    );
    let seed = |p: &Path| -> u64 {
        p.file_name().unwrap().to_str().unwrap()[1..]
            .parse()
            .unwrap()
    };
    assert_eq!(
        std::fs::read(&listed[0]).unwrap(),
        noise(seed(&listed[0]), LEN)
    );
    // The warming runs in the background: wait until the cache holds the files after it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while used() - before_listing < data_bytes * 3 / 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let misses = stats(&h)["misses"].as_u64().unwrap();
    for p in &listed[1..] {
        assert_eq!(
            std::fs::read(p).unwrap(),
            noise(seed(p), LEN),
            "{}",
            p.display()
        );
    }
    let missed = stats(&h)["misses"].as_u64().unwrap() - misses;
    assert_eq!(missed, 0, "reads of warmed files that missed the cache");
}

/// Small files read in an order of their own, with no listing (`git checkout` reads its loose
/// objects by hash, from many directories): the first one read from the disk warms the small
/// files created next to it, so the others come from the cache.
#[test]
fn a_small_file_read_cold_warms_the_files_created_next_to_it() {
    use std::os::unix::fs::MetadataExt;
    const FILES: u64 = 40;
    const LEN: usize = 12 << 10;
    let h = Host::new("nbwarm");
    h.create_tenant("t");
    let mp = h.dir("mp");
    let path = |root: &Path, i: u64| root.join(format!("d{}/f{i:02}", i % 4));
    let m = h.mount("t", &mp, "");
    for d in 0..4 {
        std::fs::create_dir(m.join(&format!("d{d}"))).unwrap();
    }
    for i in 0..FILES {
        write_synced(&path(&mp, i), &noise(i, LEN));
    }
    let inos: Vec<u64> = (0..FILES)
        .map(|i| std::fs::metadata(path(&mp, i)).unwrap().ino())
        .collect();
    assert!(
        inos.iter().all(|i| i / 64 == inos[0] / 64),
        "the files are meant to be one group of 64 inode numbers: {inos:?}"
    );
    m.umount(); // the files go to the store's files; the next process starts cold
    let _m = h.mount("t", &mp, "");
    // Names and attributes first (no file data): only the reads below are measured.
    for i in 0..FILES {
        assert_eq!(std::fs::metadata(path(&mp, i)).unwrap().len(), LEN as u64);
    }
    let used = || stats(&h)["used_bytes"].as_u64().unwrap();
    let before = used();
    let order: Vec<u64> = (0..FILES).map(|k| (k * 17) % FILES).collect();
    assert_eq!(
        std::fs::read(path(&mp, order[0])).unwrap(),
        noise(order[0], LEN)
    );
    // The warming runs in the background: wait until the cache holds the other files.
    let data_bytes = FILES * LEN as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while used() - before < data_bytes * 3 / 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let misses = stats(&h)["misses"].as_u64().unwrap();
    for &i in &order[1..] {
        assert_eq!(
            std::fs::read(path(&mp, i)).unwrap(),
            noise(i, LEN),
            "file {i}"
        );
    }
    let missed = stats(&h)["misses"].as_u64().unwrap() - misses;
    assert_eq!(
        missed, 0,
        "reads of the warmed neighbours that missed the cache"
    );
}
