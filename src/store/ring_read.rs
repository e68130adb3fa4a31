//! Extent disk reads the FUSE ring makes for a cold read (`serving::DiskRead`), and where the
//! read answered again finds their bytes.
//!
//! Why apart from `extents`: the store decides what to read (`ExtentFiles::read_parts`);
//! this is what a read is once handed over: its buffer, the file it reads, and what is done
//! with its bytes when the ring has made it. Once made, its bytes are decrypted, checked and
//! cached as a read made by its thread caches them, and the read answered again takes them
//! from here (`serving::made_reads`), not from the cache, where a second lookup would count
//! as a hit. Bytes that fail their check are neither cached nor taken: the read answered
//! again makes that disk read itself and reports the damage.

use std::sync::Arc;

use super::extent_io::{AlignedBuf, Reader};
use super::extent_span::ExtentSpan;
use crate::cache::RocksBlockCache;

/// A piece of a [`RingRead`]: cache key, span, first byte of the span read, place in `buf`.
pub(super) type ReadPiece = ([u8; 28], ExtentSpan, u32, std::ops::Range<usize>);

/// One disk read of extent bytes handed to the ring.
pub(super) struct RingRead {
    reader: Arc<Reader>,
    /// Where in the body, and in the file; how many bytes.
    start: u64,
    at: u64,
    len: usize,
    buf: AlignedBuf,
    cache: RocksBlockCache,
    /// For each part read: its cache key, its span, the first byte of the span read, and
    /// where those bytes are in `buf`.
    pieces: Vec<ReadPiece>,
    /// Which pieces matched their checksums (none until the read is done).
    checked: Vec<bool>,
}

impl RingRead {
    /// A read of `len` bytes from `start` of `reader`'s body (`at` in its file) into `buf`,
    /// holding `pieces`, cached in `cache` once checked.
    pub(super) fn new(
        reader: Arc<Reader>,
        (start, at, len): (u64, u64, usize),
        buf: AlignedBuf,
        cache: RocksBlockCache,
        pieces: Vec<ReadPiece>,
    ) -> Self {
        Self {
            reader,
            start,
            at,
            len,
            buf,
            cache,
            pieces,
            checked: Vec::new(),
        }
    }

    /// The pieces read that matched their checksums.
    fn checked(&self) -> impl Iterator<Item = &ReadPiece> {
        self.pieces
            .iter()
            .zip(&self.checked)
            .filter_map(|(p, &ok)| ok.then_some(p))
    }

    /// `f(at, bytes)` with checked bytes of `span` from `at <= lo` to at least `hi`, from a
    /// read made for the request answered again whose cache key is `key(at)` (the same
    /// store's): `None` if no such read holds them.
    pub(super) fn made_bytes<R>(
        span: &ExtentSpan,
        lo: u32,
        hi: u32,
        key: impl Fn(u32) -> [u8; 28],
        f: impl FnOnce(u32, &[u8]) -> R,
    ) -> Option<R> {
        crate::serving::made_reads(|reads| {
            let (r, (_, _, at, range)) = reads
                .iter()
                .filter_map(|r| r.as_any().downcast_ref::<RingRead>())
                .flat_map(|r| r.checked().map(move |p| (r, p)))
                .find(|(_, (k, s, at, range))| {
                    s == span
                        && *at <= lo
                        && u64::from(*at) + range.len() as u64 >= u64::from(hi)
                        && *k == key(*at)
                })?;
            Some(f(*at, &r.buf[range.clone()]))
        })
    }
}

impl crate::serving::DiskRead for RingRead {
    fn target(&mut self) -> (std::os::fd::RawFd, u64, *mut u8, usize) {
        use std::os::fd::AsRawFd;
        let fd = self.reader.fd().as_raw_fd();
        (fd, self.at, self.buf.as_mut_ptr(), self.len)
    }

    fn done(&mut self, result: std::io::Result<usize>) {
        if result.ok() != Some(self.len) {
            return;
        }
        self.reader.decrypt(self.start, &mut self.buf[..self.len]);
        self.checked = self
            .pieces
            .iter()
            .map(|(key, span, lo, range)| {
                let bytes = &self.buf[range.clone()];
                let ok = span.verify(*lo, bytes);
                if ok {
                    self.cache.insert_raw(key, bytes);
                }
                ok
            })
            .collect();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
