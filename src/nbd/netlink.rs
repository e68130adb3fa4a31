//! The kernel's NBD driver configured over generic netlink (family "nbd"), the interface
//! that, unlike the old ioctls, lets a device outlive the process that set it up and take a
//! new socket later (`NBD_CMD_RECONFIGURE`): what keeps /dev/nbdN's I/O alive across a
//! daemon restart. Only what the daemon uses: connect, reconfigure, disconnect.
//!
//! Messages are built by hand (a netlink header, a generic netlink header, then attributes:
//! a 4-byte header of length and type, the payload, padding to 4 bytes); the constants are
//! those of linux/netlink.h, linux/genetlink.h and linux/nbd-netlink.h.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    bind, recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLMSG_HEADER: usize = 16;
const GENL_HEADER: usize = 4;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const NBD_FAMILY: &str = "nbd";
const NBD_GENL_VERSION: u8 = 1;
const NBD_CMD_CONNECT: u8 = 1;
const NBD_CMD_DISCONNECT: u8 = 2;
const NBD_CMD_RECONFIGURE: u8 = 3;
const NBD_ATTR_INDEX: u16 = 1;
const NBD_ATTR_SIZE_BYTES: u16 = 2;
const NBD_ATTR_BLOCK_SIZE_BYTES: u16 = 3;
const NBD_ATTR_TIMEOUT: u16 = 4;
const NBD_ATTR_SERVER_FLAGS: u16 = 5;
const NBD_ATTR_SOCKETS: u16 = 7;
const NBD_ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
const NBD_ATTR_BACKEND_IDENTIFIER: u16 = 10;
const NBD_SOCK_ITEM: u16 = 1;
const NBD_SOCK_FD: u16 = 1;

/// What a new device is set up with.
pub(super) struct Connect<'a> {
    pub size: u64,
    pub block_size: u64,
    /// The export's transmission flags (what the handshake said).
    pub server_flags: u16,
    /// Seconds a request may take before the kernel gives its socket up and requeues it.
    pub timeout_secs: u64,
    /// Seconds the kernel holds I/O with no live socket, waiting for a reconfigure.
    pub dead_conn_timeout_secs: u64,
    /// Names the server; a reconfigure must name the same (checked by the kernel), and
    /// /sys/block/nbdN/backend shows it.
    pub backend: &'a str,
    /// Connected sockets, handshake done, in this process.
    pub sockets: &'a [RawFd],
}

/// An attribute list being built.
#[derive(Default)]
struct Attrs(Vec<u8>);

impl Attrs {
    fn put(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
        self
    }

    fn u32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.put(kind, &v.to_ne_bytes())
    }

    fn u64(&mut self, kind: u16, v: u64) -> &mut Self {
        self.put(kind, &v.to_ne_bytes())
    }

    fn string(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut z = s.as_bytes().to_vec();
        z.push(0);
        self.put(kind, &z)
    }

    fn sockets(&mut self, fds: &[RawFd]) -> &mut Self {
        let mut items = Attrs::default();
        for &fd in fds {
            let mut item = Attrs::default();
            item.u32(NBD_SOCK_FD, fd as u32);
            items.put(NBD_SOCK_ITEM | NLA_F_NESTED, &item.0);
        }
        self.put(NBD_ATTR_SOCKETS | NLA_F_NESTED, &items.0)
    }
}

/// The attributes in `payload`, as (type without flags, payload).
fn attributes(mut payload: &[u8]) -> Vec<(u16, &[u8])> {
    let mut found = Vec::new();
    while payload.len() >= 4 {
        let len = u16::from_ne_bytes([payload[0], payload[1]]) as usize;
        let kind = u16::from_ne_bytes([payload[2], payload[3]]) & !NLA_F_NESTED;
        if len < 4 || len > payload.len() {
            break;
        }
        found.push((kind, &payload[4..len]));
        payload = &payload[len.next_multiple_of(4).min(payload.len())..];
    }
    found
}

/// A generic netlink socket with the nbd family resolved.
pub(super) struct NbdNetlink {
    socket: OwnedFd,
    family: u16,
    seq: u32,
}

