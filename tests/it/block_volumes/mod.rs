//! Block volumes through the real binary: `volume create|list|resize|delete` and their
//! refusals; volumes attached over NBD through the daemon and driven by real clients
//! (`nbdcopy`, `nbdinfo`, `qemu-io`, `qemu-img`, fio's nbd engine); a raw NBD client for what
//! those tools never send (`nbd_wire`).

use std::path::Path;
use std::time::Duration;

use crate::common::guards::Daemon;
use crate::common::mount::{start_daemon, Host};
use crate::common::noise;
use crate::common::process::{check, cmd, output};

mod kernel_nbd;
mod kernel_ublk;
mod nbd_wire;

/// `volume list --json`, by name.
/// The start of the kernel clients' VM scripts: the data disk mounted at /mnt/d with a data
/// dir on it; `start_daemon` (again after a kill: `$DAEMON` is its pid, its log
/// /tmp/daemon.log); `fill_tree`, 42 files on /mnt/fs (40 small, 24 MiB of random bytes,
/// busybox) with their sums kept in /tmp/sums; `sums`, the sums of what /mnt/fs holds now;
/// `fio_verify NAME DEV ARGS...`, a crc32c verify job in the background (`$FIO`, output in
/// /tmp/NAME.out) and `fio_passed NAME`; `across_kill DEV [JOB]`, a verify job (4k random
/// writes over 32 MiB unless JOB says otherwise) with the daemon killed -9 2 s in and started
/// again; `across_stop DEV BS`, a sequential one across a SIGTERM and a start.
const VM_SETUP: &str = r#"
mkdir -p /etc && ln -sf /proc/mounts /etc/mtab
mkdir -p /mnt/d /mnt/fs
mount /dev/vda /mnt/d
export TENANTFS_DATA_DIR=/mnt/d/data
tenantfs init >/dev/null
start_daemon() {
  rm -f $TENANTFS_DATA_DIR/tenantfs.sock
  TENANTFS_LOG=tenantfs=info tenantfs daemon 2>>/tmp/daemon.log &
  DAEMON=$!
  while [ ! -S $TENANTFS_DATA_DIR/tenantfs.sock ]; do sleep 0.1; done
  tenantfs stats >/dev/null
}
sums() { (cd /mnt/fs && find . -type f | sort | xargs sha256sum); }
fill_tree() {
  mkdir -p /mnt/fs/a/b /mnt/fs/c
  for i in $(seq 40); do dd if=/dev/urandom of=/mnt/fs/a/b/f$i bs=4k count=$i 2>/dev/null; done
  dd if=/dev/urandom of=/mnt/fs/c/big bs=1M count=24 2>/dev/null
  cp /bin/busybox /mnt/fs/c/
  sums > /tmp/sums
  echo "files: $(wc -l < /tmp/sums)"
}
fio_verify() {
  n=$1; d=$2; shift 2
  fio --name=$n --filename=$d --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 \
      --verify_state_save=0 --output=/tmp/$n.out "$@" &
  FIO=$!
}
fio_passed() { wait $FIO && grep -q "err= 0" /tmp/$1.out; }
across_kill() {
  d=$1; shift
  job="${*:---rw=randwrite --bs=4k --size=32M}"
  fio_verify verify $d $job --iodepth=16
  recovered=$(grep -c "recovered a block device.*$d" /tmp/daemon.log || true)
  sleep 2
  kill -0 $FIO && echo "fio running at the kill"
  kill -9 $DAEMON
  sleep 1
  start_daemon
  [ $(grep -c "recovered a block device.*$d" /tmp/daemon.log) -gt $recovered ] &&
    echo "daemon recovered the device"
  fio_passed verify && echo "fio passed across the kill"
}
across_stop() {
  fio_verify seq $1 --rw=write --bs=$2 --size=48M --iodepth=4
  sleep 2
  kill -0 $FIO && echo "fio running at the stop"
  kill $DAEMON
  while kill -0 $DAEMON 2>/dev/null; do sleep 0.1; done
  grep -q "kept for recovery" /tmp/daemon.log && echo "the stopping daemon kept the device"
  start_daemon
  fio_passed seq && echo "fio passed across the stop"
}
"#;

