//! Property test through a real mount: random sequences of file operations applied with std::fs
//! to a tenantfs mount and to a local directory on the host filesystem (the reference), compared
//! after every step: results and errnos, then sizes, contents and listings of the whole tree.
//! Run twice: with requests over FUSE's io_uring, and over /dev/fuse.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::common::guards::{enable_fuse_uring, Mount};
use crate::common::mount::Host;
use crate::generators::{length, offset};

/// One mount for the whole test; each case works in fresh subdirectories. Unmounts on drop
/// (before the host's temp dir goes: fields drop in order).
struct Fixture {
    mount: Mount,
    local: PathBuf,
    _host: Host,
}

impl Fixture {
    /// A mount served over `transport` (uring or dev).
    fn new(transport: &str) -> Self {
        let host = Host::new("model");
        host.create_tenant("model");
        let (mnt, local) = (host.dir("mnt"), host.dir("local"));
        let mount = host.mount("model", &mnt, &format!("transport={transport}"));
        Fixture {
            mount,
            local,
            _host: host,
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        file: u8,
        offset: u64,
        len: u64,
        byte: u8,
    },
    Read {
        file: u8,
        offset: u64,
        len: u64,
    },
    Truncate {
        file: u8,
        size: u64,
    },
    Mkdir {
        dir: u8,
    },
    Unlink {
        file: u8,
    },
    Rmdir {
        dir: u8,
    },
    Rename {
        from: u8,
        to: u8,
    },
    Link {
        from: u8,
        to: u8,
    },
    Symlink {
        file: u8,
        target: u8,
    },
    Chmod {
        file: u8,
        mode: u16,
    },
    AppendSync {
        file: u8,
        len: u16,
    },
}

/// Paths a case works with: a few names at top level and inside two subdirectories, so that
/// renames cross directories and rmdir meets non-empty directories.
fn name(i: u8) -> String {
    match i % 9 {
        0..=2 => format!("f{}", i % 3),
        3 | 4 => format!("d{}", i % 2),
        5 | 6 => format!("d0/g{}", i % 2),
        _ => format!("d1/h{}", i % 2),
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), offset(), length(), any::<u8>())
            .prop_map(|(file, offset, len, byte)| Op::Write { file, offset, len, byte }),
        2 => (any::<u8>(), offset(), length())
            .prop_map(|(file, offset, len)| Op::Read { file, offset, len }),
        1 => (any::<u8>(), offset()).prop_map(|(file, size)| Op::Truncate { file, size }),
        2 => any::<u8>().prop_map(|dir| Op::Mkdir { dir }),
        1 => any::<u8>().prop_map(|file| Op::Unlink { file }),
        1 => any::<u8>().prop_map(|dir| Op::Rmdir { dir }),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(from, to)| Op::Link { from, to }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(file, target)| Op::Symlink { file, target }),
        1 => (any::<u8>(), 0u16..0o1000).prop_map(|(file, mode)| Op::Chmod { file, mode }),
        1 => (any::<u8>(), 1u16..5000).prop_map(|(file, len)| Op::AppendSync { file, len }),
    ]
}

/// What an operation returned: data or the errno.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok(Vec<u8>),
    Err(i32),
}

fn outcome<T>(r: std::io::Result<T>, f: impl FnOnce(T) -> Vec<u8>) -> Outcome {
    match r {
        Ok(v) => Outcome::Ok(f(v)),
        Err(e) => Outcome::Err(e.raw_os_error().unwrap_or(-1)),
    }
}

