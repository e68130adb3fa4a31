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