/// Runs `body` after [`VM_SETUP`] in the VM, with its data disk and `programs` besides
/// `tenantfs`: the script must succeed and its console show every one of `wants`; returns the
/// console.
fn in_vm(body: &str, programs: &[&str], wants: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let disk = crate::vm::ext4_image(dir.path(), 2 << 30);
    let programs: Vec<&str> = std::iter::once(crate::common::process::BIN)
        .chain(programs.iter().copied())
        .collect();
    let (ok, console) = crate::vm::run_in_vm(&(VM_SETUP.to_owned() + body), &programs, Some(&disk));
    assert!(ok, "{console}");
    for want in wants {
        assert!(console.contains(want), "no {want:?} in:\n{console}");
    }
    console
}

fn listed(h: &Host, name: &str) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&h.ok(&["volume", "list", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
}

fn daemon(h: &Host) -> Daemon {
    start_daemon(h, &h.root().join("notify"))
}

/// Attaches `volume` at `addr`; the reply's NBD URI.
fn attach(h: &Host, volume: &str, addr: &str) -> String {
    let out = h.ok(&["volume", "attach", volume, "--nbd", addr]);
    out.rsplit_once('[')
        .and_then(|(_, u)| u.trim().strip_suffix(']'))
        .unwrap_or_else(|| panic!("no URI in {out:?}"))
        .to_owned()
}

fn qemu_io(target: &str, commands: &[&str]) -> String {
    let mut c = cmd("qemu-io", &["-f", "raw"]);
    for command in commands {
        c.args(["-c", command]);
    }
    c.arg(target);
    let out = output(&mut c);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // qemu-io reports a failed command (a pattern that does not match, an I/O error, a bad
    // option) and still exits 0.
    assert!(
        out.status.success()
            && stderr.trim().is_empty()
            && !stdout.contains("failed")
            && !stdout.contains("Pattern verification"),
        "qemu-io {commands:?}: {stdout}\n{stderr}"
    );
    stdout.into_owned()
}

#[test]
fn volumes_are_created_listed_resized_and_deleted_and_bad_requests_say_what_to_do() {
    let h = Host::new("vol-cli");
    let out = h.ok(&["volume", "create", "v", "--size", "64M"]);
    assert!(out.contains("created volume v (64M"), "{out}");
    let v = listed(&h, "v").expect("v is listed");
    assert_eq!(v["device_size"], 64 << 20, "{v}");
    // A volume is a tenant (keys, store, delete), listed as one too.
    assert!(h.ok(&["tenant", "list"]).contains('v'));
    h.create_tenant("fs");
    assert!(
        listed(&h, "fs").is_none(),
        "a filesystem tenant is no volume"
    );

    let e = h.fails(&["volume", "create", "w"]);
    assert!(e.contains("needs a size"), "{e}");
    let e = h.fails(&["volume", "create", "w", "--size", "1000"]);
    assert!(e.contains("512-byte sectors"), "{e}");
    let e = h.fails(&["volume", "create", "v", "--size", "1M"]);
    assert!(e.contains("already exists"), "{e}");
    let e = h.fails(&["volume", "create", "w", "--size", "1M", "--base", "nope"]);
    assert!(e.contains("no base named nope"), "{e}");
    assert!(listed(&h, "w").is_none(), "a failed create leaves nothing");

    let e = h.fails(&["volume", "resize", "v", "32M"]);
    assert!(e.contains("--shrink"), "{e}");
    assert_eq!(listed(&h, "v").unwrap()["device_size"], 64 << 20);
    assert!(h
        .ok(&["volume", "resize", "v", "128M"])
        .contains("64M -> 128M"));
    assert!(h
        .ok(&["volume", "resize", "v", "32M", "--shrink"])
        .contains("128M -> 32M"));
    assert_eq!(listed(&h, "v").unwrap()["device_size"], 32 << 20);
    let e = h.fails(&["volume", "resize", "fs", "1G"]);
    assert!(e.contains("not a block volume"), "{e}");

    let e = h.fails(&["volume", "attach", "v", "--nbd", "unix:/tmp/x.sock"]);
    assert!(
        e.contains("no daemon answers") && e.contains("tenantfs daemon"),
        "{e}"
    );
    let e = h.fails(&["volume", "attach", "v", "--nbd", "0.0.0.0:10809"]);
    assert!(e.contains("not a loopback address"), "{e}");
    let e = h.fails(&["volume", "attach", "v", "--ublk"]);
    assert!(e.contains("no daemon answers"), "{e}");
    let e = h.fails(&["volume", "attach", "v"]);
    assert!(
        e.contains("--ublk") && e.contains("--nbd-device") && e.contains("--nbd unix:PATH"),
        "{e}"
    );
    let e = h.fails(&["volume", "attach", "v", "--ublk", "--nbd-device"]);
    assert!(e.contains("cannot be used with"), "{e}");

    let e = h.fails(&["volume", "delete", "fs"]);
    assert!(e.contains("not a block volume"), "{e}");
    let e = h.fails(&["volume", "delete", "nope"]);
    assert!(e.contains("unknown tenant nope"), "{e}");
    h.ok(&["volume", "delete", "v"]);
    assert!(listed(&h, "v").is_none());
}

#[test]
fn an_nbd_export_serves_nbdcopy_qemu_io_and_fio_and_keeps_its_data_across_attaches() {
    let h = Host::new("vol-nbd");
    h.ok(&["volume", "create", "v", "--size", "256M"]);
    h.ok(&["volume", "create", "t", "--size", "64M"]);
    let mut d = daemon(&h);
    let sock = h.root().join("v.sock");
    let uri = attach(&h, "v", &format!("unix:{}", sock.display()));
    assert_eq!(uri, format!("nbd+unix:///?socket={}", sock.display()));
    let e = h.fails(&["volume", "attach", "v", "--nbd", "127.0.0.1:0"]);
    assert!(e.contains("attached already"), "{e}");
    if !Path::new("/dev/ublk-control").exists() {
        // This host's kernel has no ublk (the VM tests serve it): a clear refusal.
        let e = h.fails(&["volume", "attach", "t", "--ublk"]);
        assert!(e.contains("no ublk driver") && e.contains("--nbd"), "{e}");
    }
    if !Path::new("/sys/module/nbd").exists() {
        // Nor nbd: the same for a kernel nbd device, and t is left detached.
        let e = h.fails(&["volume", "attach", "t", "--nbd-device"]);
        assert!(
            e.contains("no NBD driver") && e.contains("modprobe nbd"),
            "{e}"
        );
        assert!(listed(&h, "t").unwrap()["attached"].is_null());
    }
    let info: serde_json::Value =
        serde_json::from_str(&check(&mut cmd("nbdinfo", &["--json", &uri]))).unwrap();
    assert_eq!(info["exports"][0]["export-size"], 256u64 << 20, "{info}");
    assert_eq!(info["exports"][0]["can_flush"], true, "{info}");
    assert_eq!(info["exports"][0]["can_trim"], true, "{info}");
    assert_eq!(info["exports"][0]["can_multi_conn"], true, "{info}");

    // A random 256 MiB image, written and read back by nbdcopy (several connections).
    let img = h.root().join("img");
    let back = h.root().join("back");
    std::fs::write(&img, noise(7, 256 << 20)).unwrap();
    check(&mut cmd(
        "nbdcopy",
        &["--flush", img.to_str().unwrap(), &uri],
    ));
    check(&mut cmd("nbdcopy", &[&uri, back.to_str().unwrap()]));
    assert!(same_file(&img, &back), "256 MiB read back differs");

    // Small writes, FUA, discard (reads as zeros), write zeroes, past-the-end refusals.
    let q = format!("nbd:unix:{}", sock.display());
    qemu_io(
        &q,
        &[
            "write -P 0xab 4096 8192",
            "write -f -P 0xcd 1M 64k",
            "read -P 0xab 4096 8192",
            "read -P 0xcd 1M 64k",
            "discard 1M 64k",
            "read -P 0 1M 64k",
            "write -z 8M 1M",
            "read -P 0 8M 1M",
            "flush",
        ],
    );
    // fio through its nbd engine, verifying what it wrote.
    let fio = check(&mut cmd(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--offset=64M",
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_state_save=0",
            "--output-format=json",
        ],
    ));
    let fio: serde_json::Value = serde_json::from_str(&fio[fio.find('{').unwrap()..]).unwrap();
    assert_eq!(fio["jobs"][0]["error"], 0, "{fio}");

    // Per-volume activity in `stats`, and the volume in `volume list` with its address.
    let st: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
    let vol = &st["volumes"][0];
    assert_eq!(vol["volume"], "v", "{st}");
    assert!(
        vol["ops"]["write"]["calls"].as_u64().unwrap() >= 8192,
        "{st}"
    );
    assert!(vol["written_bytes"].as_u64().unwrap() >= 256 << 20, "{st}");
    assert!(
        vol["ops"]["discard"]["calls"].as_u64().unwrap() >= 2,
        "{st}"
    );
    assert!(h.ok(&["stats"]).contains("nbd unix:"), "stats table");
    assert_eq!(
        listed(&h, "v").unwrap()["attached"]["address"],
        format!("unix:{}", sock.display())
    );

    // A second volume over loopback TCP on a port the daemon picks.
    let tcp = attach(&h, "t", "127.0.0.1:0");
    assert!(
        tcp.starts_with("nbd://127.0.0.1:") && !tcp.contains(":0/"),
        "{tcp}"
    );
    let t_img = h.root().join("t.img");
    std::fs::write(&t_img, noise(9, 64 << 20)).unwrap();
    check(&mut cmd(
        "nbdcopy",
        &["--flush", t_img.to_str().unwrap(), &tcp],
    ));

    // Detach both (store synced and closed), attach again: the same bytes.
    assert!(h
        .ok(&["volume", "detach", "v"])
        .contains("detached volume v"));
    assert!(!sock.exists(), "the socket file is removed at detach");
    let e = h.fails(&["volume", "detach", "v"]);
    assert!(e.contains("not attached"), "{e}");
    h.ok(&["volume", "detach", "t"]);
    let uri = attach(&h, "v", &format!("unix:{}", sock.display()));
    check(&mut cmd("nbdcopy", &[&uri, back.to_str().unwrap()]));
    let mut want = std::fs::read(&img).unwrap();
    want[4096..4096 + 8192].fill(0xab);
    want[1 << 20..(1 << 20) + (64 << 10)].fill(0);
    want[8 << 20..9 << 20].fill(0);
    let got = std::fs::read(&back).unwrap();
    // fio's region holds its own verified pattern; compare the rest.
    let fio_at = 64usize << 20;
    assert!(
        got[..fio_at] == want[..fio_at]
            && got[fio_at + (32 << 20)..] == want[fio_at + (32 << 20)..],
        "the volume differs after detach and attach"
    );
    let tcp = attach(&h, "t", "127.0.0.1:0");
    let t_back = h.root().join("t.back");
    check(&mut cmd("nbdcopy", &[&tcp, t_back.to_str().unwrap()]));
    assert!(
        same_file(&t_img, &t_back),
        "volume t differs after detach and attach"
    );
    // SIGTERM detaches both and exits 0.
    d.terminate_cleanly(&[]);
    assert!(!sock.exists());
}

