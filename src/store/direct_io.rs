//! Whether a directory's filesystem supports O_DIRECT.
//!
//! Direct I/O keeps a tenant's store out of the kernel page cache, so the host block cache holds
//! the only RAM copy and co-resident tenants' pages are not evicted. Some filesystems (older
//! tmpfs, some FUSE and network filesystems) refuse O_DIRECT at open or at the first I/O, so the
//! store probes with a real aligned write and read before turning it on.
//!
//! The probe tells three answers apart: supported; not supported (the filesystem refuses
//! O_DIRECT: EINVAL, EOPNOTSUPP), the only case that falls back to buffered I/O; and "could not
//! tell" (any other error). A full disk is the third kind, not the second: its write probe fails
//! with ENOSPC, so the probe then reads an existing store file instead (every one starts with a
//! 4 KiB header, an aligned read), and only when there is none does the ENOSPC reach the caller.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

const ALIGN: usize = 4096;

/// What a filesystem answered to O_DIRECT.
#[derive(Debug)]
pub enum Support {
    Supported,
    /// The filesystem refuses O_DIRECT (the error it gave).
    Unsupported(std::io::Error),
}

/// Whether `e` means "this filesystem does not do O_DIRECT" (rather than a failed I/O).
pub fn is_unsupported(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

fn is_out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Probes O_DIRECT in `dir`: an aligned 4 KiB write and read back of a scratch file, or, when
/// the filesystem has no space for one, an aligned read of a file already in `dir`.
pub fn probe(dir: &Path) -> Result<Support, std::io::Error> {
    let path = dir.join(format!(".tenantfs-direct-io-probe-{}", std::process::id()));
    let written = write_probe(&path);
    let _ = fs::remove_file(&path);
    match written {
        Ok(()) => Ok(Support::Supported),
        Err(e) if is_unsupported(&e) => Ok(Support::Unsupported(e)),
        Err(e) if is_out_of_space(&e) => match read_probe(dir) {
            Some(Ok(())) => Ok(Support::Supported),
            Some(Err(r)) if is_unsupported(&r) => Ok(Support::Unsupported(r)),
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// An aligned block carved out of an ordinary allocation: no raw allocator calls needed.
fn aligned_block(storage: &mut [u8]) -> &mut [u8] {
    let start = storage.as_ptr().align_offset(ALIGN);
    &mut storage[start..start + ALIGN]
}

fn write_probe(path: &Path) -> Result<(), std::io::Error> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut storage = vec![0u8; 2 * ALIGN];
    let block = aligned_block(&mut storage);
    block.fill(0x5a);
    file.write_all(block)?;
    file.seek(SeekFrom::Start(0))?;
    std::io::Read::read_exact(&mut file, block)?;
    if block.iter().all(|&b| b == 0x5a) {
        Ok(())
    } else {
        Err(std::io::Error::other("O_DIRECT read back different bytes"))
    }
}

/// Reads the first 4 KiB of a regular file in `dir` with O_DIRECT; None if there is none.
fn read_probe(dir: &Path) -> Option<Result<(), std::io::Error>> {
    let file = fs::read_dir(dir).ok()?.flatten().find(|e| {
        e.metadata()
            .is_ok_and(|m| m.is_file() && m.len() >= ALIGN as u64)
    })?;
    let mut storage = vec![0u8; 2 * ALIGN];
    Some(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(file.path())
            .and_then(|f| f.read_exact_at(aligned_block(&mut storage), 0)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let _ = probe(dir.path());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn only_refusals_count_as_unsupported() {
        let e = std::io::Error::from_raw_os_error;
        assert!(is_unsupported(&e(libc::EINVAL)));
        assert!(is_unsupported(&e(libc::EOPNOTSUPP)));
        for other in [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EIO,
            libc::EROFS,
            libc::EACCES,
        ] {
            assert!(!is_unsupported(&e(other)), "errno {other}");
        }
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_fallback() {
        let dir = tempfile::tempdir().unwrap();
        assert!(probe(&dir.path().join("missing")).is_err());
    }
}
