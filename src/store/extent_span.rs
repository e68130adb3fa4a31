//! Extent spans: where a run of a store's bulk bytes is in its extent files, and the
//! checksums that tell a damaged byte from a sound one.
//!
//! Why its own module: the span is the value format (`volume::codec` stores its encoding in
//! chunk values, data format 5), read by the volume and by extent collection; `extents`
//! only hands spans out and reads them back. A span checks its bytes by 4 KiB piece, so a
//! read of part of it takes only the pieces it covers ([`ExtentSpan::cover`]).

/// Bytes each piece checksum of a span covers: the least a read takes from disk alone.
pub const PIECE: u32 = 4096;
/// Pieces in the largest span (a 64 KiB chunk).
pub(crate) const MAX_PIECES: usize = (64 << 10) / PIECE as usize;

/// Where a run of bytes is: file number, offset in the file's body, length, and checksums of
/// the bytes (AES-CTR does not detect a changed byte: these do, as blob records' checksums do).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtentSpan {
    pub file: u64,
    pub offset: u64,
    pub len: u32,
    pub check: SpanCheck,
}

/// A span's checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SpanCheck {
    /// The XXH3-64 of the whole span (spans written before pieces): read whole only.
    Whole(u64),
    /// The low 32 bits of the XXH3-64 of each [`PIECE`] (the last one maybe shorter; unused
    /// entries 0): a read of a few pieces of a span reads and checks only those (a 4 KiB
    /// random read costs a 4 KiB disk read, not 64 KiB). 32 bits per 4 KiB, as btrfs's
    /// crc32c: a damaged piece passes once in 4 billion.
    Pieces([u32; MAX_PIECES]),
}

/// The whole-span checksum of `bytes`.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// The checksum of one piece.
fn piece_sum(bytes: &[u8]) -> u32 {
    checksum(bytes) as u32
}

impl SpanCheck {
    /// The piece checksums of `bytes` (at most [`MAX_PIECES`] pieces).
    pub(crate) fn pieces(bytes: &[u8]) -> Self {
        let mut sums = [0u32; MAX_PIECES];
        for (sum, piece) in sums.iter_mut().zip(bytes.chunks(PIECE as usize)) {
            *sum = piece_sum(piece);
        }
        SpanCheck::Pieces(sums)
    }
}

impl ExtentSpan {
    /// The length of [`Self::encode`] for a span with a whole checksum.
    pub const WHOLE_LEN: usize = 28;

    fn pieces(&self) -> usize {
        self.len.div_ceil(PIECE) as usize
    }

    /// file ‖ offset ‖ len ‖ the whole checksum (8 bytes) or one 4-byte checksum per piece,
    /// all big-endian. Which of the two an encoding holds is the caller's to record (its
    /// length does not tell: a two-piece span's is 28 bytes as well).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(20 + 4 * MAX_PIECES);
        b.extend_from_slice(&self.file.to_be_bytes());
        b.extend_from_slice(&self.offset.to_be_bytes());
        b.extend_from_slice(&self.len.to_be_bytes());
        match &self.check {
            SpanCheck::Whole(sum) => b.extend_from_slice(&sum.to_be_bytes()),
            SpanCheck::Pieces(sums) => {
                for sum in &sums[..self.pieces()] {
                    b.extend_from_slice(&sum.to_be_bytes());
                }
            }
        }
        b
    }

    /// A span encoded with its whole checksum.
    pub fn decode_whole(b: &[u8]) -> Option<Self> {
        let (file, offset, len, rest) = Self::decode_head(b)?;
        let check = SpanCheck::Whole(u64::from_be_bytes(rest.try_into().ok()?));
        Some(Self {
            file,
            offset,
            len,
            check,
        })
    }

    /// A span encoded with piece checksums.
    pub fn decode_pieces(b: &[u8]) -> Option<Self> {
        let (file, offset, len, rest) = Self::decode_head(b)?;
        let n = len.div_ceil(PIECE) as usize;
        if n > MAX_PIECES || rest.len() != 4 * n {
            return None;
        }
        let mut sums = [0u32; MAX_PIECES];
        for (sum, bytes) in sums.iter_mut().zip(rest.chunks_exact(4)) {
            *sum = u32::from_be_bytes(bytes.try_into().ok()?);
        }
        Some(Self {
            file,
            offset,
            len,
            check: SpanCheck::Pieces(sums),
        })
    }

    fn decode_head(b: &[u8]) -> Option<(u64, u64, u32, &[u8])> {
        if b.len() < 20 {
            return None;
        }
        Some((
            u64::from_be_bytes(b[..8].try_into().ok()?),
            u64::from_be_bytes(b[8..16].try_into().ok()?),
            u32::from_be_bytes(b[16..20].try_into().ok()?),
            &b[20..],
        ))
    }

    /// What a read of bytes `[lo, hi)` of the span takes from it: the whole pieces around
    /// them, or the whole span when it has one checksum.
    pub(crate) fn cover(&self, lo: u32, hi: u32) -> (u32, u32) {
        match self.check {
            SpanCheck::Pieces(_) if lo < hi && hi <= self.len => (
                lo / PIECE * PIECE,
                (hi.div_ceil(PIECE) * PIECE).min(self.len),
            ),
            _ => (0, self.len),
        }
    }

    /// Whether `bytes`, the span's bytes from `at` (a cover's start), match its checksums.
    pub(crate) fn verify(&self, at: u32, bytes: &[u8]) -> bool {
        let fits = u64::from(at) + bytes.len() as u64 <= u64::from(self.len);
        match &self.check {
            SpanCheck::Whole(sum) => {
                at == 0 && bytes.len() == self.len as usize && checksum(bytes) == *sum
            }
            SpanCheck::Pieces(sums) => {
                let first = (at / PIECE) as usize;
                fits && at.is_multiple_of(PIECE)
                    && bytes
                        .chunks(PIECE as usize)
                        .zip(&sums[first..])
                        .all(|(piece, sum)| piece_sum(piece) == *sum)
            }
        }
    }
}

/// Bytes `[lo, hi)` of a span, to read.
#[derive(Clone, Copy, Debug)]
pub struct SpanPart {
    pub span: ExtentSpan,
    pub lo: u32,
    pub hi: u32,
}

impl SpanPart {
    pub fn whole(span: ExtentSpan) -> Self {
        Self {
            span,
            lo: 0,
            hi: span.len,
        }
    }
}
