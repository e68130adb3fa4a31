//! One block volume served four ways in the same VM run (the VM harness: Debian's cloud
//! kernel under qemu's TCG, which has ublk and nbd; this host has neither): as /dev/ublkb0
//! (ublk), as /dev/nbd0 set up by `nbd-client` on the daemon's unix socket export (NBD), as
//! /dev/nbd0 set up by the daemon itself (`--nbd-device`: one connection, logged writes), and
//! as FUSE + loop (the volume mounted, its device file behind a loop device with direct I/O).
//! TCG emulates every instruction, so absolute numbers mean nothing: the ratios to FUSE+loop,
//! measured minutes apart on the same emulated machine (each way twice, in the order A B C D
//! D C B A, the mean of the two), are the result.
//!
//! Jobs (fio, libaio, O_DIRECT, SECONDS each over a 256 MiB region written once first, the
//! store then synced and left to settle):
//!   4k randread QD1 | 4k randwrite QD1 | 4k randread QD16 | 1M seq read QD4 | 1M seq write QD4
//!
//! usage: cargo build --release --bins --examples && cargo run --release --example
//! bench_vm_block [-- SECONDS]. Needs what `make test` installs (qemu, the VM kernel).

mod common;

use std::path::Path;
use std::process::Command;

const JOBS: [(&str, &str); 5] = [
    ("4k randread QD1", "--rw=randread --bs=4k --iodepth=1"),
    ("4k randwrite QD1", "--rw=randwrite --bs=4k --iodepth=1"),
    ("4k randread QD16", "--rw=randread --bs=4k --iodepth=16"),
    ("1M seq read QD4", "--rw=read --bs=1M --iodepth=4"),
    ("1M seq write QD4", "--rw=write --bs=1M --iodepth=4"),
];
/// Each way's name in the VM's output and its column heading.
const WAYS: [(&str, &str); 4] = [
    ("ublk", "ublk"),
    ("nbd", "NBD"),
    ("nbddev", "nbd device"),
    ("loop", "FUSE+loop"),
];

/// The VM's script: each way's device, the layout write, then every job, fio's JSON printed
/// between markers.
fn script(seconds: u32) -> String {
    let mut jobs = String::new();
    for (i, (_, args)) in JOBS.iter().enumerate() {
        jobs += &format!(
            "  fio --name=j{i} --filename=$1 --size=256M --ioengine=libaio --direct=1 \
             --runtime={seconds} --time_based --output-format=json {args} > /tmp/out.json\n  \
             echo \"FIO-JSON $2 {i}\"; tr -d '\\n' < /tmp/out.json; echo\n"
        );
    }
    format!(
        r#"
mkdir -p /etc /mnt/d /mnt/v && ln -sf /proc/mounts /etc/mtab
mount /dev/vda /mnt/d
export TENANTFS_DATA_DIR=/mnt/d/data
tenantfs init >/dev/null
tenantfs volume create v --size 512M >/dev/null
tenantfs daemon 2>/tmp/daemon.log &
while [ ! -S $TENANTFS_DATA_DIR/tenantfs.sock ]; do sleep 0.1; done
suite() {{
{jobs}}}
# The region is written once (through ublk), the store synced and left to settle: every way
# then reads and writes the same settled data.
tenantfs volume attach v --ublk
fio --name=layout --filename=/dev/ublkb0 --size=256M --ioengine=libaio --direct=1 --rw=write \
    --bs=1M --iodepth=4 --output=/dev/null
tenantfs volume detach v
sleep 5
ublk() {{
  tenantfs volume attach v --ublk
  suite /dev/ublkb0 ublk
  tenantfs volume detach v
}}
nbd() {{
  tenantfs volume attach v --nbd unix:/tmp/v.sock
  nbd-client -u /tmp/v.sock /dev/nbd0 -b 4096 -C 2
  suite /dev/nbd0 nbd
  nbd-client -d /dev/nbd0
  tenantfs volume detach v
}}
nbd_device() {{
  tenantfs volume attach v --nbd-device
  suite /dev/nbd0 nbddev
  tenantfs volume detach v
}}
fuse_loop() {{
  tenantfs mount v /mnt/v
  dev=$(/usr/local/bin/losetup -f --show --direct-io=on /mnt/v/device)
  suite $dev loop
  /usr/local/bin/losetup -d $dev
  tenantfs umount /mnt/v
}}
# Each way twice, in the order A B C D D C B A: what runs earlier or later (a warmer host
# page cache under the VM's disk, the store's background work) favours no way.
ublk; nbd; nbd_device; fuse_loop; fuse_loop; nbd_device; nbd; ublk
"#
    )
}

