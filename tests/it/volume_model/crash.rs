//! kill -9 of a child process in the middle of blob garbage collection, after folds, and
//! during extent file writes: nothing synced is lost; and right after logged writes: none of
//! them is lost.

use super::*;

pub(super) const GC_CHILD_ENV: &str = "TENANTFS_TEST_GC_CHILD";
pub(super) const GC_KEEP: usize = 32 << 20;
pub(super) const GC_CHURN: usize = 8 << 20;

pub(super) fn gc_file(vol: &Volume, name: &str) -> u64 {
    match vol.lookup(ROOT_INO, name.as_bytes()) {
        Ok(a) => a.ino,
        Err(_) => {
            vol.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, OWNER, 0)
                .unwrap()
                .ino
        }
    }
}

/// Writes `data` into file `name` in 128 KiB writes: whole chunks, but below the bulk size,
/// so they are blob values (bulk writes go to extent files, collected apart).
pub(super) fn gc_write(vol: &Volume, name: &str, data: &[u8]) {
    write_in(vol, name, data, 128 << 10);
}

pub(super) fn write_in(vol: &Volume, name: &str, data: &[u8], piece: usize) {
    let ino = gc_file(vol, name);
    for (i, chunk) in data.chunks(piece).enumerate() {
        vol.write(ino, (i * piece) as u64, chunk).unwrap();
    }
}

pub(super) fn gc_read(vol: &Volume, name: &str, len: usize) -> Vec<u8> {
    let ino = vol.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
    assert_eq!(vol.getattr(ino).unwrap().size, len as u64, "{name}: size");
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while out.len() < len {
        vol.read_into(ino, out.len() as u64, 1 << 20, &mut buf)
            .unwrap();
        assert!(!buf.is_empty(), "{name}: short read at {}", out.len());
        out.extend_from_slice(&buf);
    }
    out
}

pub(super) fn blob_files(dir: &std::path::Path) -> Vec<(String, u64)> {
    common::files_under(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blob"))
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p.file_name().unwrap().to_string_lossy().into_owned(), len)
        })
        .collect()
}

/// The child: one more synced overwrite of `churn` (its content named by the trial), then
/// blob GC over and over, each run announced on stdout; once the run has created its first
/// file (the flush it starts with), the child parks at its `park`-th store cipher call (a
/// piece of a store file read or written).
pub(super) fn gc_child(root: &str, trial: u64, park: u64) {
    let vol = open_in_child(root, "gc");
    gc_write(&vol, "churn", &noise(1000 + trial, GC_CHURN));
    vol.fsync().unwrap();
    let gc_wrote = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let gc_wrote = gc_wrote.clone();
        fail::cfg_callback("store-file-created", move || {
            gc_wrote.store(true, std::sync::atomic::Ordering::Relaxed)
        })
        .unwrap();
    }
    common::crash_point::park_at("store-cipher", park, move || {
        gc_wrote.load(std::sync::atomic::Ordering::Relaxed)
    });
    for i in 0.. {
        println!("GC start {i}");
        vol.tenant().db().collect_blob_garbage();
        println!("GC done {i}");
    }
}

