//! Issue 5's acceptance through the daemon: 50 tenants from one base, mounted by one daemon,
//! each reading the same 256 MiB of base files through FUSE: the daemon's host cache holds that
//! data once (cache stats: about 256 MiB of base blocks, one miss per block) and the daemon's
//! RSS stays near that, not 50 times it. Every read is checked.

use crate::common;
use crate::common::mount::{start_daemon, Host};
use crate::common::trees::hash_file;

const MIB: u64 = 1 << 20;
const FILES: u64 = 32;
const FILE_BYTES: u64 = 8 * MIB;
const TENANTS: usize = 50;

#[test]
fn fifty_mounted_tenants_share_one_cached_copy_in_the_daemon() {
    let h = Host::new("base50").with_config("[cache]\nbudget = \"1G\"\n");
    let src = h.root().join("base-src");
    std::fs::create_dir_all(&src).unwrap();
    let mut hashes = Vec::new();
    for f in 0..FILES {
        let bytes = common::noise(f, FILE_BYTES as usize);
        hashes.push(blake3::hash(&bytes));
        std::fs::write(src.join(format!("f{f:02}")), bytes).unwrap();
    }
    h.ok(&["base", "import", "img", src.to_str().unwrap()]);
    for t in 0..TENANTS {
        h.ok(&["tenant", "create", &format!("t{t:02}"), "--base", "img"]);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let pid = d.0.id();
    let mut guards = Vec::new();
    for t in 0..TENANTS {
        let mp = h.dir(&format!("m{t:02}"));
        let out = h.ok(&["mount", &format!("t{t:02}"), mp.to_str().unwrap()]);
        assert!(out.contains("served by the daemon"), "{out}");
        guards.push((h.guard(&format!("t{t:02}"), &mp, pid), mp));
    }
    let stats = |h: &Host| -> serde_json::Value {
        let s: serde_json::Value =
            serde_json::from_str(&h.ok(&["cache", "stats", "--json"])).unwrap();
        s["processes"][0].clone()
    };
    let before = stats(&h);
    for (_, mp) in &guards {
        for (f, want) in hashes.iter().enumerate() {
            let got = hash_file(&mp.join(format!("f{f:02}")));
            assert_eq!(got, want.to_hex().to_string(), "{} f{f:02}", mp.display());
        }
    }
    let after = stats(&h);
    let data = FILES * FILE_BYTES;
    let blocks = &after["blocks"];
    assert_eq!(blocks["entries"].as_u64(), Some(data / 4096), "{after}");
    let used = blocks["used_bytes"].as_u64().unwrap();
    assert!(
        used >= data && used <= data + data / 10,
        "block cache {used}: {after}"
    );
    assert_eq!(
        blocks["misses"].as_u64().unwrap() - before["blocks"]["misses"].as_u64().unwrap(),
        data / 4096,
        "each block read from disk once: {after}"
    );
    let rss = after["process_rss_bytes"].as_u64().unwrap();
    assert!(
        rss < 4 * data,
        "daemon RSS {} MiB for {TENANTS} tenants reading the same {} MiB",
        rss >> 20,
        data >> 20
    );
    eprintln!(
        "{TENANTS} mounted tenants x {} MiB: block cache {} MiB, RocksDB cache {} MiB, daemon RSS {} MiB",
        data >> 20,
        used >> 20,
        after["rocksdb"]["usage_bytes"].as_u64().unwrap() >> 20,
        rss >> 20
    );
    drop(guards);
    drop(d);
}