#[test]
fn qemu_img_converts_a_volume_from_an_imported_base_image_and_writes_are_copy_on_write() {
    let h = Host::new("vol-base");
    // A raw image: data, a hole, data; an odd size (rounded up to whole sectors).
    let img = h.root().join("disk.raw");
    let mut bytes = noise(3, 24 << 20);
    bytes[8 << 20..16 << 20].fill(0);
    bytes.truncate((24 << 20) - 100);
    std::fs::write(&img, &bytes).unwrap();
    h.ok(&["base", "import", "disk", img.to_str().unwrap()]);
    let out = h.ok(&["volume", "create", "a", "--base", "disk"]);
    assert!(out.contains("from base disk"), "{out}");
    assert_eq!(listed(&h, "a").unwrap()["device_size"], 24 << 20);
    let e = h.fails(&["volume", "create", "b", "--base", "disk", "--size", "8M"]);
    assert!(e.contains("at least that"), "{e}");
    h.ok(&["volume", "create", "b", "--base", "disk", "--size", "32M"]);
    let tree = h.dir("tree");
    std::fs::write(tree.join("f"), b"x").unwrap();
    h.ok(&["base", "import", "tree", tree.to_str().unwrap()]);
    let e = h.fails(&["volume", "create", "c", "--base", "tree"]);
    assert!(e.contains("not a raw disk image"), "{e}");

    let _d = daemon(&h);
    let (sa, sb) = (h.root().join("a.sock"), h.root().join("b.sock"));
    attach(&h, "a", &format!("unix:{}", sa.display()));
    attach(&h, "b", &format!("unix:{}", sb.display()));
    let qa = format!("nbd:unix:{}", sa.display());
    let qb = format!("nbd:unix:{}", sb.display());
    let out = h.root().join("a.raw");
    convert(&qa, &out);
    let mut want = bytes.clone();
    want.resize(24 << 20, 0);
    assert!(
        std::fs::read(&out).unwrap() == want,
        "qemu-img convert differs from the image"
    );
    // Writes to b are b's alone: a and the base are unchanged.
    qemu_io(
        &qb,
        &["write -P 0x11 0 4M", "write -P 0x22 30M 1M", "flush"],
    );
    qemu_io(
        &qb,
        &[
            "read -P 0x11 0 4M",
            "read -P 0x22 30M 1M",
            "read -P 0 24M 6M",
        ],
    );
    convert(&qa, &out);
    assert!(
        std::fs::read(&out).unwrap() == want,
        "a changed by b's writes"
    );
    // qemu-img writes an image into a volume (convert -n: into the existing target).
    let src = h.root().join("src.raw");
    std::fs::write(&src, noise(5, 16 << 20)).unwrap();
    check(&mut cmd(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &qb,
        ],
    ));
    let back = h.root().join("b.raw");
    convert(&qb, &back);
    let b = std::fs::read(&back).unwrap();
    assert!(
        b[..16 << 20] == std::fs::read(&src).unwrap()[..],
        "qemu-img's write differs"
    );
    assert!(
        b[16 << 20..24 << 20] == want[16 << 20..24 << 20],
        "the base under b's writes"
    );
}

