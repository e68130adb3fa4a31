//! The extent files' bytes: an appender whose writes go through the store's encrypted Env
//! (`extent_files.cc`), encrypted and written asynchronously; a reader that decrypts what it
//! or the FUSE ring reads; and the aligned buffer O_DIRECT reads need. All the FFI and raw
//! memory of the extent files is here.

use std::ffi::{c_char, c_void, CString};
use std::path::Path;

use librocksdb_sys as sys;

use super::file_key::{self, PREFIX_LEN};
use crate::crypto::{FileCipher, Keyring};

extern "C" {
    fn tenantfs_extent_writer_open(
        env: *const sys::rocksdb_env_t,
        path: *const c_char,
        reuse: *const c_char,
        direct: i32,
        max_step: u64,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    fn tenantfs_extent_writer_append(
        writer: *mut c_void,
        data: *const c_char,
        len: usize,
        err: *mut *mut c_char,
    ) -> i32;
    fn tenantfs_extent_writer_wait(writer: *mut c_void, err: *mut *mut c_char) -> i32;
    fn tenantfs_extent_writer_sync(writer: *mut c_void, err: *mut *mut c_char) -> i32;
    fn tenantfs_extent_writer_close(writer: *mut c_void, err: *mut *mut c_char) -> i32;
}

/// The most disk space an extent file at `path` reserves ahead of its bytes at once: 1/64 of
/// its file system (64 MiB from 4 GiB up, 1 MiB at least), so what is reserved but not yet
/// written stays well inside the host's free-space reserve (`space`).
fn reserve_step(path: &Path) -> u64 {
    let total = path
        .parent()
        .and_then(|dir| nix::sys::statvfs::statvfs(dir).ok())
        .map_or(u64::MAX, |st| st.blocks() * st.fragment_size());
    (total / 64).clamp(1 << 20, 64 << 20)
}

/// O_DIRECT's alignment for offsets, lengths and buffers.
pub(crate) const ALIGN: usize = 4096;

/// The Env extent files are opened through: the store's encrypted Env, or none (the default
/// file system: a plaintext store, for benchmarks only).
#[derive(Clone, Copy)]
pub(crate) struct EnvPtr(*const sys::rocksdb_env_t);

// SAFETY: the Env is a thread-safe RocksDB object; the pointer is only passed to the shim,
// and its owner (`TenantDb`, which holds the `rocksdb::Env`) outlives every user (the
// extent files it owns).
unsafe impl Send for EnvPtr {}
// SAFETY: as for Send: the shim only calls const, thread-safe methods through it.
unsafe impl Sync for EnvPtr {}

impl EnvPtr {
    pub(crate) fn of(env: Option<&rocksdb::Env>) -> Self {
        use rocksdb::AsRawPtr;
        // SAFETY: only reads the pointer the Env wraps; it stays valid while the Env lives.
        Self(env.map_or(std::ptr::null(), |e| unsafe { e.as_raw_ptr() }.cast_const()))
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: NUL in path", path.display()))
}

/// Takes the shim's malloc'd error message.
fn take_err(err: *mut c_char) -> String {
    if err.is_null() {
        return "unknown error".into();
    }
    // SAFETY: the shim sets `err` to a NUL-terminated strdup'd string, freed here once.
    unsafe {
        let message = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
        libc::free(err.cast());
        message
    }
}

/// A shim call's result: 0, or -1 with its error message.
fn status(r: i32, err: *mut c_char) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(take_err(err))
    }
}

/// An extent file open for appends (see `extent_files.cc`).
pub(crate) struct Appender {
    raw: *mut c_void,
}

// SAFETY: the shim's writer is used by one thread at a time (callers hold `&mut`, or a
// mutex around it); its own writer thread is internal to it.
unsafe impl Send for Appender {}

