//! One FUSE request -> one call of [`Operations`] -> the reply's bytes, for both transports.
//! The request's fixed struct comes apart from its names and data (the ring's entry header
//! holds it in its op area; over /dev/fuse it is split off by its size); the reply goes into
//! the payload buffer once the request's arguments have been used.

use std::time::Instant;

use fuser::Errno;

use super::caller::RequestCaller;
use super::wire::{self as abi, fattr, opcode, Fields, InHeader, Out};
use crate::fuse::ops::{system_time, Operations, Xattr, TTL};
use crate::volume::{Clearing, Owner, SetAttr, CAPABILITY_XATTR};

/// Answers one request as [`answer`] does, as the out-header's error (0 or a negative errno)
/// and the reply's payload length, and counts it and its time in the mount's metrics. A panic
/// while answering fails that request with EIO: the thread that serves it must keep serving,
/// or its requests would wait forever.
pub fn answer_or_eio(
    ops: &Operations,
    h: &InHeader,
    op_in: &[u8],
    payload: &mut [u8],
    in_len: usize,
    scratch: &mut Vec<u8>,
) -> (i32, usize) {
    // A request answered again (its disk reads made by the ring) counts from its first answer.
    let start = crate::serving::answering_since().unwrap_or_else(Instant::now);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        answer(ops, h, op_in, payload, in_len, scratch)
    }));
    if !crate::serving::deferred_any() {
        // (One that handed its disk reads over is counted when it is answered again.)
        ops.metrics.record_request(start);
    }
    // A buffer grown by an unusually large read is not kept.
    if scratch.capacity() > 2 * super::ops::MAX_WRITE as usize {
        *scratch = Vec::new();
    }
    match r {
        Ok(Ok(len)) => (0, len),
        Ok(Err(errno)) => (-errno.code(), 0),
        Err(_) => {
            tracing::error!(
                opcode = h.opcode,
                "a FUSE request panicked; it fails with EIO, the mount keeps serving"
            );
            (-libc::EIO, 0)
        }
    }
}

/// A write (or copy) this large keeps its thread on the CPU for long (a MiB is encrypted and
/// hashed in about a millisecond here): over the host's ring its thread gives up its lead
/// first, as a request that waits does, so the other tenants' requests on that CPU are not
/// answered only after it (BENCHMARKS.md, "A quiet tenant beside a loud one"). Not reads: a
/// cached MiB is a copy, without encryption; a quiet tenant beside a stream of 1 MiB reads did
/// no better when reads gave up the lead (BENCHMARKS.md, "A stream beside a cached set").
pub const LONG_REQUEST_BYTES: u64 = 256 << 10;

/// Whether request `h` is a write or copy of at least [`LONG_REQUEST_BYTES`] (`bytes`, what
/// [`limited_bytes`] gave).
pub fn is_long(h: &InHeader, bytes: u64) -> bool {
    matches!(h.opcode, opcode::WRITE | opcode::COPY_FILE_RANGE) && bytes >= LONG_REQUEST_BYTES
}

/// The bytes a data request counts against its tenant's I/O limits (what its operation
/// admits: `Operations::read`, `write`, `copy_range`); `None` for other requests.
pub fn limited_bytes(h: &InHeader, op_in: &[u8]) -> Option<u64> {
    let f = Fields(op_in);
    match h.opcode {
        opcode::READ | opcode::WRITE => f.u32(16).map(u64::from),
        opcode::COPY_FILE_RANGE => f.u64(40).map(|len| len.min(super::ops::COPY_MAX)),
        _ => None,
    }
}