#[test]
fn a_client_cut_off_mid_write_or_a_daemon_killed_loses_no_flushed_byte() {
    let h = Host::new("vol-cut");
    h.ok(&["volume", "create", "v", "--size", "512M"]);
    let sock = h.root().join("v.sock");
    let q = format!("nbd:unix:{}", sock.display());
    let mut d = daemon(&h);
    attach(&h, "v", &format!("unix:{}", sock.display()));
    qemu_io(
        &q,
        &["write -P 0x5a 0 64M", "write -P 0x6b 480M 4k", "flush"],
    );
    // A client killed in the middle of a 384 MiB write.
    let mut writer = writing(&q, "write -P 0x77 64M 384M");
    let _ = writer.kill();
    let _ = writer.wait();
    qemu_io(&q, &["read -P 0x5a 0 64M", "read -P 0x6b 480M 4k"]);
    // The daemon killed with unflushed writes in flight: after a restart, the flushed bytes.
    qemu_io(&q, &["write -P 0x3c 200M 1M", "flush"]);
    let mut writer = writing(&q, "write -P 0x44 256M 192M");
    let _ = d.0.kill();
    let _ = d.0.wait();
    let _ = writer.wait();
    let _d = daemon(&h);
    attach(&h, "v", &format!("unix:{}", sock.display()));
    qemu_io(
        &q,
        &[
            "read -P 0x5a 0 64M",
            "read -P 0x6b 480M 4k",
            "read -P 0x3c 200M 1M",
        ],
    );
}

