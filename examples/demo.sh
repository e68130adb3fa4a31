#!/usr/bin/env bash
# `make demo`: create a data dir and a tenant, mount its filesystem, use it, show what is at
# rest (encrypted), unmount. Runs on a throwaway data dir; nothing outside it is touched.
set -euo pipefail
BIN=${CARGO_TARGET_DIR:-/var/tmp/tenantfs-target}/release
WORK=$(mktemp -d /var/tmp/tenantfs-demo.XXXXXX)
DATA=$WORK/data
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
  mountpoint -q "$MNT" 2>/dev/null && "$BIN/tenantfs" --data-dir "$DATA" umount "$MNT" >/dev/null 2>&1
  mountpoint -q "$MNT" 2>/dev/null && umount -l "$MNT"
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
