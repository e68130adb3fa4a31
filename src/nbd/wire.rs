//! The NBD wire format (the protocol's doc/proto.md): the fixed newstyle handshake's magic
//! numbers, options and option replies, transmission requests and simple replies. All numbers
//! are big-endian. Parsing is bounds-checked; nothing here does I/O.

/// "NBDMAGIC": the first 8 bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the newstyle magic, and the start of every option a client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
const REP_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR | 3;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR | 6;

/// Information types (`NBD_REP_INFO`).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TX_HAS_FLAGS: u16 = 1 << 0;
pub const TX_SEND_FLUSH: u16 = 1 << 2;
pub const TX_SEND_FUA: u16 = 1 << 3;
pub const TX_SEND_TRIM: u16 = 1 << 5;
pub const TX_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TX_CAN_MULTI_CONN: u16 = 1 << 8;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;

/// Error values of replies (Linux errno numbers, as the protocol defines them).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The protocol's error for `errno` (those it does not define are EIO).
pub fn error_for(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EACCES | libc::EROFS => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW | libc::EFBIG => EOVERFLOW,
        libc::EOPNOTSUPP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// What the server sends first: magic, newstyle magic, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut g = [0u8; 18];
    g[..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    g[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// An option's header: IHAVEOPT, option, length of the data that follows.
pub const OPTION_HEADER: usize = 16;

/// Parses an option header into (option, data length); `None` if the magic is wrong.
pub fn option_header(h: &[u8; OPTION_HEADER]) -> Option<(u32, u32)> {
    (be64(h, 0) == IHAVEOPT).then(|| (be32(h, 8), be32(h, 12)))
}

/// One option reply.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(20 + data.len());
    r.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    r.extend_from_slice(&option.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&(data.len() as u32).to_be_bytes());
    r.extend_from_slice(data);
    r
}

/// `NBD_INFO_EXPORT`: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut d = Vec::with_capacity(12);
    d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    d
}

/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum request sizes.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut d = Vec::with_capacity(14);
    d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    for v in [min, preferred, max] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    d
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`: the export name and the information types
/// the client asks for; `None` if the lengths do not add up.
pub fn parse_info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = be32(data.get(..4)?, 0) as usize;
    let name = data.get(4..4usize.checked_add(name_len)?)?;
    let rest = &data[4 + name_len..];
    let count = be16(rest.get(..2)?, 0) as usize;
    let list = rest.get(2..)?;
    if list.len() != count * 2 {
        return None;
    }
    Some((name, list.chunks(2).map(|c| be16(c, 0)).collect()))
}

/// A transmission request's header.
pub const REQUEST_HEADER: usize = 28;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses a request header; `None` if the magic is wrong.
pub fn request(h: &[u8; REQUEST_HEADER]) -> Option<Request> {
    (be32(h, 0) == REQUEST_MAGIC).then(|| Request {
        flags: be16(h, 4),
        kind: be16(h, 6),
        cookie: be64(h, 8),
        offset: be64(h, 16),
        length: be32(h, 24),
    })
}

/// A simple reply's header (a successful read's data follows it).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    r[4..8].copy_from_slice(&error.to_be_bytes());
    r[8..].copy_from_slice(&cookie.to_be_bytes());
    r
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_a_bad_magic_is_refused() {
        let mut h = [0u8; REQUEST_HEADER];
        h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        h[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        h[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        h[16..24].copy_from_slice(&(5u64 << 30).to_be_bytes());
        h[24..].copy_from_slice(&65536u32.to_be_bytes());
        let r = request(&h).unwrap();
        assert_eq!(
            r,
            Request {
                flags: CMD_FLAG_FUA,
                kind: CMD_WRITE,
                cookie: 0x0102_0304_0506_0708,
                offset: 5 << 30,
                length: 65536
            }
        );
        h[0] ^= 1;
        assert_eq!(request(&h), None);
    }

    #[test]
    fn info_requests_parse_only_when_their_lengths_add_up() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"vol");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        let (name, infos) = parse_info_request(&d).unwrap();
        assert_eq!(
            (name, infos),
            (&b"vol"[..], vec![INFO_BLOCK_SIZE, INFO_EXPORT])
        );
        assert!(parse_info_request(&d[..d.len() - 1]).is_none());
        let mut long_name = d.clone();
        long_name[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&long_name).is_none());
        assert!(parse_info_request(&[0, 0]).is_none());
    }

    #[test]
    fn replies_and_errors_have_the_protocols_layout() {
        let r = option_reply(OPT_GO, REP_ERR_UNKNOWN, b"no");
        assert_eq!(r.len(), 22);
        assert_eq!(&r[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&r[12..16], &0x8000_0006u32.to_be_bytes());
        let s = simple_reply(EIO, 7);
        assert_eq!(&s[..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(&s[4..8], &5u32.to_be_bytes());
        assert_eq!(info_export(1 << 20, TX_HAS_FLAGS).len(), 12);
        assert_eq!(error_for(libc::EDQUOT), ENOSPC);
        assert_eq!(error_for(libc::ENOENT), EIO);
        assert_eq!(&greeting()[..8], b"NBDMAGIC");
        assert_eq!(&greeting()[8..16], b"IHAVEOPT");
    }
}
