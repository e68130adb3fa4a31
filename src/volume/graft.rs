//! Grafting a base image's tree into a new volume: inodes, directory entries and extents that
//! reference the base's blocks, written directly; no file data is copied. Reads of those
//! blocks go through the volume's `BaseBlocks`; the first write to one copies it into the
//! tenant's private extents (the normal partial-write path), so neither the base nor any other
//! tenant ever sees it.

use std::collections::HashMap;
use std::time::SystemTime;

use super::codec::*;
use super::{Attr, FileKind, Result, Volume, VolumeError, ROOT_INO};
use crate::store::Family;

/// One path of a tree to graft. `path` is relative ("" is the root; components split by '/');
/// parents come before their children.
#[derive(Clone, Debug)]
pub struct GraftNode {
    pub path: Vec<u8>,
    pub kind: FileKind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub size: u64,
    pub rdev: u32,
    /// A symlink's target (empty for others).
    pub target: Vec<u8>,
    /// (block index, base reference) of a regular file's non-hole blocks.
    pub blocks: Vec<(u64, Vec<u8>)>,
}

/// Keys written per batch while grafting.
const GRAFT_BATCH: usize = 8192;

impl Volume {
    /// Fills this volume, which must be empty, with `nodes`. `label` (the base's name) is kept
    /// while grafting: a crash in the middle leaves a volume that refuses to open, so a
    /// half-built tenant is never served. Returns the number of nodes grafted.
    pub fn graft(&self, label: &str, nodes: impl IntoIterator<Item = GraftNode>) -> Result<u64> {
        let _ns = self.lock_namespace();
        if !self.readdir(ROOT_INO)?.is_empty() {
            return Err(VolumeError::NotEmpty);
        }
        let db = self.db();
        let mut b = db.batch();
        b.put(Family::Meta, GRAFTING_KEY, label.as_bytes());
        db.write(b)?;
        db.sync()?;
        let (mut root, _) = self.load(ROOT_INO)?;
        // Directories stay in memory until the end: their link counts grow with subdirectories.
        let mut dirs: HashMap<Vec<u8>, Attr> = HashMap::new();
        let mut b = db.batch();
        let mut count = 0u64;
        for node in nodes {
            count += 1;
            if node.path.is_empty() {
                root.perm = node.perm;
                root.uid = node.uid;
                root.gid = node.gid;
                root.mtime = node.mtime;
                dirs.insert(Vec::new(), root.clone());
                continue;
            }
            let (parent_path, name) = match node.path.iter().rposition(|&c| c == b'/') {
                Some(i) => (node.path[..i].to_vec(), node.path[i + 1..].to_vec()),
                None => (Vec::new(), node.path.clone()),
            };
            if dirs.is_empty() {
                dirs.insert(Vec::new(), root.clone());
            }
            let parent = dirs.get_mut(&parent_path).ok_or(VolumeError::Invalid)?;
            let ino = self
                .next_ino
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let is_dir = node.kind == FileKind::Dir;
            if is_dir {
                parent.nlink += 1;
            }
            let parent_ino = parent.ino;
            let attr = Attr {
                ino,
                kind: node.kind,
                perm: node.perm & 0o7777,
                uid: node.uid,
                gid: node.gid,
                nlink: if is_dir { 2 } else { 1 },
                size: match node.kind {
                    FileKind::File => node.size,
                    FileKind::Symlink => node.target.len() as u64,
                    _ => 0,
                },
                rdev: node.rdev,
                parent: if is_dir { parent_ino } else { 0 },
                atime: node.mtime,
                mtime: node.mtime,
                ctime: node.mtime,
                crtime: node.mtime,
                blocks: 0,
            };
            b.put(
                Family::Dirents,
                &dirent_key(parent_ino, &name),
                &dirent_value(ino, node.kind),
            );
            for (index, reference) in &node.blocks {
                b.put(
                    Family::Extents,
                    &extent_key(ino, *index),
                    &base_extent(reference),
                );
            }
            if is_dir {
                dirs.insert(node.path, attr);
            } else {
                self.store_attr(&mut b, &attr, &node.target);
            }
            if b.len() >= GRAFT_BATCH {
                db.write(std::mem::replace(&mut b, db.batch()))?;
            }
        }
        for attr in dirs.values() {
            self.store_attr(&mut b, attr, &[]);
        }
        b.delete(Family::Meta, GRAFTING_KEY);
        db.write(b)?;
        db.sync()?;
        // The grafted tree is charged as written files are (each tenant from a base pays
        // for the files it holds, shared or not).
        self.check_usage()?;
        Ok(count)
    }
}
