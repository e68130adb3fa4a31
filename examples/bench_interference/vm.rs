//! The same harness under cgroup v2, in the VM harness (`tests/vm/vm.sh`: Debian's cloud
//! kernel under qemu's TCG; this host mounts cgroup v1): `bench_interference vm SECONDS
//! REPEATS [IO_MAX]` boots the VM with this program, `tenantfs`, fio and fincore, a sparse
//! ext4 image as its /var/tmp, and runs `bench_interference SECONDS REPEATS [IO_MAX]` there.
//! TCG emulates every instruction: the ratios between runs of the same VM are the result,
//! not the absolute numbers.

use super::*;

/// The VM's memory: the cgroup's limit, the daemon's cache and the initramfs (which holds
/// the programs) with room to spare.
const VM_MEM_MIB: u64 = 4096;
/// The image the VM mounts as /var/tmp: the working set, the tenant's data set and its store.
const DISK_GIB: u64 = 8;

pub(super) fn run(secs: u64, reps: usize, io_max: Option<&str>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::Builder::new()
        .prefix("tenantfs-interference-vm-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");
    let disk = tmp.path().join("disk.img");
    fs::File::create(&disk)
        .unwrap()
        .set_len(DISK_GIB << 30)
        .unwrap();
    run_ok(
        Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk),
        "mkfs.ext4",
    );
    let io_max = io_max.map_or(String::new(), |l| format!(" '{l}'"));
    let script = tmp.path().join("test.sh");
    fs::write(
        &script,
        format!(
            "mkdir -p /var/tmp && mount /dev/vda /var/tmp\n\
             export TENANTFS_BIN=/usr/local/bin/tenantfs\n\
             echo \"kernel $(uname -r), $(nproc) CPUs, $(grep MemTotal /proc/meminfo)\"\n\
             bench_interference {secs} {reps}{io_max}\n"
        ),
    )
    .unwrap();
    let which = |prog: &str| -> PathBuf {
        let out = run_ok(
            Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {prog}")),
            prog,
        );
        PathBuf::from(out.trim())
    };
    let me = std::env::current_exe().expect("current_exe");
    // The run boots once and takes minutes: its console streams to ours.
    let status = Command::new("bash")
        .arg(root.join("tests/vm/vm.sh"))
        .arg("run")
        .arg(&script)
        .arg(&me)
        .arg(tenantfs_bin())
        .arg(which("fio"))
        .arg(which("fincore"))
        .env("VM_DISK", &disk)
        .env("VM_MEM", VM_MEM_MIB.to_string())
        .env("VM_TIMEOUT", "7200")
        .status()
        .expect("run tests/vm/vm.sh");
    assert!(status.success(), "the run in the VM failed ({status})");
}