/// `qemu-img convert` of raw `from` (a file or an NBD target) into a new raw file `to`.
fn convert(from: &str, to: &Path) {
    let to = to.to_str().unwrap();
    check(&mut cmd(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", from, to],
    ));
}

/// A qemu-io process 0.3 s into `write` (asserted still running).
fn writing(target: &str, write: &str) -> std::process::Child {
    let mut writer = cmd("qemu-io", &["-f", "raw", "-c", write, target])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the write ended before the kill"
    );
    writer
}

/// A block volume holding an ext4 filesystem, snapshotted while it is attached and served,
/// then overwritten, resized and restored: it holds the filesystem it held (fsck clean) at
/// its old size; forked while attached, the fork holds it too.
#[test]
fn an_attached_volume_is_snapshotted_while_served_and_restores_its_filesystem() {
    let h = Host::new("vol-snap");
    h.ok(&["volume", "create", "v", "--size", "64M"]);
    let mut d = daemon(&h);
    let sock = format!("unix:{}", h.root().join("v.sock").display());
    let uri = attach(&h, "v", &sock);
    let tree = h.dir("tree");
    for i in 0..20u64 {
        std::fs::write(tree.join(format!("f{i}")), noise(i, 100_000 * i as usize)).unwrap();
    }
    let img = h.root().join("fs.img");
    let (img_path, tree_path) = (img.to_str().unwrap(), tree.to_str().unwrap());
    check(&mut cmd(
        "mkfs.ext4",
        &["-q", "-F", "-d", tree_path, img_path, "64M"],
    ));
    check(&mut cmd("nbdcopy", &["--flush", img_path, &uri]));
    let out = h.ok(&["snapshot", "create", "v", "s1"]);
    assert!(
        out.contains("took snapshot s1 of tenant v while it is served"),
        "{out}"
    );
    // The volume goes on: its first 4 MiB (superblock, group descriptors) overwritten.
    qemu_io(&uri, &["write -P 0xaa 0 4M", "flush"]);
    let e = h.fails(&["tenant", "restore", "v", "--snapshot", "s1"]);
    assert!(e.contains("in use by process"), "{e}");
    h.ok(&["volume", "detach", "v"]);
    h.ok(&["volume", "resize", "v", "128M"]);
    h.ok(&["tenant", "restore", "v", "--snapshot", "s1"]);
    assert_eq!(listed(&h, "v").unwrap()["device_size"], 64 << 20);
    let uri = attach(&h, "v", &sock);
    let back = h.root().join("back.img");
    check(&mut cmd("nbdcopy", &[&uri, back.to_str().unwrap()]));
    assert!(
        same_file(&img, &back),
        "the restored volume differs from the filesystem"
    );
    check(&mut cmd("e2fsck", &["-fn", back.to_str().unwrap()]));
    // Forked while attached and written: the fork holds the filesystem, fsck clean, and
    // the volume's later writes are not in it.
    let out = h.ok(&["tenant", "fork", "v", "w"]);
    assert!(out.contains("into w while it is served"), "{out}");
    qemu_io(&uri, &["write -P 0x55 0 1M", "flush"]);
    assert_eq!(listed(&h, "w").unwrap()["device_size"], 64 << 20);
    let w_sock = format!("unix:{}", h.root().join("w.sock").display());
    let w_uri = attach(&h, "w", &w_sock);
    let fork = h.root().join("fork.img");
    check(&mut cmd("nbdcopy", &[&w_uri, fork.to_str().unwrap()]));
    assert!(
        same_file(&img, &fork),
        "the fork differs from the filesystem"
    );
    check(&mut cmd("e2fsck", &["-fn", fork.to_str().unwrap()]));
    h.ok(&["volume", "detach", "w"]);
    h.ok(&["volume", "detach", "v"]);
    d.terminate_cleanly(&[]);
}