#[derive(Clone, Copy, Default)]
struct Measured {
    iops: f64,
    p50_us: f64,
    runs: u32,
}

impl Measured {
    /// Adds one run's numbers (the table shows the mean of the runs).
    fn add(&mut self, run: Measured) {
        self.iops += run.iops;
        self.p50_us += run.p50_us;
        self.runs += 1;
    }

    fn mean(&self) -> Measured {
        let n = f64::from(self.runs.max(1));
        Measured {
            iops: self.iops / n,
            p50_us: self.p50_us / n,
            runs: self.runs,
        }
    }
}

/// The job's numbers from fio's JSON (its write side if it wrote).
fn measured(json: &str) -> Measured {
    let v: serde_json::Value = serde_json::from_str(json).expect("fio JSON");
    let job = &v["jobs"][0];
    let side = if job["write"]["io_bytes"].as_u64().unwrap_or(0) > 0 {
        &job["write"]
    } else {
        &job["read"]
    };
    Measured {
        iops: side["iops"].as_f64().unwrap_or(0.0),
        p50_us: side["clat_ns"]["percentile"]["50.000000"]
            .as_f64()
            .unwrap_or(0.0)
            / 1e3,
        runs: 1,
    }
}

fn main() {
    let seconds: u32 = std::env::args()
        .nth(1)
        .map_or(10, |s| s.parse().expect("SECONDS is a number"));
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-bench-vm-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let disk = tmp.path().join("data.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    common::daemon::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk));
    let script_path = tmp.path().join("bench.sh");
    std::fs::write(&script_path, script(seconds)).unwrap();
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/vm.sh");
    let bin = common::tenantfs_bin();
    let out = Command::new("bash")
        .arg(harness)
        .arg("run")
        .arg(&script_path)
        .arg(&bin)
        .args(["/usr/bin/fio", "/usr/sbin/nbd-client", "/sbin/losetup"])
        .env("VM_DISK", &disk)
        .env("VM_MEM", "2048")
        .env("VM_TIMEOUT", "3600")
        .output()
        .expect("run tests/vm/vm.sh");
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the VM run failed:\n{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut results = [[Measured::default(); JOBS.len()]; WAYS.len()];
    for line in console.lines() {
        let Some(rest) = line.trim_end_matches('\r').strip_prefix("FIO-JSON ") else {
            continue;
        };
        let mut words = rest.splitn(3, ' ');
        let (way, job) = (words.next().unwrap(), words.next().unwrap());
        let next = console.lines().skip_while(|l| *l != line).nth(1).unwrap();
        let w = WAYS.iter().position(|x| x.0 == way).expect("a known way");
        results[w][job.parse::<usize>().unwrap()].add(measured(next.trim_end_matches('\r')));
    }
    println!(
        "one 512 MiB volume in the VM (qemu TCG, 2 vCPUs), 256 MiB region, {seconds} s per job, \
         fio libaio O_DIRECT; ublk: /dev/ublkb0; NBD: /dev/nbd0 by nbd-client on the daemon's \
         unix socket (2 connections); nbd device: /dev/nbd0 set up by the daemon \
         (--nbd-device); FUSE+loop: loop (direct I/O) over the volume's device file in its \
         FUSE mount; each way run twice (order A B C D D C B A), the mean shown; ratios are \
         IOPS over FUSE+loop's"
    );
    let (heads, loop_way) = (WAYS.map(|w| w.1), WAYS.len() - 1);
    let others = &heads[..loop_way];
    println!(
        "| job | {} | {} |",
        heads.join(" | "),
        others
            .iter()
            .map(|h| format!("{h} / loop"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---:|".repeat(heads.len() + others.len()));
    let cell = |m: &Measured| format!("{:.0} IOPS, p50 {:.0} us", m.iops, m.p50_us);
    for (j, (name, _)) in JOBS.iter().enumerate() {
        let means: Vec<Measured> = results.iter().map(|r| r[j].mean()).collect();
        assert!(means.iter().all(|m| m.runs == 2), "a run is missing");
        let cells: Vec<String> = means.iter().map(cell).collect();
        let ratios: Vec<String> = means[..loop_way]
            .iter()
            .map(|m| format!("{:.2}", m.iops / means[loop_way].iops))
            .collect();
        println!(
            "| {name} | {} | {} |",
            cells.join(" | "),
            ratios.join(" | ")
        );
    }
}
