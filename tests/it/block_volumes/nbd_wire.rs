//! The NBD server byte by byte, for what real clients never send: an unknown option, an
//! unknown export, a read past the end (a simple reply still carries the read's length, so
//! the stream stays in step), an unknown command, DISC.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use super::{attach, daemon};
use crate::common::mount::Host;

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;

fn option(s: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// One option reply: (option, type, data).
fn option_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(&h[..8], &0x0003_e889_0455_65a9u64.to_be_bytes());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).unwrap();
    (
        u32::from_be_bytes(h[8..12].try_into().unwrap()),
        u32::from_be_bytes(h[12..16].try_into().unwrap()),
        d,
    )
}

fn go_data(name: &[u8], infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name);
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

fn request(s: &mut UnixStream, flags: u16, kind: u16, cookie: u64, offset: u64, len: u32) {
    let mut m = 0x2560_9513u32.to_be_bytes().to_vec();
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&kind.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    s.write_all(&m).unwrap();
}

/// A simple reply: (error, cookie).
fn reply(s: &mut UnixStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(&h[..4], &0x6744_6698u32.to_be_bytes());
    (
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

fn data(s: &mut UnixStream, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    d
}

#[test]
fn the_nbd_server_answers_odd_options_and_requests_and_stays_in_step() {
    let h = Host::new("vol-wire");
    h.ok(&["volume", "create", "w", "--size", "1M"]);
    let _d = daemon(&h);
    let sock = h.root().join("w.sock");
    attach(&h, "w", &format!("unix:{}", sock.display()));
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let g = data(&mut s, 18);
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(
        u16::from_be_bytes([g[16], g[17]]),
        3,
        "fixed newstyle, no zeroes"
    );
    s.write_all(&3u32.to_be_bytes()).unwrap();

    option(&mut s, 3, &[]); // LIST
    let (opt, kind, d) = option_reply(&mut s);
    assert_eq!((opt, kind), (3, 2), "REP_SERVER");
    assert_eq!(&d[4..], b"w");
    assert_eq!(option_reply(&mut s).1, 1, "ACK");
    option(&mut s, 42, b"??");
    assert_eq!(option_reply(&mut s).1, 0x8000_0001, "ERR_UNSUP");
    option(&mut s, 5, &[]); // STARTTLS
    assert_eq!(option_reply(&mut s).1, 0x8000_0002, "ERR_POLICY");
    option(&mut s, 7, &go_data(b"nope", &[]));
    let (_, kind, msg) = option_reply(&mut s);
    assert_eq!(kind, 0x8000_0006, "ERR_UNKNOWN");
    assert!(String::from_utf8_lossy(&msg).contains("nope"));
    option(&mut s, 7, &[1, 2]); // GO, malformed
    assert_eq!(option_reply(&mut s).1, 0x8000_0003, "ERR_INVALID");
    option(&mut s, 7, &go_data(b"w", &[3]));
    let (_, kind, export) = option_reply(&mut s);
    assert_eq!(kind, 3, "REP_INFO");
    assert_eq!(&export[..2], &[0, 0], "NBD_INFO_EXPORT");
    assert_eq!(
        u64::from_be_bytes(export[2..10].try_into().unwrap()),
        1 << 20
    );
    let (_, kind, sizes) = option_reply(&mut s);
    assert_eq!(
        (kind, &sizes[..2]),
        (3, &[0u8, 3][..]),
        "NBD_INFO_BLOCK_SIZE"
    );
    assert_eq!(u32::from_be_bytes(sizes[6..10].try_into().unwrap()), 4096);
    assert_eq!(option_reply(&mut s).1, 1, "ACK: transmission");

    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    request(&mut s, 1, 1, 10, 8192, 4096); // WRITE, FUA
    s.write_all(&block).unwrap();
    assert_eq!(reply(&mut s), (0, 10));
    request(&mut s, 0, 0, 11, (1 << 20) - 2048, 4096); // READ past the end
    assert_eq!(reply(&mut s), (22, 11), "EINVAL");
    assert_eq!(
        data(&mut s, 4096),
        vec![0u8; 4096],
        "the read's length in zeros"
    );
    request(&mut s, 0, 99, 12, 0, 0);
    assert_eq!(reply(&mut s), (22, 12), "an unknown command: EINVAL");
    request(&mut s, 0, 0, 13, 8192, 4096);
    assert_eq!(reply(&mut s), (0, 13));
    assert_eq!(data(&mut s, 4096), block, "still in step");
    request(&mut s, 0, 4, 14, 8192, 4096); // TRIM
    assert_eq!(reply(&mut s), (0, 14));
    request(&mut s, 0, 3, 15, 0, 0); // FLUSH
    assert_eq!(reply(&mut s), (0, 15));
    request(&mut s, 0, 0, 16, 8192, 4096);
    assert_eq!(reply(&mut s), (0, 16));
    assert_eq!(
        data(&mut s, 4096),
        vec![0u8; 4096],
        "trimmed reads as zeros"
    );
    request(&mut s, 0, 2, 17, 0, 0); // DISC
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "nothing after DISC: {rest:?}");

    // EXPORT_NAME (the old way in) with a wrong name ends the connection.
    let mut s = UnixStream::connect(&sock).unwrap();
    data(&mut s, 18);
    s.write_all(&1u32.to_be_bytes()).unwrap();
    option(&mut s, 1, b"nope");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
}

/// Connects to the export `name` at `sock` and negotiates transmission (GO).
fn transmission(sock: &std::path::Path, name: &[u8]) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    data(&mut s, 18);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    option(&mut s, 7, &go_data(name, &[]));
    while option_reply(&mut s).1 != 1 {} // infos, then ACK
    s
}