impl Appender {
    /// Creates the file at `path`, or renames the file at `reuse` to it and writes it from
    /// its start (its blocks are reused, not freed).
    pub(crate) fn create(
        env: EnvPtr,
        path: &Path,
        reuse: Option<&Path>,
        direct: bool,
    ) -> Result<Self, String> {
        let p = c_path(path)?;
        let r = reuse.map(c_path).transpose()?;
        let r_ptr = r.as_ref().map_or(std::ptr::null(), |r| r.as_ptr());
        let max_step = reserve_step(path);
        let mut err = std::ptr::null_mut();
        // SAFETY: `env` is a live Env or null (the shim then uses the default file system);
        // `p` and `r` are NUL-terminated (or `r_ptr` null) and outlive the call.
        let raw = unsafe {
            tenantfs_extent_writer_open(
                env.0,
                p.as_ptr(),
                r_ptr,
                i32::from(direct),
                max_step,
                &mut err,
            )
        };
        if raw.is_null() {
            return Err(take_err(err));
        }
        Ok(Self { raw })
    }

    /// Hands `data` over (with O_DIRECT: a multiple of [`ALIGN`] long); it is in the file once
    /// [`Self::wait`] returns.
    pub(crate) fn append(&mut self, data: &[u8]) -> Result<(), String> {
        let mut err = std::ptr::null_mut();
        // SAFETY: `raw` is a live writer (freed only by `Drop`); the shim copies `data`
        // before it returns.
        let r = unsafe {
            tenantfs_extent_writer_append(self.raw, data.as_ptr().cast(), data.len(), &mut err)
        };
        status(r, err)
    }

    /// Waits until everything appended is in the file (not yet durable).
    pub(crate) fn wait(&mut self) -> Result<(), String> {
        let mut err = std::ptr::null_mut();
        // SAFETY: `raw` is a live writer.
        let r = unsafe { tenantfs_extent_writer_wait(self.raw, &mut err) };
        status(r, err)
    }

    /// Waits for everything appended and makes it durable.
    pub(crate) fn sync(&mut self) -> Result<(), String> {
        let mut err = std::ptr::null_mut();
        // SAFETY: `raw` is a live writer.
        let r = unsafe { tenantfs_extent_writer_sync(self.raw, &mut err) };
        status(r, err)
    }

    /// Waits for everything appended and closes the file.
    pub(crate) fn close(mut self) -> Result<(), String> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        let mut err = std::ptr::null_mut();
        // SAFETY: `raw` is live and, taken out of `self`, freed by the shim exactly once here.
        let r = unsafe { tenantfs_extent_writer_close(raw, &mut err) };
        status(r, err)
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            let mut err = std::ptr::null_mut();
            // SAFETY: `raw` is live and freed exactly once, here (`close` nulls it).
            if unsafe { tenantfs_extent_writer_close(self.raw, &mut err) } != 0 {
                tracing::warn!(error = %take_err(err), "closing an extent file failed");
            }
        }
    }
}

/// An extent file open for reads: its descriptor and the cipher of its body.
///
/// Read here rather than through the Env (as the appender writes): a read the FUSE ring
/// carries out itself (`serving::DiskRead`) needs the descriptor and the body's offset in the
/// file, and decrypts afterwards. The layout is the Env's: the file key's header
/// (`file_key`, [`PREFIX_LEN`] bytes), then the body under the file's CTR cipher at the
/// file's own offsets.
pub(crate) struct Reader {
    file: std::fs::File,
    /// None for a plaintext store (benchmarks), whose files have no header.
    cipher: Option<FileCipher>,
    /// The file's id (`file_ids`), from its header.
    id: Option<[u8; 16]>,
    direct: bool,
}

