//! Whether a directory's filesystem supports O_DIRECT.
//!
//! Direct I/O keeps a tenant's store out of the kernel page cache, so the host block cache holds
//! the only RAM copy and co-resident tenants' pages are not evicted. Some filesystems (older
//! tmpfs, some FUSE and network filesystems) refuse O_DIRECT at open or at the first write, so the
//! store probes with a real aligned write before turning it on, and falls back to buffered I/O
//! with one warning.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

const ALIGN: usize = 4096;

/// Writes and reads back one aligned 4 KiB block with O_DIRECT in `dir`.
pub fn probe(dir: &Path) -> Result<(), std::io::Error> {
    let path = dir.join(format!(".tenantfs-direct-io-probe-{}", std::process::id()));
    let result = probe_file(&path);
    let _ = fs::remove_file(&path);
    result
}

fn probe_file(path: &Path) -> Result<(), std::io::Error> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    // An aligned block carved out of an ordinary allocation: no raw allocator calls needed.
    let mut storage = vec![0u8; 2 * ALIGN];
    let start = storage.as_ptr().align_offset(ALIGN);
    let block = &mut storage[start..start + ALIGN];
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

#[cfg(test)]
mod tests {
    #[test]
    fn probe_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let _ = super::probe(dir.path());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
