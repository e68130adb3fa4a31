#!/usr/bin/env bash
# `make demo`: create a data dir and a tenant, write and read through the encrypted store, and
# show what is at rest. Runs on a throwaway data dir; nothing outside it is touched.
set -euo pipefail
BIN=${CARGO_TARGET_DIR:-/var/tmp/tenantfs-target}/release
DATA=$(mktemp -d /var/tmp/tenantfs-demo.XXXXXX)
trap 'rm -rf "$DATA"' EXIT
tfs() { echo "+ tenantfs $*"; "$BIN/tenantfs" --data-dir "$DATA" --config /dev/null "$@"; }

tfs init
tfs tenant create demo
"$BIN/examples/store_demo" "$DATA" demo
tfs tenant list
echo
echo "== at rest under $DATA =="
find "$DATA" -type f -printf '%M %10s  %P\n' | sort -k3
echo
hits=$(grep -rlF "hello from tenant" "$DATA" | wc -l || true)
echo "files containing the plaintext 'hello from tenant': $hits"
sst=$(find "$DATA" -name '*.sst' | head -n1)
echo "first bytes of $(basename "$sst") (header magic, then sealed file key):"
head -c 48 "$sst" | od -A d -t x1z | head -n 3
echo
tfs tenant delete demo