fn apply(root: &Path, op: &Op) -> Outcome {
    let p = |i: u8| root.join(name(i));
    match *op {
        Op::Write {
            file,
            offset,
            len,
            byte,
        } => outcome(
            (|| {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(p(file))?;
                f.seek(SeekFrom::Start(offset))?;
                f.write_all(&vec![byte; len as usize])
            })(),
            |_| vec![],
        ),
        Op::Read { file, offset, len } => outcome(
            (|| {
                let mut f = fs::File::open(p(file))?;
                f.seek(SeekFrom::Start(offset))?;
                let mut buf = Vec::new();
                f.take(len).read_to_end(&mut buf)?;
                Ok(buf)
            })(),
            |b| b,
        ),
        Op::Truncate { file, size } => outcome(
            OpenOptions::new()
                .write(true)
                .open(p(file))
                .and_then(|f| f.set_len(size)),
            |_| vec![],
        ),
        Op::Mkdir { dir } => outcome(fs::create_dir(p(dir)), |_| vec![]),
        Op::Unlink { file } => outcome(fs::remove_file(p(file)), |_| vec![]),
        Op::Rmdir { dir } => outcome(fs::remove_dir(p(dir)), |_| vec![]),
        Op::Rename { from, to } => outcome(fs::rename(p(from), p(to)), |_| vec![]),
        Op::Link { from, to } => outcome(fs::hard_link(p(from), p(to)), |_| vec![]),
        Op::Symlink { file, target } => outcome(
            std::os::unix::fs::symlink(name(target), p(file)),
            |_| vec![],
        ),
        Op::Chmod { file, mode } => outcome(
            fs::symlink_metadata(p(file)).and_then(|m| {
                if m.file_type().is_symlink() {
                    Ok(())
                } else {
                    fs::set_permissions(p(file), fs::Permissions::from_mode(mode.into()))
                }
            }),
            |_| vec![],
        ),
        Op::AppendSync { file, len } => outcome(
            (|| {
                let mut f = OpenOptions::new().append(true).create(true).open(p(file))?;
                f.write_all(&vec![0x5a; len.into()])?;
                f.sync_all()
            })(),
            |_| vec![],
        ),
    }
}

/// Path -> (kind, mode, nlink, size, content or link target) of a whole tree.
fn tree(root: &Path) -> BTreeMap<String, (char, u32, u64, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let m = fs::symlink_metadata(&path).unwrap();
            let (kind, content) = if m.file_type().is_symlink() {
                (
                    'l',
                    fs::read_link(&path)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else if m.is_dir() {
                stack.push(path.clone());
                ('d', vec![])
            } else {
                ('f', fs::read(&path).unwrap())
            };
            let size = if kind == 'd' { 0 } else { m.len() };
            let nlink = if kind == 'd' { 0 } else { m.nlink() };
            out.insert(rel, (kind, m.mode() & 0o7777, nlink, size, content));
        }
    }
    out
}

#[test]
fn mount_over_io_uring_behaves_like_a_local_directory() {
    enable_fuse_uring();
    let fx = Fixture::new("uring");
    model(&fx);
    // The requests went over the ring: its queue threads (one per CPU, in the process serving
    // this data dir) woke up for them, thousands of times.
    let wakeups = ring_thread_wakeups(fx.mount.pid);
    assert!(wakeups > 1000, "ring queue threads woke {wakeups} times");
}

/// Voluntary context switches of the `fuse-ring-*` threads of process `pid`.
fn ring_thread_wakeups(pid: u32) -> u64 {
    let mut total = 0;
    let mut threads = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuse-ring-") {
            continue;
        }
        threads += 1;
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
    }
    assert!(threads > 0, "no fuse-ring threads in process {pid}");
    total
}

#[test]
fn mount_over_dev_fuse_behaves_like_a_local_directory() {
    model(&Fixture::new("dev"));
}

fn model(fx: &Fixture) {
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..50), |ops| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        let a = fx.mount.path.join(format!("case{n}"));
        let b = fx.local.join(format!("case{n}"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        for (i, op) in ops.iter().enumerate() {
            let got = apply(&a, op);
            let want = apply(&b, op);
            prop_assert_eq!(&got, &want, "step {} {:?}", i, op);
            prop_assert_eq!(tree(&a), tree(&b), "tree after step {} {:?}", i, op);
        }
        fs::remove_dir_all(&a).unwrap();
        fs::remove_dir_all(&b).unwrap();
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
