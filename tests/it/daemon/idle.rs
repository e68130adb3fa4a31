//! Idle tenants' memtables leave the cache budget: each store's memtables are charged to the
//! host cache through the shared WriteBufferManager (about 1 MiB per tenant once written,
//! whatever it holds), so the daemon flushes a store that has written nothing for a while.
//! Mounts that write nothing write nothing (their stores stay without a memtable).

use super::*;

/// The daemon's cache `used_bytes`.
fn cache_used(h: &Host) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&h.ok(&["cache", "stats", "--json"])).unwrap();
    let v = if v.is_array() { v[0].clone() } else { v };
    v["used_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no used_bytes in {v}"))
}

#[test]
fn idle_tenants_memtables_are_flushed_and_leave_the_cache() {
    const TENANTS: usize = 24;
    let h = Host::new("idleflush").with_config("[cache]\nbudget = \"256M\"\n");
    let names: Vec<String> = (0..TENANTS).map(|i| format!("t{i}")).collect();
    for n in &names {
        h.create_tenant(n);
    }
    let d = start_daemon(&h, &h.root().join("notify"));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mounts = mount_each(&h, &d, &names);
    let untouched = cache_used(&h);
    for m in &mounts {
        write_synced(&m.join("f"), &[7u8; 4096]);
    }
    let written = cache_used(&h);
    eprintln!(
        "cache used: {} KiB mounted, {} KiB once each wrote 4 KiB",
        untouched >> 10,
        written >> 10
    );
    assert!(
        written >= untouched + (TENANTS as u64) * (256 << 10),
        "the memtables of {TENANTS} written tenants are not charged as expected: {written} \
         bytes used, {untouched} before"
    );
    // A few seconds past the idle time, every memtable is flushed and its charge given back.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut used = written;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        used = cache_used(&h);
        if used < untouched + (4 << 20) {
            break;
        }
    }
    assert!(
        used < untouched + (4 << 20),
        "{TENANTS} idle tenants still charge {used} bytes to the cache ({untouched} before \
         they wrote)"
    );
    // What they wrote is all there.
    for m in &mounts {
        assert_eq!(std::fs::read(m.join("f")).unwrap(), vec![7u8; 4096]);
    }
}
