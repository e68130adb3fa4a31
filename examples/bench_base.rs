//! Base images: what importing costs, what creating a tenant from a base costs, and what 100
//! tenants from one base take on disk, each against its plain-copy counterpart in the same run:
//!   1. import throughput of a 512 MiB tree (128 x 4 MiB incompressible files) vs `cp -a` of
//!      the same tree on the same disk followed by `sync` (both read a page-cache-warm source);
//!   2. creating a tenant from a 20,000-file base (graft: no data copied) vs `cp -a` of that
//!      tree (what a per-tenant copy would cost at best);
//!   3. disk used by the base plus 100 tenants created from it vs one plain copy of the tree.
//!
//! usage: cargo run --release --example bench_base

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use tenantfs::base::BaseStore;
use tenantfs::data_dir::DataDir;
use tenantfs::store::StoreHost;

const MIB: u64 = 1 << 20;

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

fn du(path: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-s", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn run(cmd: &mut Command) {
    let st = cmd.status().unwrap();
    assert!(st.success(), "{cmd:?}: {st}");
}

/// Seconds of `cp -a src dst && sync`.
fn cp_secs(src: &Path, dst: &Path) -> f64 {
    let t = Instant::now();
    run(Command::new("cp").arg("-a").arg(src).arg(dst));
    run(&mut Command::new("sync"));
    t.elapsed().as_secs_f64()
}

fn main() {
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-base-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().join("data");
    DataDir::init(&root, None).unwrap();
    let data = DataDir::open(&root, None).unwrap();
    let host = StoreHost::builder().build();
    let store = BaseStore::open(&data, &host).unwrap();

    // 1. import throughput
    let big = tmp.path().join("big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..128 {
        std::fs::write(big.join(format!("f{i:03}")), noise(i, 4 * MIB as usize)).unwrap();
    }
    run(&mut Command::new("sync"));
    let bytes = 512 * MIB;
    let cp = cp_secs(&big, &tmp.path().join("big-copy"));
    let t = Instant::now();
    store.import("big", &big, 4096, &mut |_| {}).unwrap();
    let import = t.elapsed().as_secs_f64();
    let (imp_mbs, cp_mbs) = (bytes as f64 / import / 1e6, bytes as f64 / cp / 1e6);
    println!(
        "| import 512 MiB tree | {imp_mbs:.0} MB/s | cp -a + sync {cp_mbs:.0} MB/s | {:.2} |",
        imp_mbs / cp_mbs
    );
    // Importing the same tree again stores nothing new.
    let t = Instant::now();
    store.import("big2", &big, 4096, &mut |_| {}).unwrap();
    let again = t.elapsed().as_secs_f64();
    println!(
        "| re-import (all blocks known) | {:.0} MB/s | cp -a + sync {cp_mbs:.0} MB/s | {:.2} |",
        bytes as f64 / again / 1e6,
        bytes as f64 / again / 1e6 / cp_mbs
    );
    std::fs::remove_dir_all(tmp.path().join("big-copy")).unwrap();

    // 2. tenant from a 20,000-file base
    let small = tmp.path().join("tree");
    for d in 0..200 {
        let dir = small.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100u64 {
            let len = 512 + ((d * 100 + f) * 2654435761 % 8192) as usize;
            std::fs::write(dir.join(format!("f{f:02}")), noise(d * 1000 + f, len)).unwrap();
        }
    }
    run(&mut Command::new("sync"));
    store.import("tree", &small, 4096, &mut |_| {}).unwrap();
    let cp_tree = cp_secs(&small, &tmp.path().join("tree-copy"));
    let t = Instant::now();
    store.create_tenant(&data, &host, "t000", "tree").unwrap();
    let create = t.elapsed().as_secs_f64();
    println!(
        "| tenant from a 20,000-file base | {:.2} s | cp -a + sync of the tree {:.2} s | {:.2} |",
        create,
        cp_tree,
        create / cp_tree
    );

    // 3. disk used by 100 tenants from one base
    for i in 1..100 {
        store
            .create_tenant(&data, &host, &format!("t{i:03}"), "tree")
            .unwrap();
    }
    drop(store);
    let one_copy = du(&tmp.path().join("tree-copy"));
    let tenants = du(&root.join("tenants"));
    let list = BaseStore::open(&data, &host).unwrap().list().unwrap();
    let base_stored = list
        .bases
        .iter()
        .find(|b| b.name == "tree")
        .unwrap()
        .unique_bytes;
    let total = tenants + base_stored;
    println!(
        "| 100 tenants from one 20,000-file base | {} MiB (base {} MiB + tenants {} MiB) | one copy {} MiB; 100 copies {} MiB | {:.2} of one copy, {:.3} of 100 copies |",
        total >> 20,
        base_stored >> 20,
        tenants >> 20,
        one_copy >> 20,
        (100 * one_copy) >> 20,
        total as f64 / one_copy as f64,
        total as f64 / (100 * one_copy) as f64
    );
}