impl NbdNetlink {
    /// Opens a socket and looks the nbd family up (absent until the nbd module is loaded).
    pub fn open() -> io::Result<Self> {
        let socket = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkGeneric,
        )?;
        bind(socket.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        let mut nl = Self {
            socket,
            family: GENL_ID_CTRL,
            seq: 0,
        };
        let mut a = Attrs::default();
        a.string(CTRL_ATTR_FAMILY_NAME, NBD_FAMILY);
        let replies = nl
            .request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, &a)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOENT) {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "the kernel has no NBD driver loaded (`modprobe nbd`, CONFIG_BLK_DEV_NBD)",
                    )
                } else {
                    e
                }
            })?;
        nl.family = replies
            .iter()
            .flat_map(|r| attributes(r))
            .find(|(k, v)| *k == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
            .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
            .ok_or_else(|| io::Error::other("the kernel did not say the nbd family's id"))?;
        Ok(nl)
    }

    /// Sets up a free /dev/nbdN on `c.sockets`; returns N.
    pub fn connect(&mut self, c: &Connect<'_>) -> io::Result<u32> {
        let mut a = Attrs::default();
        a.u64(NBD_ATTR_SIZE_BYTES, c.size)
            .u64(NBD_ATTR_BLOCK_SIZE_BYTES, c.block_size)
            .u64(NBD_ATTR_TIMEOUT, c.timeout_secs)
            .u64(NBD_ATTR_DEAD_CONN_TIMEOUT, c.dead_conn_timeout_secs)
            .u64(NBD_ATTR_SERVER_FLAGS, c.server_flags.into())
            .string(NBD_ATTR_BACKEND_IDENTIFIER, c.backend)
            .sockets(c.sockets);
        let replies = self.request(self.family, NBD_CMD_CONNECT, &a)?;
        replies
            .iter()
            .flat_map(|r| attributes(r))
            .find(|(k, v)| *k == NBD_ATTR_INDEX && v.len() >= 4)
            .map(|(_, v)| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
            .ok_or_else(|| io::Error::other("the kernel did not say which nbd device it set up"))
    }

    /// Gives /dev/nbd`index` new sockets in place of dead ones (the kernel takes one per dead
    /// socket; the I/O it held goes on them).
    pub fn reconfigure(&mut self, index: u32, backend: &str, sockets: &[RawFd]) -> io::Result<()> {
        let mut a = Attrs::default();
        a.u32(NBD_ATTR_INDEX, index)
            .string(NBD_ATTR_BACKEND_IDENTIFIER, backend)
            .sockets(sockets);
        self.request(self.family, NBD_CMD_RECONFIGURE, &a).map(drop)
    }

    /// Disconnects /dev/nbd`index`: the kernel sends its sockets DISC and lets them go.
    pub fn disconnect(&mut self, index: u32) -> io::Result<()> {
        let mut a = Attrs::default();
        a.u32(NBD_ATTR_INDEX, index);
        self.request(self.family, NBD_CMD_DISCONNECT, &a).map(drop)
    }

    /// Sends one request and reads until its acknowledgement; returns the attribute payloads
    /// of the replies before it.
    fn request(&mut self, family: u16, cmd: u8, attrs: &Attrs) -> io::Result<Vec<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HEADER + GENL_HEADER + attrs.0.len();
        let mut m = Vec::with_capacity(len);
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&family.to_ne_bytes());
        m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        m.extend_from_slice(&self.seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        let version = if family == GENL_ID_CTRL {
            1
        } else {
            NBD_GENL_VERSION
        };
        m.extend_from_slice(&[cmd, version, 0, 0]);
        m.extend_from_slice(&attrs.0);
        sendto(
            self.socket.as_raw_fd(),
            &m,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )?;
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = recv(self.socket.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut rest = &buf[..n];
            while rest.len() >= NLMSG_HEADER {
                let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                let seq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
                if len < NLMSG_HEADER || len > rest.len() {
                    return Err(io::Error::other("a truncated netlink reply"));
                }
                let body = &rest[NLMSG_HEADER..len];
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
                if seq != self.seq {
                    continue;
                }
                if kind == NLMSG_ERROR {
                    let code = body
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap()));
                    return if code == 0 {
                        Ok(replies)
                    } else {
                        Err(io::Error::from_raw_os_error(-code))
                    };
                }
                if body.len() >= GENL_HEADER {
                    replies.push(body[GENL_HEADER..].to_vec());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_nested_and_read_back() {
        let mut a = Attrs::default();
        a.u32(NBD_ATTR_INDEX, 7)
            .string(NBD_ATTR_BACKEND_IDENTIFIER, "ab")
            .sockets(&[3, 4]);
        // 8 (index) + 8 ("ab\0" padded) + 4 + 2 * (4 + 8) (two socket items).
        assert_eq!(a.0.len(), 8 + 8 + 4 + 24);
        let top = attributes(&a.0);
        assert_eq!(top.len(), 3);
        assert_eq!(top[0], (NBD_ATTR_INDEX, &7u32.to_ne_bytes()[..]));
        assert_eq!(top[1], (NBD_ATTR_BACKEND_IDENTIFIER, &b"ab\0"[..]));
        assert_eq!(top[2].0, NBD_ATTR_SOCKETS);
        let items = attributes(top[2].1);
        let fds: Vec<u32> = items
            .iter()
            .map(|(k, item)| {
                assert_eq!(*k, NBD_SOCK_ITEM);
                let (kind, fd) = attributes(item)[0];
                assert_eq!(kind, NBD_SOCK_FD);
                u32::from_ne_bytes(fd.try_into().unwrap())
            })
            .collect();
        assert_eq!(fds, [3, 4]);
        // A truncated attribute ends the walk instead of reading past the end.
        assert_eq!(attributes(&a.0[..6]).len(), 0);
    }

    #[test]
    fn the_family_lookup_says_what_is_missing() {
        // This host's kernel has no nbd driver: the lookup fails with a message saying so
        // (where the module is loaded, it resolves).
        match NbdNetlink::open() {
            Ok(nl) => assert_ne!(nl.family, GENL_ID_CTRL),
            Err(e) => assert!(e.to_string().contains("modprobe nbd"), "{e}"),
        }
    }
}