fn same_file(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn configured_volumes_are_attached_when_the_daemon_starts_and_wait_when_they_cannot_be() {
    let h = Host::new("vol-cfg");
    let sock = h.root().join("v.sock");
    let h = h.with_config(&format!(
        "[[volume]]\nname = \"v\"\nnbd = \"unix:{}\"\n[[volume]]\nname = \"w\"\nublk = true\n\
         [[volume]]\nname = \"x\"\nnbd_device = true\n",
        sock.display()
    ));
    for v in ["v", "w", "x"] {
        h.ok(&["volume", "create", v, "--size", "64M"]);
    }
    let q = format!("nbd:unix:{}", sock.display());
    let mut d = daemon(&h);
    qemu_io(&q, &["write -P 0x21 0 1M", "flush"]);
    if !Path::new("/dev/ublk-control").exists() {
        // No ublk driver on this host: w waits, and says why.
        let table = h.ok(&["stats"]);
        assert!(
            table.contains("configured volume w (ublk) is not attached yet")
                && table.contains("no ublk driver"),
            "{table}"
        );
        let json: serde_json::Value = serde_json::from_str(&h.ok(&["stats", "--json"])).unwrap();
        assert_eq!(json["waiting_volumes"][0]["volume"], "w", "{json}");
        assert!(json["waiting_volumes"][0]["attempts"].as_u64().unwrap() >= 1);
    }
    if !Path::new("/sys/module/nbd").exists() {
        // Nor an nbd driver: x waits too.
        let table = h.ok(&["stats"]);
        assert!(
            table.contains("configured volume x (nbd device) is not attached yet")
                && table.contains("no NBD driver"),
            "{table}"
        );
    }
    // After a kill -9, the next daemon serves v at the same address without being asked.
    let _ = d.0.kill();
    let _ = d.0.wait();
    let _d = daemon(&h);
    qemu_io(&q, &["read -P 0x21 0 1M"]);
    let listed = listed(&h, "v").unwrap();
    assert_eq!(listed["attached"]["kind"], "nbd", "{listed}");
}