impl Reader {
    /// Opens the extent file at `path`; with `key`, its header must open under it.
    pub(crate) fn open(key: Option<&Keyring>, path: &Path, direct: bool) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = if direct { libc::O_DIRECT } else { 0 };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (cipher, id) = match key {
            None => (None, None),
            Some(key) => {
                let mut prefix = AlignedBuf::new(PREFIX_LEN);
                let n = pread_full(&file, &mut prefix[..], 0)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if n < PREFIX_LEN {
                    return Err(format!(
                        "{}: {n} bytes, shorter than its file key header",
                        path.display()
                    ));
                }
                let cipher = file_key::open_prefix(key, &prefix[..]).map_err(|e| {
                    format!(
                        "{}: {e} (wrong key, or the file header is damaged)",
                        path.display()
                    )
                })?;
                (Some(cipher), file_key::file_id(&prefix[..]))
            }
        };
        Ok(Self {
            file,
            cipher,
            id,
            direct,
        })
    }

    /// The file's id (`file_ids`); none for a plaintext file.
    pub(crate) fn file_id(&self) -> Option<[u8; 16]> {
        self.id
    }

    /// Reads and decrypts `len` bytes from `offset` of the body (both aligned, for O_DIRECT)
    /// into the start of `buf`; the count read (short at the end of the file).
    pub(crate) fn read(
        &self,
        offset: u64,
        buf: &mut AlignedBuf,
        len: usize,
    ) -> Result<usize, String> {
        let at = self.check(offset, buf, len)?;
        let n = pread_full(&self.file, &mut buf[..len], at).map_err(|e| e.to_string())?;
        self.decrypt(offset, &mut buf[..n]);
        Ok(n)
    }

    /// Where the body's bytes from `offset` lie in the file, for a read of `len` into `buf`
    /// that another carries out ([`Self::decrypt`] after it); an error if the read is not
    /// aligned for O_DIRECT or does not fit the buffer.
    pub(crate) fn check(&self, offset: u64, buf: &AlignedBuf, len: usize) -> Result<u64, String> {
        if len > buf.len()
            || (self.direct && !(offset.is_multiple_of(ALIGN as u64) && len.is_multiple_of(ALIGN)))
        {
            return Err(format!(
                "bad extent read: {len} bytes at {offset} into {} bytes",
                buf.len()
            ));
        }
        Ok(offset + self.body_start())
    }

    /// The file's descriptor, for reads carried out by another.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// Decrypts `data`, read from `offset` of the body.
    pub(crate) fn decrypt(&self, offset: u64, data: &mut [u8]) {
        if let Some(c) = &self.cipher {
            // The cipher runs at the file's own offsets, header included (as the Env's).
            c.apply(offset + self.body_start(), data);
        }
    }

    fn body_start(&self) -> u64 {
        if self.cipher.is_some() {
            PREFIX_LEN as u64
        } else {
            0
        }
    }
}

