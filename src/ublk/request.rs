//! What one ublk I/O descriptor asks for, decoded from the kernel's `ublksrv_io_desc` fields
//! (op in the low byte of `op_flags`, FUA as a flag, sectors of 512 bytes), and the result
//! the kernel takes back: the bytes done, or a negative errno.

use libublk::sys;

/// A request of /dev/ublkbN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    /// DISCARD and WRITE_ZEROES: both punch holes (a hole reads as zeros).
    Discard {
        offset: u64,
        len: u64,
        fua: bool,
    },
    /// An op this server does not take (zoned ops, WRITE_SAME): answered EOPNOTSUPP.
    Unsupported(u32),
}

impl Request {
    /// Decodes a descriptor's fields; `max_len` is the I/O buffer's size (the kernel never
    /// sends more in one READ or WRITE; a larger one is refused rather than trusted).
    pub fn decode(op_flags: u32, start_sector: u64, nr_sectors: u32, max_len: u32) -> Self {
        let offset = start_sector << 9;
        let bytes = u64::from(nr_sectors) << 9;
        let fua = op_flags & sys::UBLK_IO_F_FUA != 0;
        match op_flags & 0xff {
            sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE if bytes > u64::from(max_len) => {
                Request::Unsupported(op_flags & 0xff)
            }
            sys::UBLK_IO_OP_READ => Request::Read {
                offset,
                len: bytes as u32,
            },
            sys::UBLK_IO_OP_WRITE => Request::Write {
                offset,
                len: bytes as u32,
                fua,
            },
            sys::UBLK_IO_OP_FLUSH => Request::Flush,
            sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => Request::Discard {
                offset,
                len: bytes,
                fua,
            },
            op => Request::Unsupported(op),
        }
    }

    /// Whether it is carried out without a sync (not a FLUSH, not FUA).
    pub fn is_quick(&self) -> bool {
        match *self {
            Request::Read { .. } | Request::Unsupported(_) => true,
            Request::Write { fua, .. } | Request::Discard { fua, .. } => !fua,
            Request::Flush => false,
        }
    }

    /// The result the kernel takes for a request carried out: the bytes it covered (0 for
    /// a flush).
    pub fn done(&self) -> i32 {
        match *self {
            Request::Read { len, .. } | Request::Write { len, .. } => len as i32,
            // DISCARD/WRITE_ZEROES lengths can exceed i32: the driver only checks for >= 0.
            Request::Discard { .. } | Request::Flush => 0,
            Request::Unsupported(_) => -libc::EOPNOTSUPP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u32 = 256 << 10;

    #[test]
    fn descriptors_decode_to_requests() {
        assert_eq!(
            Request::decode(sys::UBLK_IO_OP_READ, 8, 8, MAX),
            Request::Read {
                offset: 4096,
                len: 4096
            }
        );
        assert_eq!(
            Request::decode(sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA, 1, 1, MAX),
            Request::Write {
                offset: 512,
                len: 512,
                fua: true
            }
        );
        assert_eq!(
            Request::decode(sys::UBLK_IO_OP_FLUSH, 0, 0, MAX),
            Request::Flush
        );
        // A discard may be far larger than the I/O buffer: it carries no data.
        let big = Request::decode(sys::UBLK_IO_OP_DISCARD, 0, u32::MAX, MAX);
        assert_eq!(
            big,
            Request::Discard {
                offset: 0,
                len: u64::from(u32::MAX) << 9,
                fua: false
            }
        );
        assert_eq!(big.done(), 0);
        assert!(big.is_quick());
        assert!(!Request::decode(sys::UBLK_IO_OP_FLUSH, 0, 0, MAX).is_quick());
        assert!(!Request::decode(sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA, 0, 8, MAX).is_quick());
        assert!(matches!(
            Request::decode(
                sys::UBLK_IO_OP_WRITE_ZEROES | sys::UBLK_IO_F_NOUNMAP,
                2,
                2,
                MAX
            ),
            Request::Discard {
                offset: 1024,
                len: 1024,
                ..
            }
        ));
    }

    #[test]
    fn what_is_not_served_is_refused() {
        for op in [
            sys::UBLK_IO_OP_WRITE_SAME,
            sys::UBLK_IO_OP_ZONE_APPEND,
            0xfe,
        ] {
            let r = Request::decode(op, 0, 8, MAX);
            assert_eq!(r, Request::Unsupported(op));
            assert_eq!(r.done(), -libc::EOPNOTSUPP);
        }
        // More than the buffer holds: refused, never read or written past it.
        let r = Request::decode(sys::UBLK_IO_OP_READ, 0, (MAX >> 9) + 1, MAX);
        assert!(matches!(r, Request::Unsupported(_)));
        assert_eq!(
            Request::decode(sys::UBLK_IO_OP_READ, 0, MAX >> 9, MAX).done(),
            MAX as i32
        );
    }
}
