//! Small filesystem helpers that keep on-disk state whole: a file is either its old or its new
//! content, never half-written.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file, fsync and rename, then syncs the directory.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes the directories in `dir` that a create or a delete left when it was killed:
/// `.creating-NAME-PID` and `.deleting-NAME-PID`, for `name` (or any name), of a process that
/// is gone, or of this one when `own` (the caller knows none of this process's is under way).
/// Returns how many it removed.
pub(crate) fn remove_leftovers(
    dir: &Path,
    name: Option<&str>,
    own: bool,
) -> std::io::Result<usize> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file_name
            .strip_prefix(".creating-")
            .or_else(|| file_name.strip_prefix(".deleting-"))
        else {
            continue;
        };
        let Some((of, pid)) = rest.rsplit_once('-') else {
            continue;
        };
        let left = pid
            .parse::<u32>()
            .is_ok_and(|pid| match pid == std::process::id() {
                true => own,
                false => crate::process::going_away(pid),
            });
        if left && name.is_none_or(|n| n == of) {
            fs::remove_dir_all(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Makes a directory's entries (creations, renames) durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Disk the regular files under `dir` take: allocated blocks, not file sizes (a store's
/// preallocated WAL is a few KiB long and may hold far more disk). A file linked under
/// several names in `dir` (a snapshot sharing its tenant's files) counts once.
pub(crate) fn tree_bytes(dir: &Path) -> u64 {
    tree_usage(dir).total
}

/// Disk the files under a directory take ([`tree_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TreeUsage {
    /// Every file once, however many names it has inside the directory.
    pub total: u64,
    /// Files with no name outside the directory: what removing it gives back.
    pub own: u64,
}

/// What the regular files under `dir` take (see [`TreeUsage`]).
pub(crate) fn tree_usage(dir: &Path) -> TreeUsage {
    let mut usage = TreeUsage::default();
    let mut linked = std::collections::HashMap::new();
    add_tree(dir, &mut usage, &mut linked);
    usage
}

/// Adds the files under `dir` to `usage`; `linked` counts the names seen of each file that
/// has several (by device and inode).
fn add_tree(
    dir: &Path,
    usage: &mut TreeUsage,
    linked: &mut std::collections::HashMap<(u64, u64), u64>,
) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => add_tree(&e.path(), usage, linked),
            Ok(t) if t.is_file() => {
                let Ok(m) = e.metadata() else { continue };
                let bytes = m.blocks() * 512;
                if m.nlink() < 2 {
                    usage.total += bytes;
                    usage.own += bytes;
                    continue;
                }
                let seen = linked.entry((m.dev(), m.ino())).or_insert(0);
                *seen += 1;
                if *seen == 1 {
                    usage.total += bytes;
                }
                if *seen == m.nlink() {
                    usage.own += bytes; // its last name is in here
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn atomic_write_replaces_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        super::write_atomic(&p, b"one", 0o600).unwrap();
        super::write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn tree_bytes_counts_allocated_disk() {
        let d = tempfile::tempdir().unwrap();
        let sparse = std::fs::File::create(d.path().join("sparse")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        assert_eq!(super::tree_bytes(d.path()), 0, "a hole takes no disk");
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/data"), vec![1u8; 8192]).unwrap();
        std::fs::File::open(d.path().join("sub/data"))
            .unwrap()
            .sync_all()
            .unwrap();
        let n = super::tree_bytes(d.path());
        assert!((8192..1 << 20).contains(&n), "{n}");
    }

    #[test]
    fn a_file_linked_twice_counts_once_and_is_own_only_with_every_name_inside() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let (inside, outside) = (d.path().join("in"), d.path().join("out"));
        std::fs::create_dir_all(inside.join("snap")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        for (name, len) in [("twice", 8192), ("shared", 16384)] {
            std::fs::write(inside.join(name), vec![1u8; len]).unwrap();
            std::fs::File::open(inside.join(name))
                .unwrap()
                .sync_all()
                .unwrap();
        }
        std::fs::hard_link(inside.join("twice"), inside.join("snap/twice")).unwrap();
        std::fs::hard_link(inside.join("shared"), outside.join("shared")).unwrap();
        let usage = super::tree_usage(&inside);
        let alone = |p: &std::path::Path| super::tree_usage(p).total;
        let (twice, shared) = (alone(&inside.join("snap")), alone(&outside));
        assert_eq!(usage.total, twice + shared, "each file once");
        assert_eq!(usage.own, twice, "the file linked outside is not its own");
        assert_eq!(super::tree_usage(&inside.join("snap")).own, 0);
    }
}
