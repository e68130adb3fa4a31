//! Extent file collection: the disk space of bulk data that was overwritten or deleted.
//!
//! Bulk writes put whole chunks into extent files (format 4, `store::extents`); a chunk value
//! names its span there. An overwrite, a truncate, a delete or a fold (which merges the blocks
//! written over a chunk into a new span) leaves the old span unnamed: garbage in its
//! file. A collection (started by `blob_gc::BlobGc` on its thread) walks the chunk values that
//! name extent files (inline values only, no blob is read: 16k per GiB of file data) and:
//! - moves the live chunks of each closed file that less than half of its bytes are named in
//!   (a file rewritten at random, or folded), unless another store (a snapshot, a fork)
//!   links the file too (moving would free nothing and copy what both name): each is read, appended to the open file and its
//!   value swapped under the inode's lock if no write changed it meanwhile, as a layout change
//!   (`TenantDb::write_relayout`: it reads the same, so a crash before the next flush loses it
//!   harmlessly). Less than half live means under one byte written per byte given back;
//! - then deletes (or pools) the closed files no value names any more, after a flush has made
//!   the values that replaced them durable, so that no value naming a deleted file comes back
//!   after a crash. A file overwritten whole, the streaming case, goes without any copying.
//!
//! Both wait until their garbage reaches the collection's threshold (1 GiB from the volume):
//! each flushes the memtables, which stalls a streaming writer for a few milliseconds.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::codec::{chunk_key, decode_chunk, decode_extent_key, stored_chunk, Chunk, ExtentKey};
use super::locks::InodeLocks;
use crate::store::{ExtentFileStats, ExtentSpan, Family, StoreError, TenantDb, EXTENT_ALIGN};
use crate::tenants::Tenant;

/// Chunks read per disk pass when moving (4 MiB of 64 KiB chunks).
const MOVE_BATCH: usize = 64;

/// What one collection did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExtentCollection {
    /// Bytes of live chunks moved out of mostly-garbage files.
    pub moved: u64,
    /// Files deleted or pooled, and their bytes.
    pub taken: ExtentFileStats,
}

/// Why a collection runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Occasion {
    /// A file was closed: bulk writes are streaming. Unnamed files are pooled to be written
    /// again.
    Rolled,
    /// No file was closed for a while: the open file is closed too if nothing was appended
    /// to it for this long, and the pool is given up (its files deleted).
    Quiet(Duration),
}

/// Collects `tenant`'s extent garbage once it reaches `min_garbage` bytes (see the module's
/// doc); `locks` are the volume's inode locks.
pub(crate) fn collect_extent_files(
    tenant: &Tenant,
    locks: &InodeLocks,
    min_garbage: u64,
    occasion: Occasion,
) -> Result<ExtentCollection, StoreError> {
    let db = tenant.db();
    let files = db.extent_files();
    if let Occasion::Quiet(idle) = occasion {
        files.close_if_idle(idle)?;
        files.empty_pool();
    }
    // Files before it take no new spans: one unnamed in the walk below stays unnamed.
    let horizon = files.horizon();
    let closed = files.closed_before(horizon)?;
    if closed.is_empty() {
        return Ok(ExtentCollection::default());
    }
    let mut live = live_bytes(db)?;
    let mut sparse = HashSet::new();
    let mut sparse_garbage = 0;
    for f in closed.iter().filter(|f| !f.shared) {
        match live.get(&f.number) {
            Some(&named) if named.saturating_mul(2) < f.bytes => {
                sparse.insert(f.number);
                sparse_garbage += f.bytes - named;
            }
            _ => {}
        }
    }
    let mut done = ExtentCollection::default();
    if !sparse.is_empty() && sparse_garbage >= min_garbage {
        let started = std::time::Instant::now();
        done.moved = move_chunks(tenant, locks, &chunks_in(db, &sparse)?)?;
        // Each byte moved was read and written again.
        db.background().report(2 * done.moved, started);
        live = live_bytes(db)?;
    }
    if files.unnamed_before(horizon, &live)? < min_garbage {
        return Ok(done);
    }
    // What made them unnamed (overwrites, deletes, folds, moves) may be in a memtable only.
    fail::fail_point!("extent-collection-flush");
    db.flush()?;
    done.taken = files.collect(horizon, &live, occasion == Occasion::Rolled)?;
    Ok(done)
}

