#!/usr/bin/env bash
# `make demo`: create a data dir and a tenant, mount its filesystem, use it, show the host
# cache and what is at rest (encrypted), then import a small base image, start the host
# daemon, create two tenants from the base, mount both through the daemon, write and read,
# show stats (dedup and the shared cache), unmount, stop. Runs on a throwaway data dir;
# nothing outside it is touched.
set -euo pipefail
BIN=${CARGO_TARGET_DIR:-/var/tmp/tenantfs-target}/release
WORK=$(mktemp -d /var/tmp/tenantfs-demo.XXXXXX)
DATA=$WORK/data
MNT=$WORK/mnt
MNT2=$WORK/mnt2
mkdir -p "$MNT" "$MNT2"
cleanup() {
  [ -n "${DAEMON_PID:-}" ] && kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
  for m in "$MNT" "$MNT2"; do
    mountpoint -q "$m" 2>/dev/null && "$BIN/tenantfs" --data-dir "$DATA" umount "$m" >/dev/null 2>&1
    mountpoint -q "$m" 2>/dev/null && umount -l "$m"
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
tfs() { echo "+ tenantfs $*"; "$BIN/tenantfs" --data-dir "$DATA" --config /dev/null "$@"; }
say() { echo; echo "== $* =="; }

tfs init
tfs tenant create demo
tfs mount demo "$MNT"
say "using the tenant's filesystem at $MNT"
mkdir -p "$MNT/docs"
for i in $(seq 1 200); do echo "hello from tenant demo, note $i" > "$MNT/docs/note-$i.txt"; done
cp -a /etc/os-release "$MNT/docs/"
dd if=/dev/urandom of="$MNT/blob.bin" bs=1M count=8 status=none
ln -s docs/note-1.txt "$MNT/latest"
sha_in=$(sha256sum "$MNT/blob.bin" | cut -d' ' -f1)
ls -la "$MNT" | sed 's/^/  /'
echo "  $(ls "$MNT/docs" | wc -l) files in docs/; latest -> $(readlink "$MNT/latest"): $(cat "$MNT/latest")"
df -h "$MNT" | sed 's/^/  /'
tfs umount "$MNT"

say "remounted: data survives"
tfs mount demo "$MNT"
sha_out=$(sha256sum "$MNT/blob.bin" | cut -d' ' -f1)
echo "  blob.bin sha256 before: $sha_in"
echo "  blob.bin sha256 after:  $sha_out"
[ "$sha_in" = "$sha_out" ] && echo "  identical"
cat "$MNT/blob.bin" > /dev/null   # a second read: served from the host cache

say "the host cache of the serving process"
tfs cache stats
tfs cache release 4M
tfs cache budget 256M
echo "+ tenantfs cache stats --json  (top-level fields)"
"$BIN/tenantfs" --data-dir "$DATA" --config /dev/null cache stats --json | python3 -c 'import json, sys; d = json.load(sys.stdin)
print("  " + ", ".join(f"{k}={d[k]}" for k in ("budget_bytes", "used_bytes", "resident_bytes",
      "hits", "misses", "evictions", "released_bytes")))'
tfs umount "$MNT"

say "at rest under $DATA (encrypted RocksDB files)"
find "$DATA" -type f -printf '  %M %10s  %P\n' | sort -k3
hits=$(grep -rlF "hello from tenant" "$DATA" | wc -l || true)
echo "  files containing the plaintext 'hello from tenant': $hits"
sst=$(find "$DATA" -name '*.sst' | head -n1)
echo "  first bytes of $(basename "$sst"): header magic, then the sealed per-file key:"
head -c 48 "$sst" | od -A d -t x1z | head -n 3 | sed 's/^/  /'
echo
tfs tenant list
tfs tenant delete demo

say "a base image, stored once, shared by two tenants"
BASE_SRC=$WORK/base-src
mkdir -p "$BASE_SRC/etc" "$BASE_SRC/usr/share"
echo "welcome to the shared base image" > "$BASE_SRC/etc/motd"
cp -a "$(dirname "$0")/../src" "$BASE_SRC/usr/share/tenantfs-src"
dd if=/dev/urandom of="$BASE_SRC/usr/share/blob" bs=1M count=4 status=none
tfs base import os "$BASE_SRC"
tfs base import os-again "$BASE_SRC"
tfs tenant create alice --base os
tfs tenant create bob --base os
tfs base list

say "the host daemon serves both tenants from one process and one cache"
echo "+ tenantfs daemon &"
"$BIN/tenantfs" --data-dir "$DATA" --config /dev/null daemon 2> "$WORK/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 1 100); do [ -S "$DATA/tenantfs.sock" ] && break; sleep 0.1; done
tfs mount alice "$MNT"
tfs mount bob "$MNT2"
echo "  alice sees the base: $(find "$MNT" -type f | wc -l) files; bob: $(find "$MNT2" -type f | wc -l)"
echo "alice was here" >> "$MNT/etc/motd"
echo "  alice changed etc/motd (copy on write); bob's copy is untouched:"
echo "    alice: $(tr '\n' '|' < "$MNT/etc/motd")"
echo "    bob:   $(tr '\n' '|' < "$MNT2/etc/motd")"
cmp -s "$MNT2/usr/share/blob" "$BASE_SRC/usr/share/blob" && echo "  bob reads the base's 4 MiB blob intact"
cat "$MNT/usr/share/blob" > /dev/null   # alice reads the same base blocks: cache hits
tfs tenant list
tfs stats
echo "+ tenantfs cache stats --json  (the base blocks, cached once for both tenants)"
"$BIN/tenantfs" --data-dir "$DATA" --config /dev/null cache stats --json | python3 -c 'import json, sys; d = json.load(sys.stdin)["processes"][0]["blocks"]
print("  base block cache: %d blocks, %d KiB, %d hits, %d misses" % (d["entries"], d["used_bytes"] >> 10, d["hits"], d["misses"]))'
tfs umount "$MNT"
tfs umount "$MNT2"
echo "+ kill -TERM $DAEMON_PID  (the daemon unmounts what is left and exits 0)"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" && echo "  daemon exited cleanly"
tfs base verify
tfs tenant delete alice
tfs tenant delete bob
tfs base delete os
tfs base delete os-again
tfs base gc
