# What the mount's INIT handshake hands from the kernel to the daemon, besides clearing
# setuid (privileges.py): run in directory argv[1], it prints one line per observation. The
# test runs it on a local ext4 and on a mount and compares the lines.
#   FUSE_DO_READDIRPLUS(_AUTO): a listing carries every entry's attributes, which the kernel
#     keeps as if it had looked each name up, so they must be what a lookup would say.
#   FUSE_PARALLEL_DIROPS: lookups and listings of one directory run at once; creates and
#     renames racing in one directory must still each have one winner.
#   FUSE_ASYNC_READ, FUSE_ASYNC_DIO: reads and direct I/O of one file arrive in parallel
#     and out of order; the bytes must land as they would on a local disk.
#   FUSE_DIRECT_IO_ALLOW_MMAP: a shared mapping of a FOPEN_DIRECT_IO file and read/write
#     of it see each other's bytes.
import hashlib
import mmap
import os
import stat
import sys
import threading

D = sys.argv[1]


def attrs(p, times=True):
    st = os.lstat(p)
    kind_dir = stat.S_ISDIR(st.st_mode)
    size = "-" if kind_dir else st.st_size
    mtime = st.st_mtime_ns if times and stat.S_ISREG(st.st_mode) else "-"
    return "%06o %d %d:%d %s %s" % (st.st_mode, st.st_nlink, st.st_uid, st.st_gid, size, mtime)


# Listings: a tree of every kind, hard links, and a listing followed by stat of each name.
tree = os.path.join(D, "tree")
os.mkdir(tree)
for i in range(40):
    sub = os.path.join(tree, "d%02d" % (i % 5))
    os.makedirs(os.path.join(sub, "inner"), exist_ok=True)
    p = os.path.join(sub, "f%03d" % i)
    with open(p, "wb") as f:
        f.write(b"x" * (i * 97))
    os.chmod(p, 0o600 + i % 8)
    os.utime(p, ns=(1_000_000_000 * i, 1_700_000_000_000_000_000 + i))
    os.chown(p, 1000 + i % 3, 2000 + i % 4)
os.link(os.path.join(tree, "d00", "f000"), os.path.join(tree, "d01", "hard"))
os.symlink("d00/f005", os.path.join(tree, "sym"))
os.mkfifo(os.path.join(tree, "fifo"), 0o640)
for dirpath, dirnames, filenames in sorted(os.walk(tree)):
    dirnames.sort()
    for name in sorted(dirnames + filenames):
        p = os.path.join(dirpath, name)
        print("listed %s %s" % (os.path.relpath(p, D), attrs(p)))
# A name changed right after a listing: the listing's attributes must not outlive it.
p = os.path.join(tree, "d02", "f002")
os.listdir(os.path.dirname(p))
os.chmod(p, 0o640)
with open(p, "ab") as f:
    f.write(b"more")
print("after-change %s" % attrs(p, times=False))
os.listdir(tree)
os.unlink(os.path.join(tree, "sym"))
print("after-unlink sym exists=%s" % os.path.lexists(os.path.join(tree, "sym")))

# Races in one directory: 4 threads create, make and rename the same names at once, one
# kind of step at a time; each name has one winner per step.
race = os.path.join(D, "race")
os.mkdir(race)
wins = {}
lock = threading.Lock()


def win(step, i):
    with lock:
        wins[(step, i)] = wins.get((step, i), 0) + 1


def create(i, name):
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


STEPS = [
    ("create", create, FileExistsError),
    ("mkdir", lambda i, name: os.mkdir(name + ".d"), FileExistsError),
    ("link", lambda i, name: os.link(name, name + ".l"), FileExistsError),
    ("rename", lambda i, name: os.rename(name, name + ".moved"), FileNotFoundError),
    ("rmdir", lambda i, name: os.rmdir(name + ".d"), FileNotFoundError),
]
for step, run, lost in STEPS:
    def racer(t):
        for i in range(200):
            try:
                run(i, os.path.join(race, "n%03d" % ((i + 50 * t) % 200)))
                win(step, i)
            except lost:
                pass
    threads = [threading.Thread(target=racer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
for step, _, _ in STEPS:
    n = [wins.get((step, i), 0) for i in range(200)]
    print("race %s: %d wins" % (step, sum(n)))
print("race entries %s" % sorted(os.listdir(race))[:3], len(os.listdir(race)))
print("race link count %d" % os.lstat(os.path.join(race, "n007.l")).st_nlink)

# Parallel direct I/O: 8 threads write and read disjoint 64 KiB pieces of one file, out of
# order, with O_DIRECT; then the whole file's digest.
big = os.path.join(D, "direct.bin")
fd = os.open(big, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
PIECE = 64 << 10


def piece_bytes(i):
    return bytes([(i * 7 + j) % 251 for j in range(256)]) * (PIECE // 256)


def direct_writer(t):
    buf = mmap.mmap(-1, PIECE)  # page-aligned, as O_DIRECT wants
    for i in range(t, 64, 8):
        buf[:] = piece_bytes(63 - i)
        assert os.pwritev(fd, [buf], (63 - i) * PIECE) == PIECE


threads = [threading.Thread(target=direct_writer, args=(t,)) for t in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
reads = [None] * 64


def direct_reader(t):
    buf = mmap.mmap(-1, PIECE)
    for i in range(t, 64, 8):
        assert os.preadv(fd, [buf], i * PIECE) == PIECE
        reads[i] = bytes(buf) == piece_bytes(i)


threads = [threading.Thread(target=direct_reader, args=(t,)) for t in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
os.close(fd)
with open(big, "rb") as f:
    print("direct size %d sha256 %s pieces-ok %s" % (
        os.path.getsize(big), hashlib.sha256(f.read()).hexdigest()[:16], all(reads)))

# A shared mapping and read/write of the same file see each other.
mp = os.path.join(D, "mapped.bin")
with open(mp, "wb") as f:
    f.write(b"a" * 3 * 4096)
fd = os.open(mp, os.O_RDWR)
m = mmap.mmap(fd, 3 * 4096)
os.pwrite(fd, b"written", 4096)
print("mmap sees write: %s" % (m[4096:4103] == b"written"))
m[8192:8199] = b"mapped!"
print("read sees mmap store (before msync): %s" % (os.pread(fd, 7, 8192) == b"mapped!"))
m.flush()
print("read sees mmap store: %s" % (os.pread(fd, 7, 8192) == b"mapped!"))
os.ftruncate(fd, 4096 + 10)
print("mmap after truncate: %s" % (m[4096:4103] == b"written"))
m.close()
os.close(fd)
with open(mp, "rb") as f:
    print("mapped file %s" % hashlib.sha256(f.read()).hexdigest()[:16])
