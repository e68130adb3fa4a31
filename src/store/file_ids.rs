//! File ids: what names a store file in the host cache's keys, so that stores that share the
//! file (a fork and its source, hard-linked by a checkpoint) share its cached bytes.
//!
//! Why: RocksDB keys a table's blocks by ids the table file carries, so forks already share
//! those; but it keys blob values by the reading store's own session, and tenantfs keyed
//! extent pieces by the reading store, so N forks reading the same unchanged data held N
//! copies of it in the cache. A file's id is 16 bytes of its header's seal (`file_key`), which
//! start with a random nonce: the same wherever the file is linked, and new whenever a file
//! is written again (a file taken from the extent pool gets a new header), so a cached piece
//! is never taken for another file's.
//!
//! Each store's [`FileIds`] learns the id of every blob and extent file whose header its Env
//! writes or opens (`ffi`) and of every extent file its reader opens; a file this store has
//! not opened yet has no id here, and its cache keys are those of the store alone until it
//! has (`ffi::BlobCacheKeys`, `ExtentFiles::cache_key`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::RwLock;

/// 16 bytes of a file's header ([`super::file_key::file_id`]).
pub(crate) type FileId = [u8; 16];

/// The kinds of store files whose bytes are cached by file id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CachedFile {
    /// `<number>.blob`: values of RocksDB's blob files.
    Blob,
    /// `extents/<number>.ext`: the store's extent files.
    Extent,
}

impl CachedFile {
    /// The first 4 bytes of a cache key of this kind's bytes.
    fn tag(self) -> &'static [u8; 4] {
        match self {
            CachedFile::Blob => b"tfb\0",
            CachedFile::Extent => b"tfx\0",
        }
    }

    /// The kind and number of the store file at `path`, if its bytes are cached by id.
    fn of_path(path: &Path) -> Option<(Self, u64)> {
        let name = path.file_name()?.to_str()?;
        let (number, kind) = match name.rsplit_once('.')? {
            (n, "blob") => (n, CachedFile::Blob),
            (n, "ext") => (n, CachedFile::Extent),
            _ => return None,
        };
        Some((kind, number.parse().ok()?))
    }
}

/// A cache key of `kind`'s bytes of file `id` at `offset`: 28 bytes, so never equal to one of
/// RocksDB's own keys (16 bytes).
pub(crate) fn cache_key(kind: CachedFile, id: &FileId, offset: u64) -> [u8; 28] {
    let mut k = [0u8; 28];
    k[..4].copy_from_slice(kind.tag());
    k[4..20].copy_from_slice(id);
    k[20..].copy_from_slice(&offset.to_be_bytes());
    k
}

/// The ids of one store's cached files, by kind and number.
#[derive(Default)]
pub(crate) struct FileIds {
    known: RwLock<HashMap<(CachedFile, u64), FileId>>,
}

impl FileIds {
    /// Notes the id of file `number` of `kind`.
    pub(crate) fn note(&self, kind: CachedFile, number: u64, id: FileId) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        known.insert((kind, number), id);
    }

    /// Notes the id in `header`, the header of the store file at `path` (written or read
    /// through the store's Env), if the file is of a kind cached by id.
    pub(crate) fn note_header(&self, path: &Path, header: &[u8]) {
        if let (Some((kind, number)), Some(id)) =
            (CachedFile::of_path(path), super::file_key::file_id(header))
        {
            self.note(kind, number, id);
        }
    }

    pub(crate) fn get(&self, kind: CachedFile, number: u64) -> Option<FileId> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known.get(&(kind, number)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_and_extent_files_are_told_apart_by_name_and_others_are_not_noted() {
        let of = |p: &str| CachedFile::of_path(Path::new(p));
        assert_eq!(of("/d/000123.blob"), Some((CachedFile::Blob, 123)));
        assert_eq!(of("/d/extents/00000007.ext"), Some((CachedFile::Extent, 7)));
        assert_eq!(of("/d/000123.sst"), None);
        assert_eq!(of("/d/MANIFEST-000005"), None);
        assert_eq!(of("/d/x.blob"), None);
        let ids = FileIds::default();
        let mut header = vec![0u8; super::super::file_key::PREFIX_LEN];
        ids.note_header(Path::new("/d/000001.blob"), &header);
        assert_eq!(
            ids.get(CachedFile::Blob, 1),
            None,
            "no tenantfs header: no id"
        );
        header[..8].copy_from_slice(b"TFSFILE2");
        header[16..32].copy_from_slice(&[9; 16]);
        ids.note_header(Path::new("/d/000001.blob"), &header);
        ids.note_header(Path::new("/d/000001.sst"), &header);
        assert_eq!(ids.get(CachedFile::Blob, 1), Some([9; 16]));
        assert_eq!(ids.get(CachedFile::Extent, 1), None);
        assert_ne!(
            cache_key(CachedFile::Blob, &[9; 16], 0),
            cache_key(CachedFile::Extent, &[9; 16], 0)
        );
    }
}