/// Calls `f(ino, first block, span)` for each chunk value that names an extent file.
fn each_stored_chunk(
    db: &TenantDb,
    mut f: impl FnMut(u64, u64, ExtentSpan),
) -> Result<(), StoreError> {
    db.inline_values(Family::Extents, &[], &[0xff; 17], |k, v| {
        if let (Some(ExtentKey::Chunk(first)), Some(Chunk::Stored(span))) =
            (decode_extent_key(k), v.and_then(decode_chunk))
        {
            let ino = u64::from_be_bytes(k[..8].try_into().expect("an extent key"));
            f(ino, first, span);
        }
        true
    })
}

/// The bytes that chunk values name, per extent file.
pub(super) fn live_bytes(db: &TenantDb) -> Result<HashMap<u64, u64>, StoreError> {
    let mut live: HashMap<u64, u64> = HashMap::new();
    each_stored_chunk(db, |_, _, span| {
        *live.entry(span.file).or_default() += u64::from(span.len);
    })?;
    Ok(live)
}

/// The chunks (inode, first block, span) in `files`, in file order (the order they are read).
pub(super) fn chunks_in(
    db: &TenantDb,
    files: &HashSet<u64>,
) -> Result<Vec<(u64, u64, ExtentSpan)>, StoreError> {
    let mut found = Vec::new();
    each_stored_chunk(db, |ino, first, span| {
        if files.contains(&span.file) {
            found.push((ino, first, span));
        }
    })?;
    found.sort_unstable_by_key(|&(_, _, span)| (span.file, span.offset));
    Ok(found)
}

