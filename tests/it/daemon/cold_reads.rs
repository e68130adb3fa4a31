//! Cold reads over the host's ring: the ring makes their disk reads (no thread waits on
//! them), they return what was written, and damage on the disk still fails them with EIO,
//! never with other bytes.

use super::*;
use std::os::unix::fs::FileExt;

const LEN: usize = 16 << 20;
const READS: u64 = 600;

/// The 4 KiB blocks read, at random (a first read at 0, then a stride through the file).
fn blocks() -> impl Iterator<Item = u64> {
    let n = (LEN / 4096) as u64;
    (0..READS).map(move |i| (i * 1_231 + 17) % n)
}

/// Tenant `a` mounted over the ring with `LEN` bytes of noise in file `f`, written in
/// 1 MiB pieces (so they go to extent files) and synced; the daemon's cache released.
fn written(name: &str) -> (Host, common::guards::Daemon, std::path::PathBuf, Vec<u8>) {
    enable_fuse_uring();
    let h = Host::new(name);
    h.create_tenant("a");
    let (d, _n) = start_daemon_env(&h, &h.root().join("notify"), &[]);
    let m = h.dir("a");
    h.ok(&["mount", "-o", "transport=uring", "a", m.to_str().unwrap()]);
    let data = common::noise(41, LEN);
    let f = std::fs::File::create(m.join("f")).unwrap();
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        f.write_all_at(piece, (i << 20) as u64).unwrap();
    }
    f.sync_all().unwrap();
    h.ok(&["cache", "release", "4G"]);
    (h, d, m, data)
}

#[test]
fn cold_reads_over_the_ring_return_what_was_written() {
    let (h, mut d, m, data) = written("coldring");
    let before = mount_stats(&h, "a")["ring_disk_reads"].as_u64().unwrap();
    let f = std::fs::File::open(m.join("f")).unwrap();
    let mut buf = vec![0u8; 4096];
    for b in blocks() {
        let at = b as usize * 4096;
        f.read_exact_at(&mut buf, at as u64).unwrap();
        assert!(buf == data[at..at + 4096], "block {b} read back wrong");
    }
    let st = mount_stats(&h, "a");
    let made = st["ring_disk_reads"].as_u64().unwrap() - before;
    eprintln!("{READS} cold reads: {made} disk reads made by the ring; {st}");
    assert!(
        made >= READS / 2,
        "only {made} of {READS} cold reads had their disk reads made by the ring"
    );
    let read = &st["ops"]["read"];
    assert_eq!(read["errors"].as_u64(), Some(0), "{st}");
    assert!(
        read["calls"].as_u64().unwrap() < READS + made / 2,
        "reads answered again are counted twice: {st}"
    );
    drop(f);
    d.terminate_cleanly(&[&m]);
}

#[test]
fn a_damaged_extent_read_by_the_ring_fails_with_eio_and_never_with_other_bytes() {
    let (h, mut d, m, data) = written("coldringdamage");
    let files: Vec<std::path::PathBuf> = common::files_under(h.root())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "ext"))
        .collect();
    assert!(
        !files.is_empty(),
        "no extent file under {}",
        h.root().display()
    );
    // A byte flipped every 64 KiB of each file's body (after its 4 KiB header).
    for p in &files {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        let len = file.metadata().unwrap().len();
        let mut at = 4096 + 1000;
        while at < len {
            let mut b = [0u8; 1];
            file.read_exact_at(&mut b, at).unwrap();
            file.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
            at += 64 << 10;
        }
        file.sync_all().unwrap();
    }
    h.ok(&["cache", "release", "4G"]);
    let before = mount_stats(&h, "a")["ring_disk_reads"].as_u64().unwrap();
    let f = std::fs::File::open(m.join("f")).unwrap();
    let mut buf = vec![0u8; 4096];
    let (mut failed, mut good) = (0, 0);
    for b in blocks() {
        let at = b as usize * 4096;
        match f.read_exact_at(&mut buf, at as u64) {
            Ok(()) => {
                assert!(
                    buf == data[at..at + 4096],
                    "block {b}: damaged bytes returned"
                );
                good += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "block {b}: {e}");
                failed += 1;
            }
        }
    }
    let made = mount_stats(&h, "a")["ring_disk_reads"].as_u64().unwrap() - before;
    eprintln!("after damage: {good} reads right, {failed} failed with EIO, {made} ring reads");
    assert!(made >= READS / 2, "only {made} disk reads made by the ring");
    assert!(failed > 0, "no read met the damage");
    assert!(good > 0, "undamaged blocks failed too");
    // The mount serves on.
    std::fs::write(m.join("g"), b"after").unwrap();
    assert_eq!(std::fs::read(m.join("g")).unwrap(), b"after");
    drop(f);
    d.terminate_cleanly(&[&m]);
}
