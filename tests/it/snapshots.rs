//! Snapshots through the real binary: of a tenant mounted through the daemon while a writer
//! fsyncs records into it (the restore holds every record synced before the call, and
//! nothing written after it) and while fio runs a verify job in it (the restore and the forks
//! hold a prefix of fio's blocks that fio's own verify passes, from every block synced before
//! the call to none written after), of a closed tenant, and the refusals (restore while
//! mounted, unknown names, a name taken twice).

use std::io::BufRead;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::mount::{start_daemon, Host};
use crate::common::noise;
use crate::common::process::cmd;
use crate::common::trees::write_synced;

/// Appends 64 KiB records (record i: its number in 8 digits, over and over) to `log`,
/// fsyncing each and printing its number once it is synced.
const WRITER: &str = r#"
import os, sys
fd = os.open(os.path.join(sys.argv[1], "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
i = 0
while True:
    os.write(fd, (b"%08d" % i) * 8192)
    os.fsync(fd)
    print(i, flush=True)
    i += 1
"#;
const RECORD: usize = 64 << 10;

/// The writer, and the number of the last record it synced (-1: none yet).
fn start_writer(mp: &Path) -> (std::process::Child, Arc<AtomicI64>) {
    let mut child = cmd("python3", &["-c", WRITER, mp.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let synced = Arc::new(AtomicI64::new(-1));
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let last = Arc::clone(&synced);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            last.store(line.trim().parse().unwrap(), Ordering::SeqCst);
        }
    });
    (child, synced)
}

fn wait_for(synced: &AtomicI64, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while synced.load(Ordering::SeqCst) < n {
        assert!(
            Instant::now() < deadline,
            "the writer is stuck before record {n}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The number of whole records in `log`, each checked; the tail past them must be the
/// start of the next record.
fn whole_records(log: &[u8]) -> usize {
    let n = log.len() / RECORD;
    for (i, record) in log.chunks(RECORD).enumerate() {
        let want = format!("{i:08}").repeat(RECORD / 8);
        assert!(
            want.as_bytes().starts_with(record),
            "record {i} of {n} is torn or wrong"
        );
    }
    n
}

#[test]
fn a_mounted_tenant_is_snapshotted_while_written_and_restores_what_was_synced_before() {
    let h = Host::new("snap-live");
    h.create_tenant("t");
    let mp = h.dir("m");
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let mount = || {
        h.ok(&["mount", "t", mp.to_str().unwrap()]);
        h.guard("t", &mp, d.0.id())
    };
    let guard = mount();
    let bulk = noise(5, 24 << 20);
    write_synced(&mp.join("bulk"), &bulk);
    std::fs::create_dir(mp.join("dir")).unwrap();
    write_synced(&mp.join("dir/before"), b"synced before the snapshot");

    let (mut writer, synced) = start_writer(&mp);
    wait_for(&synced, 20);
    let before = synced.load(Ordering::SeqCst);
    let out = h.ok(&["snapshot", "create", "t", "s1"]);
    assert!(
        out.contains("took snapshot s1 of tenant t while it is served"),
        "{out}"
    );
    write_synced(&mp.join("dir/after"), b"written after the snapshot");
    std::fs::write(mp.join("bulk"), b"the tenant's bulk data, rewritten").unwrap();
    wait_for(&synced, before + 20);
    writer.kill().unwrap();
    writer.wait().unwrap();
    let records_now = whole_records(&std::fs::read(mp.join("log")).unwrap());
    // Forks of the mounted tenant: of its snapshot, and of it now.
    let out = h.ok(&["tenant", "fork", "t", "f", "--snapshot", "s1"]);
    assert!(
        out.contains("forked tenant t as its snapshot s1 holds it into f while it is served"),
        "{out}"
    );
    let out = h.ok(&["tenant", "fork", "t", "now"]);
    assert!(out.contains("into now while it is served"), "{out}");
    write_synced(&mp.join("dir/after the fork"), b"the source's own");
    let e = h.fails(&["tenant", "fork", "t", "now"]);
    assert!(e.contains("already exists"), "{e}");
    let out = h.ok(&["tenant", "rotate-key", "t"]);
    assert!(
        out.contains("sealed under key") && out.contains("holds 4 keys"),
        "{out}"
    );
    write_synced(&mp.join("dir/after the rotation"), b"under the third key");
    // Written again under a fourth key while served: no file of the store is left under an
    // older one (the snapshot and the fork keep theirs: the restore below reads them).
    let out = h.ok(&["tenant", "rotate-key", "t", "--rewrite"]);
    assert!(
        out.contains("holds 5 keys") && out.contains("none of its files is sealed under an older"),
        "{out}"
    );
    let (_, writing) = tenantfs::tenants::key_ids(&h.data, "t").unwrap();
    let older = tenantfs::store::files_under_other_keys(&h.data.join("tenants/t/db"), writing);
    assert_eq!(older.unwrap(), Vec::<std::path::PathBuf>::new());
    assert_eq!(
        std::fs::read(mp.join("bulk")).unwrap(),
        b"the tenant's bulk data, rewritten"
    );
    assert_eq!(
        std::fs::read(mp.join("dir/after the rotation")).unwrap(),
        b"under the third key"
    );

    let listed: serde_json::Value =
        serde_json::from_str(&h.ok(&["snapshot", "list", "t", "--json"])).unwrap();
    assert_eq!(listed[0]["name"], "s1", "{listed}");
    assert_eq!(listed[0]["tenant"], "t", "{listed}");
    let e = h.fails(&["tenant", "restore", "t", "--snapshot", "s1"]);
    assert!(
        e.contains("in use by process") && e.contains("unmount it"),
        "{e}"
    );
    assert!(
        mp.join("dir/after").exists(),
        "a refused restore changed the tenant"
    );

    h.ok(&["umount", mp.to_str().unwrap()]);
    drop(guard);
    let out = h.ok(&["tenant", "restore", "t", "--snapshot", "s1"]);
    assert!(out.contains("restored tenant t to snapshot s1"), "{out}");
    let guard = mount();
    assert!(std::fs::read(mp.join("bulk")).unwrap() == bulk, "bulk data");
    assert_eq!(
        std::fs::read(mp.join("dir/before")).unwrap(),
        b"synced before the snapshot"
    );
    assert!(
        !mp.join("dir/after").exists(),
        "a file made after the snapshot"
    );
    let records = whole_records(&std::fs::read(mp.join("log")).unwrap());
    assert!(
        records as i64 > before && records < records_now,
        "{records} records: every one synced before the call ({}) and not all of them \
         since ({records_now})",
        before + 1
    );
    // The restored tenant writes on its own; the snapshot stays as it was.
    write_synced(&mp.join("dir/after restore"), b"new");
    h.ok(&["umount", mp.to_str().unwrap()]);
    drop(guard);
    h.ok(&["tenant", "restore", "t", "--snapshot", "s1"]);
    let guard = mount();
    assert!(!mp.join("dir/after restore").exists());
    assert_eq!(
        whole_records(&std::fs::read(mp.join("log")).unwrap()),
        records
    );
    // The forks: one holds the snapshot, the other the tenant when it was forked.
    let mf = h.dir("mf");
    let mount_fork = |name: &str| {
        h.ok(&["mount", name, mf.to_str().unwrap()]);
        h.guard(name, &mf, d.0.id())
    };
    let umount_fork = |guard| {
        h.ok(&["umount", mf.to_str().unwrap()]);
        drop(guard);
    };
    let f = mount_fork("f");
    assert!(std::fs::read(mf.join("bulk")).unwrap() == bulk, "bulk data");
    assert!(!mf.join("dir/after").exists());
    assert_eq!(
        whole_records(&std::fs::read(mf.join("log")).unwrap()),
        records
    );
    umount_fork(f);
    let now = mount_fork("now");
    assert_eq!(
        std::fs::read(mf.join("bulk")).unwrap(),
        b"the tenant's bulk data, rewritten"
    );
    assert!(mf.join("dir/after").exists());
    assert!(!mf.join("dir/after the fork").exists());
    assert_eq!(
        whole_records(&std::fs::read(mf.join("log")).unwrap()),
        records_now
    );
    umount_fork(now);
    // Deleting the snapshot of a mounted tenant leaves the tenant whole.
    let out = h.ok(&["snapshot", "delete", "t", "s1"]);
    assert!(out.contains("deleted snapshot s1 of tenant t"), "{out}");
    assert!(std::fs::read(mp.join("bulk")).unwrap() == bulk);
    h.ok(&["umount", mp.to_str().unwrap()]);
    drop(guard);
    d.terminate_cleanly(&[&mp]);
}

/// fio's blocks: 64 KiB, written in order, each with a crc32c header that names its offset.
const FIO_BLOCK: usize = 64 << 10;

/// fio's sequential verify job over `bytes` of `file`, with `more` options.
fn fio_job(file: &Path, bytes: usize, more: &[&str]) -> std::process::Command {
    let mut c = cmd(
        "fio",
        &[
            "--name=verify",
            "--rw=write",
            "--bs=64k",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_state_save=0",
        ],
    );
    c.arg(format!("--filename={}", file.display()))
        .arg(format!("--size={bytes}"))
        .args(more);
    c
}

/// How many of fio's blocks `file` (holes where fio has not written) holds: the blocks up to
/// the last one with data, none of them a hole.
fn fio_blocks(file: &Path) -> usize {
    let data = std::fs::read(file).unwrap();
    let written: Vec<bool> = data
        .chunks(FIO_BLOCK)
        .map(|b| b.iter().any(|&x| x != 0))
        .collect();
    let n = written.iter().rposition(|&w| w).map_or(0, |i| i + 1);
    assert!(
        written[..n].iter().all(|&w| w),
        "{}: a hole among its first {n} blocks",
        file.display()
    );
    n
}

/// How many blocks fio has written into `file` so far, found by bisection (fio writes them in
/// order, so the written ones are a prefix; a full read would take longer than the calls it
/// brackets).
fn fio_frontier(file: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(file).unwrap();
    let mut block = vec![0; FIO_BLOCK];
    let mut written = |i: usize| {
        f.read_exact_at(&mut block, (i * FIO_BLOCK) as u64).unwrap();
        block.iter().any(|&x| x != 0)
    };
    let (mut lo, mut hi) = (0, f.metadata().unwrap().len() as usize / FIO_BLOCK);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if written(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// `file` holds fio's first `blocks` blocks, each as fio wrote it (fio's own verify, run on
/// them alone).
fn fio_verifies(file: &Path, blocks: usize) {
    let out = crate::common::process::check(&mut fio_job(
        file,
        blocks * FIO_BLOCK,
        &["--verify_only", "--output-format=terse"],
    ));
    assert!(!out.is_empty(), "fio printed nothing");
}

/// fio writes 64 KiB blocks in order, fsyncing each before the next, into a tenant served by
/// the daemon, and verifies them all at the end; a snapshot and a fork taken while it runs
/// hold, after a restore and in the fork, a prefix of its blocks: every block fsync'd before
/// the call (all but the one in flight when the call began), none written after it returned,
/// and each of them passes fio's verify.
#[test]
fn a_snapshot_and_a_fork_under_a_fio_verify_job_hold_what_was_synced_before_the_call() {
    let h = Host::new("snap-fio");
    h.create_tenant("t");
    let (mp, mf) = (h.dir("m"), h.dir("mf"));
    let mut d = start_daemon(&h, &h.root().join("notify"));
    let mount = |name: &str, at: &Path| {
        h.ok(&["mount", name, at.to_str().unwrap()]);
        h.guard(name, at, d.0.id())
    };
    let umount = |at: &Path, guard| {
        h.ok(&["umount", at.to_str().unwrap()]);
        drop(guard);
    };
    let guard = mount("t", &mp);
    let file = mp.join("fio.dat");
    let size = 128 << 20;
    std::fs::File::create(&file)
        .unwrap()
        .set_len(size as u64)
        .unwrap();
    let out = h.root().join("fio.out");
    let mut fio = fio_job(
        &file,
        size,
        &[
            "--fsync=1",
            "--rate=16m",
            "--do_verify=1",
            &format!("--output={}", out.display()),
        ],
    )
    .spawn()
    .unwrap();
    let running = |fio: &mut std::process::Child, at: &str| {
        assert!(
            fio.try_wait().unwrap().is_none(),
            "fio ended before {at}: {}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
    };
    // Each call between the blocks fio had written before it and those it had written after.
    let mut during = |args: &[&str], says: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        let start = fio_frontier(&file);
        while fio_frontier(&file) < start + 16 {
            assert!(Instant::now() < deadline, "fio is stuck at {start} blocks");
            std::thread::sleep(Duration::from_millis(50));
        }
        let before = fio_frontier(&file);
        let reply = h.ok(args);
        let after = fio_frontier(&file);
        assert!(reply.contains(says), "{reply}");
        running(&mut fio, args[1]);
        (before, after)
    };
    let snap = during(&["snapshot", "create", "t", "s1"], "while it is served");
    let fork = during(&["tenant", "fork", "t", "f"], "while it is served");
    let status = fio.wait().unwrap();
    let report = std::fs::read_to_string(&out).unwrap();
    assert!(status.success() && report.contains("err= 0"), "{report}");
    assert_eq!(fio_blocks(&file), size / FIO_BLOCK);
    umount(&mp, guard);

    h.ok(&["tenant", "restore", "t", "--snapshot", "s1"]);
    h.ok(&["tenant", "fork", "t", "g", "--snapshot", "s1"]);
    let mut held = Vec::new();
    for (name, (before, after)) in [("t", snap), ("f", fork), ("g", snap)] {
        let guard = mount(name, &mf);
        let blocks = fio_blocks(&mf.join("fio.dat"));
        assert!(
            before - 1 <= blocks && blocks <= after,
            "{name} holds {blocks} blocks; fio had written {before} when the call began and \
             {after} when it returned"
        );
        fio_verifies(&mf.join("fio.dat"), blocks);
        held.push(blocks);
        umount(&mf, guard);
    }
    assert_eq!(held[0], held[2], "the restore and the fork of s1 differ");
    d.terminate_cleanly(&[]);
}

#[test]
fn a_closed_tenant_is_snapshotted_restored_and_bad_requests_say_what_to_do() {
    let h = Host::new("snap-cli");
    h.create_tenant("t");
    let mp = h.dir("m");
    let m = h.mount("t", &mp, "");
    write_synced(&mp.join("f"), b"one");
    m.umount();
    let out = h.ok(&["snapshot", "create", "t", "one"]);
    assert!(out.contains("took snapshot one of tenant t in"), "{out}");
    let m = h.mount("t", &mp, "");
    write_synced(&mp.join("f"), b"two");
    write_synced(&mp.join("g"), &noise(9, 4 << 20));
    m.umount();
    h.ok(&["snapshot", "create", "t", "two"]);
    let table = h.ok(&["snapshot", "list"]);
    assert!(
        table.contains("CREATED (UTC)") && table.contains(" one ") && table.contains(" two "),
        "{table}"
    );

    for (args, says) in [
        (
            vec!["snapshot", "create", "t", "one"],
            "has a snapshot one already",
        ),
        (
            vec!["snapshot", "create", "t", "a/b"],
            "invalid snapshot name",
        ),
        (
            vec!["snapshot", "create", "nobody", "x"],
            "unknown tenant nobody",
        ),
        (
            vec!["snapshot", "delete", "t", "three"],
            "has no snapshot three",
        ),
        (
            vec!["tenant", "restore", "t", "--snapshot", "three"],
            "has no snapshot three",
        ),
        (vec!["snapshot", "list", "nobody"], "unknown tenant nobody"),
        (
            vec!["tenant", "fork", "t", "x", "--snapshot", "three"],
            "has no snapshot three",
        ),
        (
            vec!["tenant", "fork", "nobody", "x"],
            "unknown tenant nobody",
        ),
        (vec!["tenant", "fork", "t", "t"], "already exists"),
        (vec!["tenant", "fork", "t", "a/b"], "invalid tenant name"),
        (
            vec!["tenant", "rotate-key", "nobody"],
            "unknown tenant nobody",
        ),
    ] {
        let e = h.fails(&args);
        assert!(e.contains(says), "{args:?}: {e}");
    }

    h.ok(&["tenant", "restore", "t", "--snapshot", "one"]);
    let m = h.mount("t", &mp, "");
    assert_eq!(std::fs::read(mp.join("f")).unwrap(), b"one");
    assert!(!mp.join("g").exists());
    m.umount();
    let out = h.ok(&["tenant", "rotate-key", "t"]);
    assert!(out.contains("its ring holds 2 keys"), "{out}");
    let out = h.ok(&["tenant", "rotate-key", "t", "--rewrite"]);
    assert!(
        out.contains("its ring holds 3 keys") && out.contains("none of its files is sealed"),
        "{out}"
    );
    let out = h.ok(&["tenant", "fork", "t", "copy", "--snapshot", "one"]);
    assert!(
        out.contains("forked tenant t as its snapshot one holds it into copy in"),
        "{out}"
    );
    let m = h.mount("copy", &mp, "");
    assert_eq!(std::fs::read(mp.join("f")).unwrap(), b"one");
    m.umount();
    h.ok(&["tenant", "delete", "copy"]);
    h.ok(&["tenant", "restore", "t", "--snapshot", "two"]);
    let m = h.mount("t", &mp, "");
    assert_eq!(std::fs::read(mp.join("f")).unwrap(), b"two");
    assert!(std::fs::read(mp.join("g")).unwrap() == noise(9, 4 << 20));
    m.umount();
    // The tenant's disk counts each shared file once, as du does (and not as du
    // --count-links, which counts g's data in snapshot two and in the store).
    let disk = h.disk_bytes("t");
    let du = |args: &[&str]| -> u64 {
        let dir = h.data.join("tenants/t");
        let out = crate::common::process::check(cmd("du", args).arg(&dir));
        out.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (once, every_link) = (du(&["-sB1"]), du(&["-sB1", "--count-links"]));
    assert!(
        disk <= once && disk + (4 << 20) <= every_link,
        "tenant list says {disk} bytes; du: {once}, {every_link} with every link"
    );
    h.ok(&["tenant", "delete", "t"]);
    let out = h.ok(&["snapshot", "list"]);
    assert!(out.contains("no snapshots"), "{out}");
}