/// Moves `chunks` to the open extent file, each only if its value still names the same span
/// (a write, truncate or fold since the walk replaced it, and its old bytes are garbage
/// already). Returns the bytes moved.
pub(super) fn move_chunks(
    tenant: &Tenant,
    locks: &InodeLocks,
    chunks: &[(u64, u64, ExtentSpan)],
) -> Result<u64, StoreError> {
    let db = tenant.db();
    let files = db.extent_files();
    let mut moved = 0;
    for group in chunks.chunks(MOVE_BATCH) {
        let spans: Vec<ExtentSpan> = group.iter().map(|&(_, _, span)| span).collect();
        let mut bytes = vec![Vec::new(); group.len()];
        let _no_delete = files.read_guard();
        files.read_to_move(&spans, |i, b| bytes[i] = b.to_vec())?;
        for (&(ino, first, span), data) in group.iter().zip(&bytes) {
            // (Every span was appended in whole 4 KiB blocks; one that is not is left alone.)
            if data.is_empty() || !data.len().is_multiple_of(EXTENT_ALIGN) {
                continue;
            }
            let key = chunk_key(ino, first);
            let _inode = locks.lock(ino);
            if db.get(Family::Extents, &key)?.as_deref() != Some(&stored_chunk(span)[..]) {
                continue;
            }
            let to = db.write_extents(data, data.len())?;
            let mut b = db.batch();
            b.put(Family::Extents, &key, &stored_chunk(to[0]));
            db.write_relayout(b)?;
            moved += data.len() as u64;
        }
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::super::{FileKind, Owner, TestStore, Volume, ROOT_INO};
    use super::*;

    fn file(vol: &Volume, name: &[u8]) -> u64 {
        let owner = Owner { uid: 0, gid: 0 };
        vol.mknod(ROOT_INO, name, FileKind::File, 0o644, owner, 0)
            .unwrap()
            .ino
    }

    /// The closed extent files less than half named.
    fn sparse_files(vol: &Volume) -> Vec<u64> {
        let db = vol.tenant().db();
        let live = live_bytes(db).unwrap();
        let closed = db.extent_files().closed_before(db.extent_files().horizon());
        closed
            .unwrap()
            .into_iter()
            .filter(|f| live.get(&f.number).is_some_and(|l| l * 2 < f.bytes))
            .map(|f| f.number)
            .collect()
    }

    fn collect(vol: &Volume, min_garbage: u64) -> ExtentCollection {
        collect_extent_files(vol.tenant(), &vol.inodes, min_garbage, Occasion::Rolled).unwrap()
    }

    /// A file rewritten whole in bulk writes leaves its old extent files unnamed: a collection
    /// pools four of them (to be written again) and deletes the rest, changes no byte, and the
    /// next files reuse the pooled ones. A file still named is left alone.
    #[test]
    fn unnamed_extent_files_are_pooled_or_deleted_and_named_ones_kept() {
        let store = TestStore::new();
        let vol = store.open();
        let files = vol.tenant().db().extent_files();
        files.set_roll_bytes(2 << 20);
        let ino = file(&vol, b"f");
        let len = 8usize << 20;
        let mut model = Vec::new();
        for round in 0..3u8 {
            model = (0..len).map(|i| (i % 251) as u8 ^ round | 1).collect();
            for at in (0..len).step_by(1 << 20) {
                vol.write(ino, at as u64, &model[at..at + (1 << 20)])
                    .unwrap();
            }
        }
        vol.fsync().unwrap();
        let before = vol.tenant().db().extent_file_stats();
        assert!(before.files >= 12, "{before:?}");
        let done = collect(&vol, 0);
        let gone = done.taken;
        let after = vol.tenant().db().extent_file_stats();
        // Round 3's 8 MiB is in 4-5 files (the last one open); rounds 1 and 2's are unnamed.
        assert!(gone.files >= 7, "{gone:?}");
        assert_eq!(
            done.moved, 0,
            "files wholly named or wholly not: nothing to move"
        );
        assert_eq!(
            after.files,
            before.files - (gone.files - 4),
            "four pooled: {after:?}"
        );
        assert!(vol.read(ino, 0, len as u32).unwrap() == model);
        // Nothing more to take; the pooled files come back as the next ones written.
        assert_eq!(collect(&vol, 0).taken.files, 0);
        for at in (0..4usize << 20).step_by(1 << 20) {
            vol.write(ino, at as u64, &model[at..at + (1 << 20)])
                .unwrap();
        }
        vol.fsync().unwrap();
        assert!(vol.read(ino, 0, len as u32).unwrap() == model);
        assert_eq!(
            vol.tenant().db().extent_file_stats().files,
            after.files,
            "pooled files reused"
        );
    }

    /// The extent files of `vol` and what each holds.
    fn extent_file_bytes(vol: &Volume) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        let dir = vol.tenant().db().path().join("extents");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| (p.clone(), std::fs::read(p).unwrap()))
            .collect();
        files.sort();
        files
    }

    /// Extent files another store links too (as a snapshot or a fork links the files it
    /// shares) are never written again or emptied: a collection neither pools nor moves
    /// them, it only lets go of this store's name, and every byte of the linked files stays
    /// as it was while the store rewrites, collects and writes again.
    #[test]
    fn extent_files_linked_by_another_store_are_never_written_again() {
        use std::os::unix::fs::MetadataExt;
        let store = TestStore::new();
        let vol = store.open();
        let keep: Vec<u8> = (0..8usize << 20).map(|i| (i % 253) as u8 | 1).collect();
        write_sparse(&vol, &keep);
        let a = vol.lookup(ROOT_INO, b"keep").unwrap().ino;
        // As a snapshot does: the open file closed first (it changes until then).
        let files = vol.tenant().db().extent_files();
        assert!(files.close_if_idle(Duration::ZERO).unwrap());
        let linked_dir = store.root().join("linked");
        std::fs::create_dir(&linked_dir).unwrap();
        let linked: Vec<_> = extent_file_bytes(&vol)
            .into_iter()
            .map(|(path, bytes)| {
                let link = linked_dir.join(path.file_name().unwrap());
                std::fs::hard_link(&path, &link).unwrap();
                (link, bytes)
            })
            .collect();
        assert!(linked.len() >= 8, "{} files", linked.len());
        assert!(!sparse_files(&vol).is_empty(), "files a third named");
        let done = collect(&vol, 0);
        assert_eq!(done.moved, 0, "no chunk moved out of a linked file");
        assert_eq!(done.taken.bytes, 0, "no linked byte given back: {done:?}");
        // Rewrite `keep` whole twice: every linked file is now unnamed here, and most of the
        // first round's too; collections pool (or move out of) only those, and the next files
        // reuse the pooled ones.
        for round in 0..2u8 {
            for at in (0..keep.len()).step_by(1 << 20) {
                let piece: Vec<u8> = keep[at..at + (1 << 20)]
                    .iter()
                    .map(|b| b ^ round ^ 2)
                    .collect();
                vol.write(a, at as u64, &piece).unwrap();
            }
            vol.fsync().unwrap();
            collect(&vol, 0);
            let pooled = files.pooled();
            // Round 0 leaves only linked files unnamed; round 1, its own.
            assert_eq!(pooled.is_empty(), round == 0, "round {round}: {pooled:?}");
            for p in pooled {
                let links = std::fs::metadata(&p).unwrap().nlink();
                assert_eq!(links, 1, "round {round}: {} pooled", p.display());
            }
        }
        let ours = extent_file_bytes(&vol);
        assert!(
            ours.iter()
                .all(|(p, _)| std::fs::metadata(p).unwrap().nlink() == 1),
            "this store let go of every linked file"
        );
        for (link, bytes) in &linked {
            assert!(
                std::fs::read(link).unwrap() == *bytes,
                "{} changed",
                link.display()
            );
            assert_eq!(std::fs::metadata(link).unwrap().nlink(), 1);
        }
        let model: Vec<u8> = keep.iter().map(|b| b ^ 1 ^ 2).collect();
        assert!(vol.read(a, 0, keep.len() as u32).unwrap() == model);
        // A pooled file linked afterwards (nothing should) is not written again either.
        let pooled = files.pooled();
        let late: Vec<_> = pooled
            .iter()
            .map(|p| {
                let link = linked_dir.join(format!("late-{}", p.file_name().unwrap().display()));
                std::fs::hard_link(p, &link).unwrap();
                (link, std::fs::read(p).unwrap())
            })
            .collect();
        let b = file(&vol, b"after");
        for at in (0..(pooled.len() + 1) * (3 << 20)).step_by(1 << 20) {
            vol.write(b, at as u64, &[9u8; 1 << 20]).unwrap();
        }
        vol.fsync().unwrap();
        assert!(files.pooled().is_empty(), "the pool was let go");
        for (link, bytes) in &late {
            assert!(
                std::fs::read(link).unwrap() == *bytes,
                "{} changed",
                link.display()
            );
        }
    }

    /// Two files written in turns share extent files; one deleted leaves each a third named
    /// (`write_sparse`). Below its threshold a collection moves nothing; above it, the live
    /// chunks move to new files, the old ones are taken, the kept file reads the same (before
    /// and after a reopen), and the extent files hold little more than it.
    #[test]
    fn live_chunks_of_mostly_garbage_files_move_and_their_files_go() {
        let store = TestStore::new();
        let len = 8usize << 20;
        let keep: Vec<u8> = (0..len).map(|i| (i % 253) as u8 | 1).collect();
        {
            let vol = store.open();
            write_sparse(&vol, &keep);
            let a = vol.lookup(ROOT_INO, b"keep").unwrap().ino;
            let before = vol.tenant().db().extent_file_stats();
            assert!(before.bytes >= 3 * len as u64, "{before:?}");
            let none = collect(&vol, 64 << 20);
            assert_eq!(none, ExtentCollection::default(), "below the threshold");
            let account = std::sync::Arc::new(crate::store::CountingAccount::default());
            vol.tenant().db().background().set_sink(account.clone());
            let done = collect(&vol, 0);
            // The moves, read and written, are the tenant's background work.
            let reported = account.bytes.load(std::sync::atomic::Ordering::Relaxed);
            assert!(reported >= 2 * done.moved, "{reported} for {done:?}");
            // Every chunk of `keep` but those in the open file (the last 1-3 MiB written).
            assert!(
                done.moved >= (len as u64) - (3 << 20) && done.moved <= len as u64,
                "{done:?}"
            );
            assert!(done.taken.files >= 6, "{done:?}");
            assert!(vol.read(a, 0, len as u32).unwrap() == keep);
            let after = vol.tenant().db().extent_file_stats();
            // What is left: `keep` (moved, or in the once-open file), that file's share of
            // the junk, and the four pooled files.
            let pooled = 4 * (3 << 20);
            assert!(
                after.bytes <= len as u64 + (3 << 20) + pooled + (1 << 20),
                "{before:?} -> {after:?}"
            );
            // The moves closed the file that was open: its share of `keep` moves next, and
            // then nothing is left to move.
            assert!(collect(&vol, 0).moved <= 3 << 20);
            assert_eq!(collect(&vol, 0).moved, 0);
            assert!(vol.read(a, 0, len as u32).unwrap() == keep);
        }
        let vol = store.open();
        let a = vol.lookup(ROOT_INO, b"keep").unwrap().ino;
        assert!(vol.read(a, 0, len as u32).unwrap() == keep);
    }

    /// Folds leave garbage without closing a file: a busy volume walks its chunks now and
    /// then all the same, and moves what a fold left behind.
    #[test]
    fn a_volume_moves_chunks_folds_left_behind_without_a_closed_file() {
        let store = TestStore::new();
        let vol = store.open();
        let ino = file(&vol, b"f");
        let len = 4usize << 20;
        let mut model = vec![3u8; len];
        for at in (0..len).step_by(1 << 20) {
            vol.write(ino, at as u64, &model[at..at + (1 << 20)])
                .unwrap();
        }
        // Close the file they are in: the next bulk write starts another.
        vol.tenant().db().extent_files().set_roll_bytes(1);
        vol.write(file(&vol, b"g"), 0, &vec![1u8; 1 << 20]).unwrap();
        vol.tenant().db().extent_files().set_roll_bytes(256 << 20);
        // Small writes into three chunks out of four, folded into the open file (g's).
        for at in (0..len)
            .step_by(64 << 10)
            .filter(|at| at % (256 << 10) != 0)
        {
            vol.write(ino, at as u64, &[8u8; 4096]).unwrap();
            model[at..at + 4096].fill(8);
        }
        vol.fold_now();
        vol.fsync().unwrap();
        assert_eq!(
            sparse_files(&vol).len(),
            1,
            "the first file, a quarter named"
        );
        vol.blob_gc.set_policy(Duration::from_secs(3600), 0);
        vol.blob_gc.set_extent_every(Duration::ZERO);
        vol.fsync().unwrap(); // a poke: the walk is due
        vol.blob_gc.close(); // waits for it
        assert_eq!(sparse_files(&vol), Vec::<u64>::new());
        assert!(vol.read(ino, 0, len as u32).unwrap() == model);
        // The first file is deleted, not pooled; g's (idle: its MiB and the 3 MiB of folded
        // chunks) was closed first, and the moved MiB went into a new one.
        let stats = vol.tenant().db().extent_file_stats();
        assert_eq!(stats.files, 2, "{stats:?}");
        assert!(stats.bytes <= (5 << 20) + (64 << 10), "{stats:?}");
    }

    const MOVE_CHILD_ENV: &str = "TENANTFS_TEST_EXTENT_MOVE_CHILD";
    const MOVE_TEST: &str =
        "volume::extent_gc::tests::kill9_during_extent_collection_loses_nothing";
    const KEEP: usize = 48 << 20;

    /// Writes `keep` (as file "keep") into extent files shared with twice as much of another
    /// file, then deletes that one: every closed file is a third named.
    fn write_sparse(vol: &Volume, keep: &[u8]) {
        vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
        let a = match vol.lookup(ROOT_INO, b"keep") {
            Ok(attr) => attr.ino,
            Err(_) => file(vol, b"keep"),
        };
        let b = file(vol, b"junk");
        let junk = vec![0x5a; 2 << 20];
        for at in (0..keep.len()).step_by(1 << 20) {
            vol.write(a, at as u64, &keep[at..at + (1 << 20)]).unwrap();
            vol.write(b, 2 * at as u64, &junk).unwrap();
        }
        vol.fsync().unwrap();
        vol.unlink(ROOT_INO, b"junk").unwrap();
        vol.forget(b).unwrap();
        vol.fsync().unwrap();
    }

    /// Where the children of the collection crash test stop: halfway through the moves (the
    /// 384th of 768 chunks appended), the moves done and the flush that makes them durable
    /// not begun, the 2nd file deleted after it.
    const MOVE_PARK: [(&str, u64); 3] = [
        ("extent-appended", 384),
        ("extent-collection-flush", 1),
        ("extent-file-deleted", 2),
    ];

    /// A collection moves live chunks (values swapped in the memtable only), flushes, and
    /// deletes files: killed at three points of it (`MOVE_PARK`), the store reopens with the
    /// kept file whole (no value naming a deleted file or bytes not written), and a collection
    /// run to its end afterwards takes the garbage the killed ones left.
    #[test]
    fn kill9_during_extent_collection_loses_nothing() {
        if let Ok(spec) = std::env::var(MOVE_CHILD_ENV) {
            let (root, point) = spec.rsplit_once(':').unwrap();
            let (name, nth) = MOVE_PARK[point.parse::<usize>().unwrap()];
            let store = TestStore::existing(std::path::Path::new(root));
            let vol = store.open();
            vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
            crate::volume::testing::park_at_failpoint(name, nth);
            crate::volume::testing::say("MOVE start");
            let done = collect(&vol, 0);
            crate::volume::testing::say(&format!("MOVE done {done:?}"));
            return;
        }
        let store = TestStore::new();
        let keep: Vec<u8> = (0..KEEP as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8 | 1)
            .collect();
        for (point, (name, nth)) in MOVE_PARK.into_iter().enumerate() {
            write_sparse(&store.open(), &keep);
            let spec = format!("{}:{point}", store.root().display());
            let seen = crate::volume::testing::killed_where_parked(
                MOVE_TEST,
                (MOVE_CHILD_ENV, &spec),
                "MOVE ",
            );
            assert!(
                seen.len() == 1 && seen[0].ends_with("MOVE start"),
                "{name} hit {nth}: the child did not park inside its collection: {seen:?}"
            );
            let vol = store.open();
            let a = vol.lookup(ROOT_INO, b"keep").unwrap().ino;
            assert!(
                vol.read(a, 0, KEEP as u32).unwrap() == keep,
                "killed at {name} hit {nth}: the kept file changed"
            );
        }
        let vol = store.open();
        vol.tenant().db().extent_files().set_roll_bytes(3 << 20);
        collect(&vol, 0);
        let a = vol.lookup(ROOT_INO, b"keep").unwrap().ino;
        assert!(vol.read(a, 0, KEEP as u32).unwrap() == keep);
        assert_eq!(sparse_files(&vol), Vec::<u64>::new());
        // `keep`, the open file's share of the junk, the four pooled files.
        let stats = vol.tenant().db().extent_file_stats();
        assert!(
            stats.bytes <= (KEEP as u64) + (3 << 20) + 4 * (3 << 20) + (1 << 20),
            "{stats:?}"
        );
    }

    /// A chunk whose value changed after the walk keeps its new value.
    #[test]
    fn a_chunk_written_after_the_walk_is_not_moved() {
        let store = TestStore::new();
        let vol = store.open();
        let ino = file(&vol, b"f");
        vol.write(ino, 0, &[7u8; 1 << 20]).unwrap();
        let db = vol.tenant().db();
        let mut stale = None;
        each_stored_chunk(db, |i, first, span| {
            if i == ino && first == 0 {
                stale = Some((i, first, span));
            }
        })
        .unwrap();
        let stale = stale.expect("the first chunk names an extent file");
        vol.write(ino, 0, &[9u8; 1 << 20]).unwrap();
        assert_eq!(move_chunks(vol.tenant(), &vol.inodes, &[stale]).unwrap(), 0);
        assert!(vol.read(ino, 0, 1 << 20).unwrap() == vec![9u8; 1 << 20]);
    }
}
