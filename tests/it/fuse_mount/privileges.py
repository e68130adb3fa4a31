# Clearing setuid, setgid and file capabilities, as the kernel's rules do it on a local file
# system: runs every case in directory argv[1] (as root, forking a child for each unprivileged
# step) and prints one line per case. The test runs it on a local ext4 and on a mount and
# compares the lines, so a mount that hands this work to the daemon must do what the kernel
# does, case for case.
import errno
import os
import socket
import stat
import struct
import subprocess
import sys

ROOT_DIR = sys.argv[1]
U, G, G2 = 65534, 65534, 60000  # the owner: its group, and another group it is in
O = 60001                       # another user, in no group of the owner
CAP = "security.capability"
# struct vfs_cap_data, revision 2, effective: cap_net_raw permitted.
CAP_VALUE = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)

KINDS = ["reg", "fifo", "sock", "chr", "blk", "dir"]
CHOWN_MODES = [0o6555, 0o6545, 0o4555, 0o2555, 0o2545, 0o6777, 0o555]
DATA_MODES = [0o6755, 0o6745, 0o4755, 0o2755, 0o2745, 0o6777, 0o2777]
count = 0


def make(kind, owner, group, mode):
    global count
    count += 1
    p = os.path.join(ROOT_DIR, "n%04d-%s" % (count, kind))
    if kind == "reg":
        with open(p, "wb") as f:
            f.write(b"x" * 100)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "sock":
        s = socket.socket(socket.AF_UNIX)
        s.bind(p)
        s.close()
    elif kind == "chr":
        os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "blk":
        os.mknod(p, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    elif kind == "dir":
        os.mkdir(p)
    os.chown(p, owner, group)
    os.chmod(p, mode)
    return p


def as_user(uid, gid, groups, fn):
    """Runs fn in a child with these credentials (no capabilities): '' or the errno's name."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            fn()
        except OSError as e:
            code = 1 + (e.errno or 0)
        except BaseException:
            code = 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return outcome(os.waitstatus_to_exitcode(status) - 1)


def outcome(err):
    if err < 0:
        return "ok"
    return errno.errorcode.get(err, "exit %d" % (err + 1))


def as_root(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))


def owner(fn):
    return as_user(U, G, [G, G2], fn)


def other(fn):
    return as_user(O, O, [O], fn)


def has_cap(p):
    try:
        os.getxattr(p, CAP, follow_symlinks=False)
        return "cap"
    except OSError as e:
        if e.errno == errno.ENODATA:
            return "nocap"
        return errno.errorcode.get(e.errno, str(e))


def report(case, kind, mode, result, p):
    st = os.lstat(p)
    extra = " " + has_cap(p) if kind == "reg" else ""
    print("%-22s %-4s %05o: %-7s -> %05o %d:%d%s" % (
        case, kind, mode, result, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, extra))


def write_at(p, data=b"y" * 10, offset=0):
    fd = os.open(p, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def ftruncate(p, size):
    fd = os.open(p, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def fallocate(p):
    fd = os.open(p, os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, 8192)
    finally:
        os.close(fd)


def copy_into(p):
    source = p + ".source"  # on the same filesystem, so the kernel may copy in place
    src = os.open(source, os.O_RDONLY)
    dst = os.open(p, os.O_WRONLY)
    try:
        os.copy_file_range(src, dst, 4, 0, 0)
    finally:
        os.close(src)
        os.close(dst)


def copy_source(p):
    with open(p + ".source", "wb") as f:
        f.write(b"copied by copy_file_range")


def otrunc(p):
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))


# chown and chgrp, by the owner and by root, of every kind of node.
CHOWNS = [
    ("chgrp-owner", lambda p: owner(lambda: os.chown(p, -1, G2, follow_symlinks=False)), G),
    ("chown-owner-same", lambda p: owner(lambda: os.chown(p, U, G, follow_symlinks=False)), G),
    ("chown-owner-none", lambda p: owner(lambda: os.chown(p, -1, -1, follow_symlinks=False)), G),
    ("chgrp-owner-outside", lambda p: owner(lambda: os.chown(p, -1, G2, follow_symlinks=False)), 0),
    ("chown-root", lambda p: as_root(lambda: os.chown(p, O, G2, follow_symlinks=False)), G),
    ("chown-root-none", lambda p: as_root(lambda: os.chown(p, -1, -1, follow_symlinks=False)), G),
]
for case, run, group in CHOWNS:
    for kind in KINDS:
        for mode in CHOWN_MODES:
            p = make(kind, U, group, mode)
            report(case, kind, mode, run(p), p)

# Writes, truncates and allocations of regular files, by the owner, another user and root.
DATA = [
    ("write-owner", lambda p: owner(lambda: write_at(p))),
    ("write-owner-extend", lambda p: owner(lambda: write_at(p, b"z" * 300_000, 100))),
    ("write-other", lambda p: other(lambda: write_at(p))),
    ("write-root", lambda p: as_root(lambda: write_at(p))),
    ("truncate-owner", lambda p: owner(lambda: os.truncate(p, 10))),
    ("truncate-owner-same", lambda p: owner(lambda: os.truncate(p, 100))),
    ("ftruncate-owner", lambda p: owner(lambda: ftruncate(p, 4096))),
    ("otrunc-owner", lambda p: owner(lambda: otrunc(p))),
    ("truncate-other", lambda p: other(lambda: os.truncate(p, 10))),
    ("truncate-root", lambda p: as_root(lambda: os.truncate(p, 10))),
    ("fallocate-owner", lambda p: owner(lambda: fallocate(p))),
    ("fallocate-root", lambda p: as_root(lambda: fallocate(p))),
    ("copy-range-owner", lambda p: copy_source(p) or owner(lambda: copy_into(p))),
]
for case, run in DATA:
    for group in [G, 0]:
        for mode in DATA_MODES:
            p = make("reg", U, group, mode)
            report(case + ("" if group == G else "-outside"), "reg", mode, run(p), p)

# File capabilities go with the same steps.
CAPS = [
    ("cap-set", lambda p: "ok"),
    ("cap-write-owner", lambda p: owner(lambda: write_at(p))),
    ("cap-write-root", lambda p: as_root(lambda: write_at(p))),
    ("cap-truncate-owner", lambda p: owner(lambda: os.truncate(p, 10))),
    ("cap-truncate-root", lambda p: as_root(lambda: os.truncate(p, 10))),
    ("cap-chown-owner", lambda p: owner(lambda: os.chown(p, -1, G2))),
    ("cap-chown-root", lambda p: as_root(lambda: os.chown(p, U, G))),
    ("cap-fallocate-owner", lambda p: owner(lambda: fallocate(p))),
    ("cap-copy-range-owner", lambda p: copy_source(p) or owner(lambda: copy_into(p))),
]
for case, run in CAPS:
    for mode in [0o755, 0o4755]:
        p = make("reg", U, G, 0o777)
        os.setxattr(p, CAP, CAP_VALUE)
        os.chmod(p, mode | 0o022)  # writable by the owner's group and others: the owner writes
        report(case, "reg", mode | 0o022, run(p), p)

# Created by the owner: the kernel's rules for a new node's setgid bit (in a setgid
# directory whose group the owner is not in).
sgid_dir = make("dir", 0, G2, 0o2777)
for kind in ["reg", "fifo", "dir"]:
    for mode in [0o6755, 0o2755]:
        count += 1
        p = os.path.join(sgid_dir, "c%04d-%s" % (count, kind))
        if kind == "reg":
            make_it = lambda: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, mode))
        elif kind == "fifo":
            make_it = lambda: os.mkfifo(p, mode)
        else:
            make_it = lambda: os.mkdir(p, mode)
        result = as_user(O, O, [O], make_it)
        report("create-in-sgid-dir", kind, mode, result, p)

# What a stale setuid bit would allow: the owner's setuid-root program, written by another
# user and run at once by that user, must not run as root.
prog = make("reg", 0, 0, 0o4777)
with open("/usr/bin/id", "rb") as f:
    body = f.read()
os.chmod(prog, 0o777)
with open(prog, "wb") as f:
    f.write(body)
os.chmod(prog, 0o4777)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    os.setgroups([O])
    os.setgid(O)
    os.setuid(O)
    write_at(prog, b"\0", len(body))
    os.dup2(w, 1)
    os.execv(prog, [prog, "-u"])
os.close(w)
euid = os.read(r, 100).decode().strip()
os.waitpid(pid, 0)
print("exec-after-write: runs as uid %s, mode %05o" % (euid, stat.S_IMODE(os.lstat(prog).st_mode)))
