//! Trees of files as tests compare them: manifests (kinds, modes, owners, sizes, hashes,
//! xattrs, link targets), file hashes, xattrs, the bytes a sparse file holds, synced writes.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What a tree entry looks like, everything `cp -a` promises to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File {
        perm: u32,
        uid: u32,
        gid: u32,
        nlink: u64,
        size: u64,
        mtime: (i64, i64),
        hash: String,
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Dir {
        perm: u32,
        uid: u32,
        gid: u32,
        mtime: (i64, i64),
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Symlink {
        target: PathBuf,
        uid: u32,
        gid: u32,
        mtime: (i64, i64),
    },
    Fifo {
        perm: u32,
        uid: u32,
        gid: u32,
    },
}

pub fn hash_file(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::io::copy(&mut f, &mut h).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    h.finalize().to_hex().to_string()
}

/// user.* extended attributes of `path` (not following symlinks).
pub fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: `c` is a NUL-terminated path and `names` a buffer of the length passed;
    // llistxattr writes at most that many bytes into it.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name).unwrap();
        let mut value = vec![0u8; 64 * 1024];
        // SAFETY: `c` and `cn` are NUL-terminated; `value` is a buffer of the length
        // passed, which lgetxattr does not write past.
        let len = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cn.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(len >= 0, "getxattr {}", path.display());
        value.truncate(len as usize);
        out.insert(name.to_vec(), value);
    }
    out
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: `c` and `n` are NUL-terminated; setxattr reads `value.len()` bytes of
    // `value`, which it holds.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Every entry under `root` (relative path -> node), `root` itself excluded.
pub fn manifest(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()));
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()));
        let p = e.path();
        let m = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let t = m.file_type();
        let rel = p.strip_prefix(root).unwrap().to_owned();
        let perm = m.mode() & 0o7777;
        let mtime = (m.mtime(), m.mtime_nsec());
        let node = if t.is_symlink() {
            Node::Symlink {
                target: std::fs::read_link(&p).unwrap(),
                uid: m.uid(),
                gid: m.gid(),
                mtime,
            }
        } else if t.is_dir() {
            walk(root, &p, out);
            Node::Dir {
                perm,
                uid: m.uid(),
                gid: m.gid(),
                mtime,
                xattrs: xattrs(&p),
            }
        } else if t.is_file() {
            Node::File {
                perm,
                uid: m.uid(),
                gid: m.gid(),
                nlink: m.nlink(),
                size: m.len(),
                mtime,
                hash: hash_file(&p),
                xattrs: xattrs(&p),
            }
        } else if t.is_fifo() {
            Node::Fifo {
                perm,
                uid: m.uid(),
                gid: m.gid(),
            }
        } else {
            panic!("unexpected file type at {}", p.display());
        };
        out.insert(rel, node);
    }
}

/// Asserts two manifests are equal, naming the first difference.
pub fn assert_same_tree(want: &BTreeMap<PathBuf, Node>, got: &BTreeMap<PathBuf, Node>, what: &str) {
    for (p, n) in want {
        match got.get(p) {
            None => panic!("{what}: {} missing", p.display()),
            Some(g) => assert_eq!(g, n, "{what}: {} differs", p.display()),
        }
    }
    for p in got.keys() {
        assert!(want.contains_key(p), "{what}: unexpected {}", p.display());
    }
}

/// Bytes of `path` that hold data, by walking SEEK_DATA/SEEK_HOLE.
pub fn data_bytes(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let fd = f.as_raw_fd();
    let size = f.metadata().unwrap().len() as i64;
    let mut total = 0u64;
    let mut pos = 0i64;
    while pos < size {
        // SAFETY: lseek takes a descriptor and integers; `fd` is open while `f` lives.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "SEEK_DATA: {e}");
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        assert!(
            hole > data,
            "SEEK_HOLE from {data} gave {hole}: {}",
            std::io::Error::last_os_error()
        );
        total += (hole - data) as u64;
        pos = hole;
    }
    total
}

/// Writes `data` to a new file and fsyncs it.
pub fn write_synced(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// fsync on a directory.
pub fn sync_dir(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}
