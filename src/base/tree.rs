//! The tree of a base: every path of the imported directory with its attributes, in a stable
//! order (parents before children, names sorted), so a tenant created from the base gets the
//! same tree. A raw image's tree is one regular file.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::BaseError;

/// What a base was imported from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// A directory tree.
    Tree,
    /// A raw disk image: the base's tree is that one file.
    Image,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

/// One path of a base tree. `path` is relative to the tree's root ("" is the root itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits (and setuid/setgid/sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub size: u64,
    pub rdev: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Vec<u8>>,
}

fn kind_of(meta: &std::fs::Metadata) -> EntryKind {
    let t = meta.file_type();
    if t.is_dir() {
        EntryKind::Dir
    } else if t.is_symlink() {
        EntryKind::Symlink
    } else if t.is_fifo() {
        EntryKind::Fifo
    } else if t.is_socket() {
        EntryKind::Socket
    } else if t.is_char_device() {
        EntryKind::CharDev
    } else if t.is_block_device() {
        EntryKind::BlockDev
    } else {
        EntryKind::File
    }
}

impl TreeEntry {
    fn from_meta(path: Vec<u8>, meta: &std::fs::Metadata, target: Option<Vec<u8>>) -> Self {
        let kind = kind_of(meta);
        Self {
            path,
            kind,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime_sec: meta.mtime(),
            mtime_nsec: meta.mtime_nsec() as u32,
            size: if kind == EntryKind::File {
                meta.size()
            } else {
                0
            },
            rdev: meta.rdev(),
            target,
        }
    }

    /// The tree of a raw image: one file named as the image.
    pub fn image(source: &Path, meta: &std::fs::Metadata) -> Self {
        let name = source
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_else(|| b"disk.img".to_vec());
        Self::from_meta(name, meta, None)
    }

    /// Where this entry's bytes are read from during the import.
    pub fn source_path(&self, source: &Path, kind: SourceKind) -> PathBuf {
        match kind {
            SourceKind::Image => source.to_owned(),
            SourceKind::Tree if self.path.is_empty() => source.to_owned(),
            SourceKind::Tree => source.join(std::ffi::OsStr::from_bytes(&self.path)),
        }
    }
}

/// Every path under `root` (not following symlinks), parents first, names sorted.
pub fn walk(root: &Path) -> Result<Vec<TreeEntry>, BaseError> {
    let err = |path: &Path, e: std::io::Error| BaseError::Source {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    let meta = std::fs::symlink_metadata(root).map_err(|e| err(root, e))?;
    let mut out = vec![TreeEntry::from_meta(Vec::new(), &meta, None)];
    let mut dirs = vec![Vec::<u8>::new()];
    while let Some(rel) = dirs.pop() {
        let dir = root.join(std::ffi::OsStr::from_bytes(&rel));
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| err(&dir, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| err(&dir, e))?;
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let mut child = rel.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(name.as_bytes());
            let path = dir.join(&name);
            let meta = std::fs::symlink_metadata(&path).map_err(|e| err(&path, e))?;
            let target = if meta.file_type().is_symlink() {
                Some(
                    std::fs::read_link(&path)
                        .map_err(|e| err(&path, e))?
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else {
                None
            };
            let entry = TreeEntry::from_meta(child.clone(), &meta, target);
            if entry.kind == EntryKind::Dir {
                subdirs.push(child);
            }
            out.push(entry);
        }
        // Depth first, in name order.
        dirs.extend(subdirs.into_iter().rev());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_lists_parents_first_with_kinds() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("b/c")).unwrap();
        std::fs::write(r.join("b/c/f"), b"x").unwrap();
        std::fs::write(r.join("a"), b"hello").unwrap();
        std::os::unix::fs::symlink("a", r.join("l")).unwrap();
        let e = walk(r).unwrap();
        let paths: Vec<_> = e
            .iter()
            .map(|e| String::from_utf8(e.path.clone()).unwrap())
            .collect();
        assert_eq!(paths, ["", "a", "b", "l", "b/c", "b/c/f"]);
        assert_eq!(e[1].size, 5);
        assert_eq!(e[3].kind, EntryKind::Symlink);
        assert_eq!(e[3].target.as_deref(), Some(&b"a"[..]));
        assert_eq!(e[4].kind, EntryKind::Dir);
    }
}
