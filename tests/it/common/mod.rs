//! Helpers shared by the integration tests: a real data dir with a real master key in a temp dir.
#![allow(dead_code)]

pub mod cgroup;
pub mod crash_point;
pub mod guards;
pub mod mount;
pub mod process;
pub mod trees;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tenantfs::data_dir::DataDir;
use tenantfs::store::{DirectIo, StoreHost};

pub struct TestHost {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub data: DataDir,
    pub host: StoreHost,
}

impl TestHost {
    pub fn new(direct_io: DirectIo) -> Self {
        // Under /var/tmp: a disk filesystem where O_DIRECT works (tmpfs may not take it).
        let tmp = tempfile::Builder::new()
            .prefix("tenantfs-test-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let root = tmp.path().join("data");
        DataDir::init(&root, None).unwrap();
        let data = DataDir::open(&root, None).unwrap();
        let host = StoreHost::builder()
            .block_cache_bytes(64 << 20)
            .direct_io(direct_io)
            .build();
        Self {
            tmp,
            root,
            data,
            host,
        }
    }
}

/// Bytes on disk (`st_blocks`) of the files under `dir` that have one link: what it holds
/// of its own, not shared with another directory.
pub fn own_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    files_under(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap())
        .filter(|m| m.nlink() == 1)
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Every regular file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files_under(&e.path()));
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// Path -> content of every file under `dir`.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    files_under(dir)
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Deterministic pseudo-random bytes (xorshift), so values do not compress away.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