/// Blob GC moves live file data from old blob files into new ones while it deletes the old:
/// a kill -9 at any point of it (here early, midway and late in the first run) loses nothing
/// that was synced, the partial blob file it was writing is deleted at the next open (RocksDB
/// itself keeps it forever), and the space of overwritten data comes back once GC completes.
#[test]
fn kill9_during_blob_garbage_collection_loses_nothing_synced() {
    if let Some((root, trial, park)) = child_spec(GC_CHILD_ENV) {
        gc_child(&root, trial, park);
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    let keep = noise(7, GC_KEEP);
    let store_dir = {
        let vol = open_volume(&t, "gc");
        // `keep` goes into the oldest blob files and stays live; `churn` is overwritten with a
        // sync each time, so every flush makes a blob file and older ones fill with garbage.
        gc_write(&vol, "keep", &keep);
        vol.fsync().unwrap();
        for round in 0..5 {
            gc_write(&vol, "churn", &noise(100 + round, GC_CHURN));
            vol.fsync().unwrap();
        }
        drop(vol);
        tenantfs::data_dir::tenants_dir(&t.root).join("gc")
    };
    for (trial, park) in (1u64..).zip(GC_PARK) {
        let before = blob_files(&store_dir);
        let mut child = spawn_child(
            "kill9_during_blob_garbage_collection_loses_nothing_synced",
            &[(GC_CHILD_ENV, format!("{}:{trial}:{park}", t.root.display()))],
        );
        let seen = common::crash_point::kill_when_parked(&mut child);
        assert_eq!(
            seen,
            ["GC start 0", common::crash_point::PARKED],
            "trial {trial}: the child parks inside its first GC run"
        );
        let at_kill = blob_files(&store_dir);
        let vol = open_volume(&t, "gc");
        assert!(
            gc_read(&vol, "keep", GC_KEEP) == keep,
            "trial {trial}: keep changed"
        );
        assert!(
            gc_read(&vol, "churn", GC_CHURN) == noise(1000 + trial, GC_CHURN),
            "trial {trial}: churn is not its last synced content"
        );
        let after = blob_files(&store_dir);
        assert_ne!(before, after, "trial {trial}: GC changed no blob file");
        // The blob file the killed job was writing is referenced by nothing: deleted at open.
        assert_eq!(
            after.len() as u64,
            vol.tenant().db().blob_file_count(),
            "trial {trial}: blob files the store does not reference are left (at the kill: \
             {at_kill:?}, after the reopen: {after:?})"
        );
        // A GC that runs to its end gives the space of the overwritten data back.
        vol.tenant().db().collect_blob_garbage();
        let live = (GC_KEEP + GC_CHURN) as u64;
        let blob_bytes: u64 = blob_files(&store_dir).iter().map(|(_, l)| l).sum();
        assert!(
            blob_bytes < live + live / 4,
            "trial {trial}: blob files hold {blob_bytes} bytes for {live} live bytes after GC: \
             {:?}",
            blob_files(&store_dir)
        );
        assert!(
            gc_read(&vol, "keep", GC_KEEP) == keep,
            "trial {trial}: keep changed by GC"
        );
    }
}

/// Where the GC children park: the nth store cipher call after the run created its first file;
/// early, midway and late in the first run, which makes 153-154 such calls in each trial
/// (counted with a callback on the same two failpoints).
const GC_PARK: [u64; 3] = [1, 60, 120];

pub(super) const FOLD_CHILD_ENV: &str = "TENANTFS_TEST_FOLD_CHILD";
pub(super) const FOLD_FILE: usize = 4 << 20;

/// Extent keys of the volume (chunks, and blocks over them).
pub(super) fn extent_keys(vol: &Volume) -> usize {
    let mut n = 0;
    vol.tenant()
        .db()
        .keys(tenantfs::store::Family::Extents, &[], &[0xff; 17], |_| {
            n += 1;
            true
        })
        .unwrap();
    n
}

/// The child: 4 KiB writes over the file, synced, then every fold at once (written without
/// the WAL), announced on stdout; then, over folded chunks, a whole-chunk write below the
/// bulk size (through the WAL) and a punched hole, synced; then idle until killed.
pub(super) fn fold_child(root: &str) {
    let vol = open_in_child(root, "fold");
    let ino = vol.lookup(ROOT_INO, b"f").unwrap().ino;
    for (at, block) in fold_overwrites() {
        vol.write(ino, at, &block).unwrap();
    }
    vol.fsync().unwrap();
    println!("KEYS {}", extent_keys(&vol));
    vol.fold_now();
    println!("FOLDED {}", extent_keys(&vol));
    let (at, data) = fold_rewrite();
    vol.write(ino, at, &data).unwrap();
    let (at, len) = fold_hole();
    vol.fallocate(ino, at, len, tenantfs::volume::Fallocate::PunchHole)
        .unwrap();
    vol.fsync().unwrap();
    println!("REWRITTEN");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Chunks 0 and 1 of the fold test's file rewritten in one 128 KiB write (logged).
pub(super) fn fold_rewrite() -> (u64, Vec<u8>) {
    (0, noise(7000, 128 << 10))
}

/// Chunk 2 of the fold test's file punched into a hole.
pub(super) fn fold_hole() -> (u64, u64) {
    (128 << 10, 64 << 10)
}

/// Every 5th block of the file and a run of 32 blocks, rewritten with fresh noise.
pub(super) fn fold_overwrites() -> Vec<(u64, Vec<u8>)> {
    (0..FOLD_FILE / 4096)
        .filter(|b| b % 5 == 0 || (300..332).contains(b))
        .map(|b| ((b * 4096) as u64, noise(5000 + b as u64, 4096)))
        .collect()
}

/// A fold merges the blocks over a chunk into it without the WAL (it changes how data is laid
/// out, not what it reads as): killed with folds in the memtable only, the store reopens with
/// the synced blocks over the old chunks, reads exactly what was synced, and a read that
/// meets them has them folded again. Writes over folded chunks after the folds (a whole-chunk
/// write, a punched hole), synced, are not shadowed by the blocks coming back: their deletes
/// of those blocks are in the WAL too, found by their own scan or not.
#[test]
fn kill9_after_folds_loses_nothing_synced() {
    if let Ok(root) = std::env::var(FOLD_CHILD_ENV) {
        fold_child(&root);
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    let mut model = noise(11, FOLD_FILE);
    {
        let vol = open_volume(&t, "fold");
        // Bulk writes: the chunks are in extent files, and the folds read them from there.
        write_in(&vol, "f", &model, 1 << 20);
        vol.fsync().unwrap();
        assert_eq!(
            extent_keys(&vol),
            FOLD_FILE / (64 << 10),
            "written as chunks"
        );
    }
    for (at, block) in fold_overwrites() {
        model[at as usize..at as usize + block.len()].copy_from_slice(&block);
    }
    let (at, data) = fold_rewrite();
    model[at as usize..at as usize + data.len()].copy_from_slice(&data);
    let (hole, hole_len) = fold_hole();
    model[hole as usize..(hole + hole_len) as usize].fill(0);
    let mut child = spawn_child(
        "kill9_after_folds_loses_nothing_synced",
        &[(FOLD_CHILD_ENV, t.root.display().to_string())],
    );
    let mut counts = Vec::new();
    {
        use std::io::BufRead;
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        for line in out.lines().map_while(Result::ok) {
            // (The harness's "test NAME ... " may start the first line.)
            if let Some((_, n)) = line.split_once("KEYS ") {
                counts.push(n.parse::<usize>().unwrap());
            }
            if let Some((_, n)) = line.split_once("FOLDED ") {
                counts.push(n.parse::<usize>().unwrap());
            }
            if line.contains("REWRITTEN") {
                break;
            }
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let chunks = FOLD_FILE / (64 << 10);
    let overwrites = fold_overwrites().len();
    assert_eq!(
        counts,
        [chunks + overwrites, chunks],
        "the child's folds: blocks over chunks before, one key per chunk after"
    );
    let vol = open_volume(&t, "fold");
    // The blocks over the rewritten chunks and the hole stay deleted, and so does the hole's
    // chunk.
    let gone = fold_overwrites()
        .iter()
        .filter(|(at, _)| *at < hole + hole_len)
        .count();
    assert_eq!(
        extent_keys(&vol),
        chunks + overwrites - gone - 1,
        "the folds were not flushed: the other synced blocks are back over their chunks"
    );
    // The read meets the chunks left overlaid and queues them: they are folded again.
    assert!(
        gc_read(&vol, "f", FOLD_FILE) == model,
        "not what was synced"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while extent_keys(&vol) != chunks - 1 {
        assert!(std::time::Instant::now() < deadline, "not folded again");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        gc_read(&vol, "f", FOLD_FILE) == model,
        "the second fold changed bytes"
    );
}

/// Volume `name` of the data dir at `root`, opened by a crash test's child process.
pub(super) fn open_in_child(root: &str, name: &str) -> Volume {
    let data = tenantfs::data_dir::DataDir::open(std::path::Path::new(root), None).unwrap();
    let host = tenantfs::store::StoreHost::builder()
        .block_cache_bytes(64 << 20)
        .build();
    Volume::open(tenants::open(&data, &host, name).unwrap()).unwrap()
}

/// In a crash test's child: what its parent set in `env`, `root:a:b` (a data dir and two
/// numbers).
pub(super) fn child_spec(env: &str) -> Option<(String, u64, u64)> {
    let spec = std::env::var(env).ok()?;
    let mut parts = spec.rsplitn(3, ':');
    let b = parts.next()?.parse().expect("a number");
    let a = parts.next()?.parse().expect("a number");
    Some((parts.next()?.to_owned(), a, b))
}

/// This test binary run again as the child of crash test `test` (its stdout piped), with
/// `envs` telling it so.
pub(super) fn spawn_child(test: &str, envs: &[(&str, String)]) -> std::process::Child {
    common::process::this_binary_running(&common::process::test_path(module_path!(), test))
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

pub(super) const EXTENT_CHILD_ENV: &str = "TENANTFS_TEST_EXTENT_CHILD";
pub(super) const EXTENT_FILE: usize = 16 << 20;

/// Round `round`'s bytes of piece `nth` (1 MiB) of the extent test's file.
pub(super) fn extent_piece(round: u64, nth: usize) -> Vec<u8> {
    noise(round * 1000 + nth as u64, 1 << 20)
}

/// The child: rewrites the file in 1 MiB writes (bulk: into extent files) and fsyncs, then
/// announces the round; in the next round it parks at its `park`-th extent append.
pub(super) fn extent_child(root: &str, round: u64, park: u64) {
    let vol = open_in_child(root, "ext");
    let ino = vol.lookup(ROOT_INO, b"f").unwrap().ino;
    for round in [round, round + 1] {
        for nth in 0..EXTENT_FILE >> 20 {
            vol.write(ino, (nth << 20) as u64, &extent_piece(round, nth))
                .unwrap();
        }
        vol.fsync().unwrap();
        println!("SYNCED {round}");
        common::crash_point::park_at("extent-appended", park, || true);
    }
    unreachable!("the child passed its crash point");
}

/// Bulk writes go to extent files and their chunk values skip the WAL: killed mid-round (at
/// its 1st, 6th and 13th append after a sync), the store reopens with every piece of the
/// file either the last synced round's bytes or the next round's, never anything else (no
/// value naming bytes that were not written, no lost synced piece).
#[test]
fn kill9_during_extent_file_writes_loses_nothing_synced() {
    if let Some((root, round, park)) = child_spec(EXTENT_CHILD_ENV) {
        extent_child(&root, round, park);
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    let pieces = EXTENT_FILE >> 20;
    {
        let vol = open_volume(&t, "ext");
        let ino = gc_file(&vol, "f");
        for nth in 0..pieces {
            vol.write(ino, (nth << 20) as u64, &extent_piece(1, nth))
                .unwrap();
        }
        vol.fsync().unwrap();
        assert!(
            vol.tenant().db().extent_file_stats().bytes >= EXTENT_FILE as u64,
            "bulk writes not in extent files: {:?}",
            vol.tenant().db().extent_file_stats()
        );
    }
    let mut synced = 1;
    for park in [1u64, 6, 13] {
        let round = synced + 1;
        let mut child = spawn_child(
            "kill9_during_extent_file_writes_loses_nothing_synced",
            &[(
                EXTENT_CHILD_ENV,
                format!("{}:{round}:{park}", t.root.display()),
            )],
        );
        let seen = common::crash_point::kill_when_parked(&mut child);
        assert_eq!(
            seen,
            [
                format!("SYNCED {round}"),
                common::crash_point::PARKED.to_owned()
            ],
            "append {park}: the child parks in the round after its first sync"
        );
        synced = round;
        let vol = open_volume(&t, "ext");
        let back = gc_read(&vol, "f", EXTENT_FILE);
        let mut newer = 0;
        for (nth, piece) in back.chunks(1 << 20).enumerate() {
            if piece == extent_piece(synced + 1, nth).as_slice() {
                newer += 1;
            } else {
                assert!(
                    piece == extent_piece(synced, nth).as_slice(),
                    "append {park}: piece {nth} is neither round {synced} (synced) nor the next"
                );
            }
        }
        println!("append {park}: round {synced} synced, {newer} pieces of the next kept");
        // The next child starts from what is on disk: all of one round again.
        let ino = vol.lookup(ROOT_INO, b"f").unwrap().ino;
        for nth in 0..pieces {
            vol.write(ino, (nth << 20) as u64, &extent_piece(synced, nth))
                .unwrap();
        }
        vol.fsync().unwrap();
    }
}

const WAL_CHILD_ENV: &str = "TENANTFS_TEST_WAL_CHILD";
const WAL_FILE: usize = 400 << 10;

/// The WAL test's file, written in logged writes (10 KiB, as tar's).
fn wal_data() -> Vec<u8> {
    noise(77, WAL_FILE)
}

/// The child: writes the file in 10 KiB writes, then parks right after the last one returned.
fn wal_child(root: &str) {
    let vol = open_in_child(root, "wal");
    write_in(&vol, "w", &wal_data(), 10 << 10);
    common::crash_point::park_here();
}

/// A logged write that returned is in the WAL file, not in a buffer of the process: killed
/// right after its last write, a child that synced nothing loses none of them. (RocksDB's
/// `manual_wal_flush`, which would buffer them, makes a WAL write that fails on a full disk
/// fatal to the store: see docs/decisions/0010-wal-before-the-reply.md.)
#[test]
fn kill9_loses_no_acknowledged_logged_write() {
    if let Some((root, _, _)) = child_spec(WAL_CHILD_ENV) {
        wal_child(&root);
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    drop(open_volume(&t, "wal"));
    let mut child = spawn_child(
        "kill9_loses_no_acknowledged_logged_write",
        &[(WAL_CHILD_ENV, format!("{}:0:0", t.root.display()))],
    );
    common::crash_point::kill_when_parked(&mut child);
    let vol = open_volume(&t, "wal");
    assert!(
        gc_read(&vol, "w", WAL_FILE) == wal_data(),
        "acknowledged writes lost"
    );
}
