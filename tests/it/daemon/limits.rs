//! A tenant's I/O limits (`-o iops=N,bandwidth=SIZE`): fio at QD1 in a limited tenant runs at
//! its limit while an unlimited tenant of the same daemon, beside it, runs unhindered; a limit
//! that is not a positive number is refused with a clear error.

use super::*;

/// fio's IOPS for `rw` 4k O_DIRECT at QD1 on a 64 MiB file under `dir`, `secs` seconds.
fn fio_iops(dir: &std::path::Path, rw: &str, secs: u32) -> f64 {
    let out = check(&mut cmd(
        "fio",
        &[
            "--name=limit",
            &format!("--filename={}", dir.join("f").display()),
            "--size=64M",
            "--bs=4k",
            &format!("--rw={rw}"),
            "--direct=1",
            "--ioengine=psync",
            "--time_based",
            &format!("--runtime={secs}"),
            "--output-format=json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let side = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    v["jobs"][0][side]["iops"].as_f64().unwrap()
}

#[test]
fn an_iops_limit_holds_while_an_unlimited_tenant_beside_it_runs_free() {
    let h = Host::new("limits");
    h.create_tenant("quiet");
    h.create_tenant("free");
    let d = start_daemon(&h, &h.root().join("notify"));
    let (mq, mf) = (h.dir("quiet"), h.dir("free"));
    h.ok(&["mount", "-o", "iops=1000", "quiet", mq.to_str().unwrap()]);
    let _gq = h.guard("quiet", &mq, d.0.id());
    h.ok(&["mount", "free", mf.to_str().unwrap()]);
    let _gf = h.guard("free", &mf, d.0.id());
    // Lay both files out first (the limited one at its limit too: 64 MiB in 1 MiB writes).
    for m in [&mq, &mf] {
        std::fs::write(m.join("f"), vec![7u8; 64 << 20]).unwrap();
    }
    let free = {
        let mf = mf.clone();
        std::thread::spawn(move || fio_iops(&mf, "randread", 6))
    };
    let limited = fio_iops(&mq, "randwrite", 6);
    let free = free.join().unwrap();
    eprintln!("limited to 1,000 IOPS: {limited:.0}; unlimited beside it: {free:.0}");
    assert!(
        (950.0..=1050.0).contains(&limited),
        "the tenant limited to 1,000 IOPS did {limited:.0}"
    );
    assert!(
        free > 5.0 * limited,
        "the unlimited tenant beside it did {free:.0} IOPS, not far above the limited one's \
         {limited:.0}"
    );
}

#[test]
fn a_limit_that_is_not_a_positive_number_is_refused() {
    let h = Host::new("badlimit");
    h.create_tenant("t");
    let mp = h.dir("m");
    for bad in ["iops=0", "iops=fast", "bandwidth=0", "bandwidth=-1M"] {
        let err = h.fails(&["mount", "-o", bad, "t", mp.to_str().unwrap()]);
        assert!(
            err.contains(bad) && err.contains("positive number"),
            "{bad}: {err}"
        );
        assert!(!tenantfs_mounted(&mp), "{bad} mounted anyway");
    }
}

/// `tenant set` changes a mounted tenant's limits at once, on the mount that serves it:
/// IOPS up, then a byte limit instead, then none; `stats` shows what is in force; bad values,
/// an unknown tenant, an unmounted one and nothing to change are clear errors.
#[test]
fn limits_change_live_on_a_mounted_tenant() {
    let h = Host::new("livelimits");
    h.create_tenant("t");
    h.create_tenant("idle");
    let d = start_daemon(&h, &h.root().join("notify"));
    let mp = h.dir("m");
    h.ok(&["mount", "-o", "iops=1000", "t", mp.to_str().unwrap()]);
    let _g = h.guard("t", &mp, d.0.id());
    std::fs::write(mp.join("f"), vec![7u8; 64 << 20]).unwrap();
    let in_force = || {
        let m = mount_stats(&h, "t");
        (m["iops_limit"].as_u64(), m["bandwidth_limit"].as_u64())
    };
    assert_eq!(in_force(), (Some(1000), None));
    let before = mount_stats(&h, "t");
    let at_1000 = fio_iops(&mp, "randwrite", 3);
    // 3 s of requests that mostly wait on the limit: the waits are throttled time, not busy.
    let after = mount_stats(&h, "t");
    let delta = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    assert!(delta("throttled_us") > 2_000_000, "{after}");
    assert!(delta("busy_us") < 1_000_000, "{after}");

    let out = h.ok(&["tenant", "set", "t", "--iops", "2000"]);
    assert!(out.contains("2000 IOPS, unlimited"), "{out}");
    assert_eq!(in_force(), (Some(2000), None));
    let at_2000 = fio_iops(&mp, "randwrite", 3);

    // 4 MiB a second of 4 KiB writes: 1,024 a second.
    let out = h.ok(&[
        "tenant",
        "set",
        "t",
        "--iops",
        "unlimited",
        "--bandwidth",
        "4M",
    ]);
    assert!(out.contains("unlimited IOPS, 4M/s"), "{out}");
    assert_eq!(in_force(), (None, Some(4 << 20)));
    let at_4m = fio_iops(&mp, "randwrite", 3);

    h.ok(&["tenant", "set", "t", "--bandwidth", "unlimited"]);
    assert_eq!(in_force(), (None, None));
    // A weight is not a limit: it shows, and changes nothing for a tenant alone.
    let out = h.ok(&["tenant", "set", "t", "--weight", "300"]);
    assert!(out.contains("weight 300"), "{out}");
    assert_eq!(mount_stats(&h, "t")["weight"], 300);
    let free = fio_iops(&mp, "randwrite", 3);
    eprintln!("iops=1000: {at_1000:.0}; 2000: {at_2000:.0}; 4M/s: {at_4m:.0}; none: {free:.0}");
    assert!(
        (950.0..=1050.0).contains(&at_1000),
        "iops=1000 did {at_1000:.0}"
    );
    assert!(
        (1900.0..=2100.0).contains(&at_2000),
        "iops=2000 did {at_2000:.0}"
    );
    assert!(
        (972.0..=1075.0).contains(&at_4m),
        "4 MiB/s of 4 KiB did {at_4m:.0}"
    );
    assert!(free > 2.5 * at_2000, "without limits {free:.0}");

    for (args, says) in [
        (&["tenant", "set", "t"][..], "say what to change"),
        (&["tenant", "set", "t", "--iops", "0"], "not an IOPS limit"),
        (&["tenant", "set", "t", "--iops", "-3"], "not an IOPS limit"),
        (
            &["tenant", "set", "t", "--bandwidth", "0"],
            "not a bandwidth limit",
        ),
        (
            &["tenant", "set", "nobody", "--iops", "5"],
            "unknown tenant nobody",
        ),
        (&["tenant", "set", "idle", "--iops", "5"], "is not mounted"),
        (&["tenant", "set", "t", "--weight", "0"], "not a weight"),
        (&["tenant", "set", "t", "--weight", "10001"], "not a weight"),
    ] {
        let err = h.fails(args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(
        in_force(),
        (None, None),
        "a refused change changed something"
    );
    assert_eq!(mount_stats(&h, "t")["weight"], 300);
    h.ok(&["tenant", "set", "t", "--weight", "default"]);
    assert!(mount_stats(&h, "t").get("weight").is_none());
}

/// A byte limit covers the tenant's background work: small files written within the limit
/// wait in the memtable; the idle flush writes them out on RocksDB's threads (counted in
/// `stats` as the tenant's background bytes), and the tenant's next reads wait, each for at
/// most a second, until the limit has given those bytes their time.
#[test]
fn background_work_is_charged_to_the_byte_limit() {
    let h = Host::new("bglimit");
    h.create_tenant("t");
    let d = start_daemon(&h, &h.root().join("notify"));
    let mp = h.dir("m");
    h.ok(&["mount", "-o", "bandwidth=1M", "t", mp.to_str().unwrap()]);
    let _g = h.guard("t", &mp, d.0.id());
    // 2 MiB in 1 KiB files of noise (which no compression shrinks): 2 s at the limit.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..2048 {
        let noise: Vec<u8> = (0..1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(mp.join(format!("f{i}")), noise).unwrap();
    }
    let counters = || {
        let m = mount_stats(&h, "t");
        let n = |k: &str| m[k].as_u64().unwrap();
        (n("background_bytes"), n("throttled_us"))
    };
    let before = counters().0;
    // The store flushes once idle for a few seconds.
    let start = Instant::now();
    let (mut flushed, mut throttled) = counters();
    while flushed < before + (2 << 20) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no flush of the 2 MiB written counted as background work: {flushed} bytes"
        );
        std::thread::sleep(Duration::from_millis(50));
        (flushed, throttled) = counters();
    }
    flushed -= before;
    // The flush's 2 MiB are 2 s at 1 MiB/s: the reads after it wait for them, a second at
    // most each, until they are paid.
    let mut waits = Vec::new();
    for i in 0..10 {
        // One READ request (the mount passes reads straight to the daemon).
        let f = std::fs::File::open(mp.join(format!("f{i}"))).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut [0u8; 1024], 0).unwrap();
        let now = counters().1;
        let wait = now - throttled;
        waits.push(wait);
        throttled = now;
        if wait < 100_000 {
            break;
        }
    }
    eprintln!("flushed {flushed} bytes; reads after it waited {waits:?} us");
    let waited: u64 = waits.iter().sum();
    assert!(
        waits[0] >= 900_000 && waited >= 1_500_000,
        "after {flushed} bytes of background work at 1 MiB/s the reads waited {waits:?} us"
    );
    assert!(
        waits.iter().all(|&w| w <= 1_300_000),
        "a read waited over a second on the debt: {waits:?} us"
    );
    assert!(
        *waits.last().unwrap() < 100_000,
        "still in debt after {} reads: {waits:?} us",
        waits.len()
    );
}
