//! Many tenants from one base: the time of each `tenant create --base` (`BaseStore::
//! create_tenant`) and what the tenants take on disk of their own, for a base of 20,000 files
//! of 7 distinct bytes each (the case where per-tenant metadata is all there is), and what the
//! base's packs take for them. The first create also builds the base's template; the others
//! copy it. Targets: create p50 <= 5 ms; the tenants' own bytes together <= 64 MiB for 1,000
//! tenants (at most 64 KiB each); the packs <= 2x the files' bytes plus a fixed header.
//!
//! usage: make build && cargo run --release --example bench_base_tenants [-- TENANTS [FILES]]
//! (default 1000 tenants, 20000 files)

use std::time::Instant;

mod common;
use common::own_and_all;

use tenantfs::base::BaseStore;
use tenantfs::data_dir::DataDir;
use tenantfs::store::StoreHost;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let tenants = args.first().copied().unwrap_or(1000).max(2);
    let files = args.get(1).copied().unwrap_or(20_000);
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-bt-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().join("data");
    DataDir::init(&root, None).unwrap();
    let data = DataDir::open(&root, None).unwrap();
    let host = StoreHost::builder().block_cache_bytes(256 << 20).build();
    let tree = tmp.path().join("tree");
    for f in 0..files {
        let dir = tree.join(format!("d{:03}", f / 100));
        if f % 100 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        std::fs::write(dir.join(format!("f{:02}", f % 100)), format!("{f:06}\n")).unwrap();
    }
    let store = BaseStore::open(&data, &host).unwrap();
    let base = store.import("tree", &tree, 4096, &mut |_| {}).unwrap();
    let packs = store.list().unwrap().host.pack_bytes;
    let mut ms = Vec::with_capacity(tenants);
    for i in 0..tenants {
        let t = Instant::now();
        store
            .create_tenant(&data, &host, &format!("t{i:04}"), "tree")
            .unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let first = ms.remove(0);
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q) as usize];
    let (own, all) = own_and_all(&root.join("tenants"));
    // (No templates before tenants were copies of one.)
    let templates = root.join("base").join("templates");
    let template = match templates.exists() {
        true => own_and_all(&templates).1,
        false => 0,
    };
    println!("| tenants | base files | file bytes | packs | first create (template built) | create p50 | p90 | max | tenants' own bytes | per tenant | template | tenants, linked files included |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {tenants} | {files} | {} KiB | {} KiB | {first:.0} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} MiB | {} KiB | {} KiB | {:.1} MiB |",
        base.logical_bytes >> 10,
        packs >> 10,
        at(0.5),
        at(0.9),
        at(1.0),
        own as f64 / f64::from(1 << 20),
        (own / tenants as u64) >> 10,
        template >> 10,
        all as f64 / f64::from(1 << 20),
    );
}
