//! What a snapshot costs as a tenant grows: time of `snapshots::create` (a store checkpoint,
//! its record, the renames and syncs) of the open tenant and the bytes the snapshot holds of
//! its own (files not shared with the store: the MANIFEST, the WAL copy, CURRENT, the table
//! files of the flush it makes); then the time and own bytes of a copy of it
//! (`TenantDb::copy_checkpoint`: what a restore builds), and of a fork of the open tenant
//! (`forks::fork`: a checkpoint, the fork's record, and the source moved to a new key with a
//! new WAL and extent file), for a tenant of 20,000
//! small files that grows by bulk data to each size given. Before each snapshot the tenant
//! writes 100 small files more (a memtable with something in it, as a live tenant's has).
//! The target (snapshots and forks): <= 20 ms and <= 256 KiB, flat in the tenant's size.
//!
//! usage: make build && cargo run --release --example bench_checkpoint [-- SIZE_MIB...]
//! (default 100 1024 4096)

use std::os::unix::fs::MetadataExt;
use std::time::Instant;

mod common;
use common::own_and_all;

use tenantfs::volume::{FileKind, Owner, Volume, ROOT_INO};

fn main() {
    let sizes: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a size in MiB"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100, 1024, 4096]
    } else {
        sizes
    };
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-cp-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().join("data");
    tenantfs::data_dir::DataDir::init(&root, None).unwrap();
    let data = tenantfs::data_dir::DataDir::open(&root, None).unwrap();
    let host = tenantfs::store::StoreHost::builder()
        .block_cache_bytes(256 << 20)
        .build();
    tenantfs::tenants::create(&data, &host, "t", None).unwrap();
    let vol = Volume::open(tenantfs::tenants::open(&data, &host, "t").unwrap()).unwrap();
    let owner = Owner { uid: 0, gid: 0 };
    let mut small = 0u64;
    let mut more_small = |vol: &Volume, n: u64| {
        for _ in 0..n {
            let name = format!("small-{small}");
            let f = vol
                .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, owner, 0)
                .unwrap();
            vol.write(f.ino, 0, b"7 bytes").unwrap();
            small += 1;
        }
    };
    more_small(&vol, 20_000);
    let big = vol
        .mknod(ROOT_INO, b"big", FileKind::File, 0o644, owner, 0)
        .unwrap()
        .ino;
    let piece: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 | 1).collect();
    let mut written = 0u64;
    println!("| tenant's bulk data | snapshot ms | own bytes | all bytes (linked included) | files linked | copy ms | copy's own bytes | fork ms | fork's own bytes |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, &mib) in sizes.iter().enumerate() {
        while written < mib {
            vol.write(big, written << 20, &piece).unwrap();
            written += 1;
        }
        vol.fsync().unwrap();
        more_small(&vol, 100);
        let name = format!("s{i}");
        let started = Instant::now();
        tenantfs::snapshots::create(&root, vol.tenant(), &name).unwrap();
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let tenant_dir = root.join("tenants").join("t");
        let target = tenant_dir.join("snapshots").join(&name).join("db");
        let (own, all) = own_and_all(&target);
        let linked = std::fs::read_dir(&target)
            .unwrap()
            .chain(
                std::fs::read_dir(target.join("extents"))
                    .into_iter()
                    .flatten(),
            )
            .filter(|e| e.as_ref().unwrap().metadata().unwrap().nlink() > 1)
            .count();
        let copy = tenant_dir.join(format!("copy{i}"));
        let started = Instant::now();
        tenantfs::store::TenantDb::copy_checkpoint("t", &target, &copy).unwrap();
        let copy_ms = started.elapsed().as_secs_f64() * 1e3;
        let (copy_own, _) = own_and_all(&copy);
        more_small(&vol, 100);
        let fork = format!("f{i}");
        let forked = tenantfs::forks::fork(&data, vol.tenant(), &fork, None).unwrap();
        let fork_ms = forked.took.as_secs_f64() * 1e3;
        let (fork_own, _) = own_and_all(&root.join("tenants").join(&fork));
        tenantfs::tenants::delete(&data, &fork).unwrap();
        println!(
            "| {mib} MiB | {ms:.1} | {} KiB | {} MiB | {linked} | {copy_ms:.1} | {} KiB | {fork_ms:.1} | {} KiB |",
            own >> 10,
            all >> 20,
            copy_own >> 10,
            fork_own >> 10
        );
        std::fs::remove_dir_all(&copy).unwrap();
        tenantfs::snapshots::delete(&root, "t", &name).unwrap();
    }
}