/// Answers one request: the reply's payload length, or the errno to send instead.
/// `payload` holds `in_len` bytes of request and receives the reply; `scratch` is a reused
/// read buffer.
pub fn answer(
    ops: &Operations,
    h: &InHeader,
    op_in: &[u8],
    payload: &mut [u8],
    in_len: usize,
    scratch: &mut Vec<u8>,
) -> Result<usize, Errno> {
    let f = Fields(op_in);
    let bad = || Errno::EINVAL;
    let input = payload.get(..in_len).ok_or_else(bad)?;
    let ino = h.nodeid;
    let owner = Owner {
        uid: h.uid,
        gid: h.gid,
    };
    let one_name = || abi::names::<1>(input).map(|([n], _)| n).ok_or_else(bad);
    match h.opcode {
        opcode::LOOKUP => match ops.lookup(ino, one_name()?) {
            Ok(a) => entry(payload, &a),
            // Cached by the kernel for TTL: a stat of a missing path and the create after it
            // (git checkout, make) ask once; the kernel replaces the entry when it creates one.
            Err(Errno::ENOENT) => {
                let mut out = Out::new(payload);
                abi::negative_entry_out(&mut out, TTL);
                Ok(out.len())
            }
            Err(e) => Err(e),
        },
        opcode::GETATTR => {
            let a = ops.getattr(ino)?;
            let mut out = Out::new(payload);
            abi::attr_out(&mut out, &a, TTL);
            Ok(out.len())
        }
        opcode::SETATTR => {
            let valid = f.u32(0).ok_or_else(bad)?;
            let has = |bit| valid & bit != 0;
            let time = |set, now, secs_at, nanos_at| -> Option<std::time::SystemTime> {
                if !has(set) {
                    None
                } else if has(now) {
                    Some(std::time::SystemTime::now())
                } else {
                    Some(system_time(f.u64(secs_at)?, f.u32(nanos_at)?))
                }
            };
            // What clears setuid and setgid (FUSE_HANDLE_KILLPRIV_V2): a chown or chgrp (the
            // kernel flags every one), a truncate the kernel flags (its caller lacks
            // CAP_FSETID), and a request that sets nothing at all: the kernel's own removal of
            // privileges, whose mode change it leaves to the filesystem. That is a chown with
            // neither owner nor group, or the removal before a write through the page cache;
            // the second, from a privileged caller, only drops the file capability, which
            // the kernel removed just before (REMOVEXATTR from the same thread), and clears
            // nothing else.
            let chown = has(fattr::UID | fattr::GID);
            let sets_nothing = valid & !(fattr::NOT_ATTRIBUTES | fattr::KILL_SUIDGID) == 0;
            let caller = match has(fattr::KILL_SUIDGID) && !chown {
                true => RequestCaller::unprivileged(h.pid, h.gid),
                false => RequestCaller::new(h.pid, h.gid),
            };
            let after_capability_removal = ops.capability_removals.take(ino, h.pid);
            let clearing = if sets_nothing && after_capability_removal {
                Some(Clearing::Modify(&caller))
            } else if chown && has(fattr::KILL_SUIDGID) || sets_nothing {
                Some(Clearing::Chown(&caller))
            } else if has(fattr::KILL_SUIDGID) {
                Some(Clearing::Modify(&caller))
            } else {
                None
            };
            let set = SetAttr {
                perm: has(fattr::MODE).then(|| (f.u32(68).unwrap_or(0) & 0o7777) as u16),
                uid: has(fattr::UID).then(|| f.u32(76)).flatten(),
                gid: has(fattr::GID).then(|| f.u32(80)).flatten(),
                size: has(fattr::SIZE).then(|| f.u64(16)).flatten(),
                atime: time(fattr::ATIME, fattr::ATIME_NOW, 32, 56),
                mtime: time(fattr::MTIME, fattr::MTIME_NOW, 40, 60),
                ctime: has(fattr::CTIME)
                    .then(|| Some(system_time(f.u64(48)?, f.u32(64)?)))
                    .flatten(),
            };
            let a = ops.setattr(ino, &set, clearing)?;
            let mut out = Out::new(payload);
            abi::attr_out(&mut out, &a, TTL);
            Ok(out.len())
        }
        opcode::READLINK => {
            let target = ops.readlink(ino)?;
            data(payload, &target)
        }
        opcode::SYMLINK => {
            let ([name, target], _) = abi::names::<2>(input).ok_or_else(bad)?;
            let a = ops.symlink(ino, name, target, owner)?;
            entry(payload, &a)
        }
        opcode::MKNOD => {
            // Tests: `FAILPOINTS=fuse-request-stall=sleep(MS)`, a request that waits without
            // saying so (the ring's watch has to take its thread's lead).
            fail::fail_point!("fuse-request-stall");
            let (mode, rdev) = (f.u32(0).ok_or_else(bad)?, f.u32(4).ok_or_else(bad)?);
            let a = ops.mknod(ino, one_name()?, mode, rdev, owner)?;
            entry(payload, &a)
        }
        opcode::MKDIR => {
            let a = ops.mkdir(ino, one_name()?, f.u32(0).ok_or_else(bad)?, owner)?;
            entry(payload, &a)
        }
        opcode::UNLINK => ops.unlink(ino, one_name()?).map(|()| 0),
        opcode::RMDIR => ops.rmdir(ino, one_name()?).map(|()| 0),
        opcode::RENAME | opcode::RENAME2 => {
            let new_parent = f.u64(0).ok_or_else(bad)?;
            let flags = match h.opcode {
                opcode::RENAME2 => f.u32(8).ok_or_else(bad)?,
                _ => 0,
            };
            let ([name, new_name], _) = abi::names::<2>(input).ok_or_else(bad)?;
            ops.rename(ino, name, new_parent, new_name, flags)
                .map(|()| 0)
        }
        opcode::LINK => {
            let old = f.u64(0).ok_or_else(bad)?;
            let a = ops.link(old, ino, one_name()?)?;
            entry(payload, &a)
        }
        opcode::OPEN | opcode::OPENDIR => {
            let o = match h.opcode {
                opcode::OPEN => ops.open(ino)?,
                _ => ops.opendir(ino)?,
            };
            let mut out = Out::new(payload);
            abi::open_out(&mut out, o.fh, o.flags.bits());
            Ok(out.len())
        }
        opcode::READ => {
            let (offset, size) = (f.u64(8).ok_or_else(bad)?, f.u32(16).ok_or_else(bad)?);
            ops.read(ino, offset, size, scratch)?;
            data(payload, scratch)
        }
        opcode::WRITE => {
            let (offset, size) = (f.u64(8).ok_or_else(bad)?, f.u32(16).ok_or_else(bad)?);
            if u64::from(size) >= LONG_REQUEST_BYTES {
                // Tests: `FAILPOINTS=fuse-long-write=delay(MS)`, a large write that keeps its
                // thread busy on the CPU that long (not asleep: the ring's watch leaves it).
                fail::fail_point!("fuse-long-write");
            }
            let bytes = input.get(..size as usize).ok_or_else(bad)?;
            let write_flags = f.u32(20).ok_or_else(bad)?;
            let caller = RequestCaller::unprivileged(h.pid, h.gid);
            let clearing =
                (write_flags & abi::WRITE_KILL_SUIDGID != 0).then_some(Clearing::Modify(&caller));
            let n = ops.write(ino, offset, bytes, clearing)?;
            let mut out = Out::new(payload);
            out.u32(n).u32(0);
            Ok(out.len())
        }
        opcode::STATFS => {
            let s = ops.statfs()?;
            let mut out = Out::new(payload);
            abi::statfs_out(&mut out, &s);
            Ok(out.len())
        }
        opcode::RELEASE => Ok(0),
        opcode::RELEASEDIR => {
            ops.releasedir(f.u64(0).ok_or_else(bad)?);
            Ok(0)
        }
        opcode::FSYNC | opcode::FSYNCDIR => ops.fsync().map(|()| 0),
        opcode::SETXATTR => {
            let (size, flags) = (f.u32(0).ok_or_else(bad)?, f.u32(4).ok_or_else(bad)?);
            let ([name], value) = abi::names::<1>(input).ok_or_else(bad)?;
            let value = value.get(..size as usize).ok_or_else(bad)?;
            ops.setxattr(ino, name, value, flags as i32).map(|()| 0)
        }
        opcode::GETXATTR | opcode::LISTXATTR => {
            let size = f.u32(0).ok_or_else(bad)?;
            let x = match h.opcode {
                opcode::GETXATTR => ops.getxattr(ino, one_name()?, size)?,
                _ => ops.listxattr(ino, size)?,
            };
            match x {
                Xattr::Size(n) => {
                    let mut out = Out::new(payload);
                    out.u32(n).u32(0);
                    Ok(out.len())
                }
                Xattr::Data(v) => data(payload, &v),
            }
        }
        opcode::REMOVEXATTR => {
            let name = one_name()?;
            ops.removexattr(ino, name)?;
            if name == CAPABILITY_XATTR {
                ops.capability_removals.note(ino, h.pid);
            }
            Ok(0)
        }
        opcode::ACCESS => ops.access(ino).map(|()| 0),
        opcode::CREATE => {
            let mode = f.u32(4).ok_or_else(bad)?;
            let (a, o) = ops.create(ino, one_name()?, mode, owner)?;
            let mut out = Out::new(payload);
            abi::entry_out(&mut out, &a, TTL);
            abi::open_out(&mut out, o.fh, o.flags.bits());
            Ok(out.len())
        }
        opcode::FALLOCATE => {
            let (offset, length) = (f.u64(8).ok_or_else(bad)?, f.u64(16).ok_or_else(bad)?);
            let mode = f.u32(24).ok_or_else(bad)?;
            ops.fallocate(ino, offset, length, mode as i32).map(|()| 0)
        }
        opcode::READDIR | opcode::READDIRPLUS => {
            let (fh, offset) = (f.u64(0).ok_or_else(bad)?, f.u64(8).ok_or_else(bad)?);
            let size = (f.u32(16).ok_or_else(bad)? as usize).min(payload.len());
            let mut out = Out::new(&mut payload[..size]);
            if h.opcode == opcode::READDIR {
                ops.readdir(fh, offset, |ino, next, kind, name| {
                    !abi::dirent(&mut out, ino, next, kind, name)
                })?;
            } else {
                ops.readdirplus(fh, offset, |next, name, a| {
                    !abi::direntplus(&mut out, next, name, a, TTL)
                })?;
            }
            Ok(out.len())
        }
        opcode::LSEEK => {
            let (offset, whence) = (f.u64(8).ok_or_else(bad)?, f.u32(16).ok_or_else(bad)?);
            let o = ops.lseek(ino, offset as i64, whence as i32)?;
            let mut out = Out::new(payload);
            out.u64(o);
            Ok(out.len())
        }
        opcode::COPY_FILE_RANGE => {
            // struct fuse_copy_file_range_in: fh_in, off_in, nodeid_out, fh_out, off_out,
            // len, flags; the reply is a fuse_write_out (32-bit size).
            let (off_in, ino_out) = (f.u64(8).ok_or_else(bad)?, f.u64(16).ok_or_else(bad)?);
            let (off_out, len) = (f.u64(32).ok_or_else(bad)?, f.u64(40).ok_or_else(bad)?);
            let n = ops.copy_range(ino, off_in, ino_out, off_out, len)?;
            let mut out = Out::new(payload);
            out.u32(n).u32(0);
            Ok(out.len())
        }
        // isatty() asks on every open; ENOTTY is the answer of a file that is no terminal.
        opcode::IOCTL => Err(Errno::ENOTTY),
        // FLUSH (nothing is buffered), POLL, locks, ...: the kernel
        // remembers ENOSYS and stops asking.
        _ => Err(Errno::ENOSYS),
    }
}

fn entry(payload: &mut [u8], a: &fuser::FileAttr) -> Result<usize, Errno> {
    let mut out = Out::new(payload);
    abi::entry_out(&mut out, a, TTL);
    Ok(out.len())
}

fn data(payload: &mut [u8], bytes: &[u8]) -> Result<usize, Errno> {
    let dst = payload.get_mut(..bytes.len()).ok_or(Errno::EIO)?;
    dst.copy_from_slice(bytes);
    Ok(bytes.len())
}