/// Reads into `buf` from `offset` until it is full or the file ends; the count read.
fn pread_full(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A zeroed byte buffer aligned to [`ALIGN`], of a length that is a multiple of it.
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: an owned heap buffer, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `len` rounded up to [`ALIGN`] zeroed bytes.
    pub(crate) fn new(len: usize) -> Self {
        let len = len.div_ceil(ALIGN).max(1) * ALIGN;
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("extent buffer size");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised (zeroed, then written) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).expect("as allocated");
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_buffer_is_aligned_rounded_up_and_zeroed() {
        let b = AlignedBuf::new(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
    }

    /// The reader opens what the Env's appender wrote: the header under the tenant's key, the
    /// body at the Env's offsets; a read carried out by another (the ring's) and decrypted
    /// after gives the same bytes; another key is refused with a clear message. The file's id
    /// the Env noted as it wrote the header is the one the reader finds in it.
    #[test]
    fn encrypted_appends_read_back_through_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.ext");
        let ring =
            |key| crate::crypto::Keyring::single(crate::crypto::KeyId::generate().unwrap(), key);
        let key = std::sync::Arc::new(ring(crate::crypto::TenantKey::generate().unwrap()));
        let ids = std::sync::Arc::new(crate::store::file_ids::FileIds::default());
        let env = crate::store::ffi::encrypted_env(std::sync::Arc::clone(&key), ids.clone());
        let env = env.unwrap();
        let mut w = Appender::create(EnvPtr::of(Some(&env)), &path, None, false).unwrap();
        let noted = ids.get(crate::store::file_ids::CachedFile::Extent, 1);
        assert!(
            noted.is_some(),
            "the Env notes the id of the header it writes"
        );
        let data: Vec<u8> = (0..4 * ALIGN).map(|i| (i % 253) as u8).collect();
        w.append(&data).unwrap();
        w.close().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(
            on_disk.len(),
            PREFIX_LEN + data.len(),
            "header, then the body"
        );
        assert_ne!(&on_disk[PREFIX_LEN..], &data[..], "the body is encrypted");
        let r = Reader::open(Some(&*key), &path, false).unwrap();
        assert_eq!(r.file_id(), noted);
        let mut buf = AlignedBuf::new(2 * ALIGN);
        assert_eq!(
            r.read(ALIGN as u64, &mut buf, 2 * ALIGN).unwrap(),
            2 * ALIGN
        );
        assert_eq!(&buf[..], &data[ALIGN..3 * ALIGN]);
        // Read by another: raw bytes from where `check` says, decrypted after.
        let at = r.check(2 * ALIGN as u64, &buf, 2 * ALIGN).unwrap();
        let mut raw = on_disk[at as usize..at as usize + 2 * ALIGN].to_vec();
        r.decrypt(2 * ALIGN as u64, &mut raw);
        assert_eq!(&raw[..], &data[2 * ALIGN..]);
        let other = ring(crate::crypto::TenantKey::generate().unwrap());
        let e = Reader::open(Some(&other), &path, false).err().unwrap();
        assert!(e.contains("wrong key"), "{e}");
        let short = dir.path().join("2.ext");
        std::fs::write(&short, b"TFSFILE1").unwrap();
        let e = Reader::open(Some(&*key), &short, false).err().unwrap();
        assert!(e.contains("shorter than its file key header"), "{e}");
    }

    #[test]
    fn appends_read_back_through_the_default_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.ext");
        let mut w = Appender::create(EnvPtr::of(None), &path, None, false).unwrap();
        let data: Vec<u8> = (0..3 * ALIGN).map(|i| (i % 251) as u8).collect();
        w.append(&data).unwrap();
        w.wait().unwrap();
        let r = Reader::open(None, &path, false).unwrap();
        let mut buf = AlignedBuf::new(2 * ALIGN);
        assert_eq!(
            r.read(ALIGN as u64, &mut buf, 2 * ALIGN).unwrap(),
            2 * ALIGN
        );
        assert!(r.read(0, &mut buf, 3 * ALIGN).is_err(), "past the buffer");
        assert_eq!(&buf[..], &data[ALIGN..]);
        w.close().unwrap();
        // Closed: trimmed to what was appended (space was reserved ahead); past it, short.
        assert_eq!(
            r.read(2 * ALIGN as u64, &mut buf, 2 * ALIGN).unwrap(),
            ALIGN
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * ALIGN as u64);
        let missing = dir.path().join("no/such/dir.ext");
        assert!(Appender::create(EnvPtr::of(None), &missing, None, false).is_err());
        // Reused: renamed, written from its start, the rest of the old bytes left as they were.
        let again = dir.path().join("2.ext");
        let mut w = Appender::create(EnvPtr::of(None), &again, Some(&path), false).unwrap();
        w.append(&data[..ALIGN]).unwrap();
        w.wait().unwrap();
        assert!(!path.exists());
        let r = Reader::open(None, &again, false).unwrap();
        let mut buf = AlignedBuf::new(ALIGN);
        assert_eq!(r.read(0, &mut buf, ALIGN).unwrap(), ALIGN);
        assert_eq!(&buf[..], &data[..ALIGN]);
    }
}