/// The volume's line of `stats --json`.
fn volume_stats(h: &Host, name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    v["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["volume"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no volume {name} in {v}"))
}

/// `tenant set VOLUME --iops N` holds an attached volume's NBD requests to N a second, at
/// once, counted as throttled time; `--iops unlimited` lifts it; a weight is taken as a
/// mount's; `stats` shows them.
#[test]
fn an_attached_volume_takes_iops_limits_and_weights_live() {
    let h = Host::new("vol-limits");
    h.ok(&["volume", "create", "v", "--size", "16M"]);
    let _d = daemon(&h);
    let sock = h.root().join("v.sock");
    attach(&h, "v", &format!("unix:{}", sock.display()));
    let mut s = transmission(&sock, b"v");
    let reads = |s: &mut UnixStream, n: u64| {
        for i in 0..n {
            request(s, 0, 0, i, (i % 4096) * 4096, 4096);
            assert_eq!(reply(s), (0, i));
            data(s, 4096);
        }
    };
    reads(&mut s, 50);
    let throttled = |h: &Host| volume_stats(h, "v")["throttled_us"].as_u64().unwrap();
    assert_eq!(throttled(&h), 0, "throttled with no limit");

    let out = h.ok(&["tenant", "set", "v", "--iops", "100"]);
    assert!(out.contains(&sock.display().to_string()), "{out}");
    assert_eq!(volume_stats(&h, "v")["iops_limit"], 100);
    // 150 reads at 100 a second, a burst of 2: at least 1.4 s of waiting.
    reads(&mut s, 150);
    let waited = throttled(&h);
    assert!(
        waited >= 1_300_000,
        "{waited} us throttled for 150 reads at 100/s"
    );

    h.ok(&["tenant", "set", "v", "--iops", "unlimited"]);
    assert!(volume_stats(&h, "v")["iops_limit"].is_null());
    reads(&mut s, 300);
    let more = throttled(&h) - waited;
    assert!(
        more < 300_000,
        "{more} us throttled after the limit was lifted"
    );

    // A weight: its requests take turns in the daemon's fair queue, as a mount's do.
    h.ok(&["tenant", "set", "v", "--weight", "300"]);
    assert_eq!(volume_stats(&h, "v")["weight"], 300);
    reads(&mut s, 20);
    let err = h.fails(&["tenant", "set", "nosuch", "--iops", "5"]);
    assert!(err.contains("nosuch"), "{err}");
}
