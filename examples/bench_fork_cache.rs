//! Whether forks reading the same unchanged data share the host cache: a tenant writes data of
//! one kind, is forked N times, and each fork in turn opens, reads all of it and closes. The
//! host cache's usage after the first fork's read is one copy; after the last, if the forks
//! share, still about one (the target: <= 1.2x), if not, N copies (or the cache's capacity).
//! Each kind of stored data is read through its own cache path, so each is measured apart:
//! - extents: 1 MiB writes (the store's extent files, `store::extents`),
//! - blobs: 4 KiB writes (values in RocksDB's blob files, read through its blob cache),
//! - tables: 1,000-byte files (values inline in RocksDB's table files, its block cache).
//!
//! usage: make build && cargo run --release --example bench_fork_cache [-- FORKS [MIB]]
//! (default 100 forks of 256 MiB of each kind; tables: a quarter of it)

use std::time::Instant;

use tenantfs::volume::{FileKind, Owner, Volume, ROOT_INO};

#[derive(Clone, Copy)]
enum Kind {
    Extents,
    Blobs,
    Tables,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Extents => "extents (1 MiB writes)",
            Kind::Blobs => "blobs (4 KiB writes)",
            Kind::Tables => "tables (1,000-byte files)",
        }
    }
}

/// Writes `bytes` of `kind` into `vol`; the inodes and sizes to read back.
fn write(vol: &Volume, kind: Kind, bytes: u64) -> Vec<(u64, u32)> {
    let owner = Owner { uid: 0, gid: 0 };
    let file = |name: String| {
        vol.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, owner, 0)
            .unwrap()
            .ino
    };
    let fill = |n: usize, seed: u64| -> Vec<u8> {
        (0..n)
            .map(|i| ((i as u64 * 31 + seed * 17) % 251) as u8 | 1)
            .collect()
    };
    let mut files = Vec::new();
    match kind {
        Kind::Extents | Kind::Blobs => {
            let ino = file("data".into());
            let unit: u64 = match kind {
                Kind::Extents => 1 << 20,
                _ => 4096,
            };
            for n in 0..bytes / unit {
                vol.write(ino, n * unit, &fill(unit as usize, n)).unwrap();
            }
            // Read back in 1 MiB reads.
            for n in 0..bytes >> 20 {
                files.push((ino, n as u32));
            }
        }
        Kind::Tables => {
            for n in 0..bytes / 1000 {
                let ino = file(format!("small-{n}"));
                vol.write(ino, 0, &fill(1000, n)).unwrap();
                files.push((ino, u32::MAX));
            }
        }
    }
    vol.fsync().unwrap();
    files
}

/// Reads what `files` names through `vol`; the bytes read.
fn read(vol: &Volume, files: &[(u64, u32)]) -> u64 {
    let mut out = Vec::new();
    let mut bytes = 0;
    for &(ino, nth) in files {
        match nth {
            u32::MAX => vol.read_into(ino, 0, 4096, &mut out).unwrap(),
            mib => vol
                .read_into(ino, u64::from(mib) << 20, 1 << 20, &mut out)
                .unwrap(),
        }
        bytes += out.len() as u64;
    }
    bytes
}

fn run(kind: Kind, forks: usize, bytes: u64) {
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-fc-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().join("data");
    tenantfs::data_dir::DataDir::init(&root, None).unwrap();
    let data = tenantfs::data_dir::DataDir::open(&root, None).unwrap();
    // Room for 4 copies: forks that do not share fill it.
    let capacity = (4 * bytes as usize).max(256 << 20);
    let host = tenantfs::store::StoreHost::builder()
        .block_cache_bytes(capacity)
        .build();
    tenantfs::tenants::create(&data, &host, "src", None).unwrap();
    let files = {
        let vol = Volume::open(tenantfs::tenants::open(&data, &host, "src").unwrap()).unwrap();
        let files = write(&vol, kind, bytes);
        // Compacted and flushed: what a fork shares is in table, blob and extent files.
        vol.tenant().db().flush().unwrap();
        for n in 0..forks {
            tenantfs::forks::fork(&data, vol.tenant(), &format!("f{n}"), None).unwrap();
        }
        files
    };
    let cache = host.block_cache();
    // What the writes left in the cache is not what the forks read: start empty.
    cache.release(cache.usage());
    let empty = cache.usage();
    let mut first = 0;
    let started = Instant::now();
    let mut read_bytes = 0;
    for n in 0..forks {
        let vol =
            Volume::open(tenantfs::tenants::open(&data, &host, &format!("f{n}")).unwrap()).unwrap();
        read_bytes += read(&vol, &files);
        drop(vol);
        if n == 0 {
            first = cache.usage() - empty;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let all = cache.usage() - empty;
    let stats = cache.stats();
    println!(
        "| {} | {} | {} MiB | {} MiB | {} MiB | {:.2}x | {:.0} MiB/s | {} |",
        kind.name(),
        forks,
        (read_bytes / forks as u64) >> 20,
        first >> 20,
        all >> 20,
        all as f64 / first.max(1) as f64,
        read_bytes as f64 / secs / f64::from(1 << 20),
        stats.evictions,
    );
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let forks = args.first().copied().unwrap_or(100) as usize;
    let mib = args.get(1).copied().unwrap_or(256);
    println!("| data | forks | read per fork | cache after the first | after all | ratio | read speed | evictions |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    run(Kind::Extents, forks, mib << 20);
    run(Kind::Blobs, forks, mib << 20);
    run(Kind::Tables, forks, mib << 18);
}
