# tenantfs: `make demo` and `make test` are all a fresh Debian machine needs.
# Both install missing Debian packages first (as root, or through sudo when available).

CARGO_TARGET_DIR ?= /var/tmp/tenantfs-target
export CARGO_TARGET_DIR
CARGO ?= cargo
SHELL := /bin/bash
# clang/libclang-dev: bindgen for librocksdb-sys; fuse3: FUSE mounts; fio: benchmarks;
# util-linux/mount: losetup, fincore, setpriv, fstrim; e2fsprogs: mkfs.ext4/fsck for
# block-device-style volumes; git, python3: used by the mount integration tests.
DEBS := build-essential clang libclang-dev pkg-config fuse3 fio util-linux mount e2fsprogs git python3

.PHONY: all deps build demo test lint bench clean

all: build

deps:
	@missing=""; for p in $(DEBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing missing packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup (https://rustup.rs)"; exit 1; }

build: deps
	$(CARGO) build --release --bins --examples

demo: build
	bash examples/demo.sh

# One optimised profile for everything: RocksDB's C++ build is shared with `make build`.
# Examples are compiled (and linted) by `make lint`; they hold benchmarks, not tests.
# The last line sums every test binary's result.
test: deps
	@set -o pipefail; $(CARGO) test --release --lib --bins --tests 2>&1 | tee $(CARGO_TARGET_DIR)/test.log
	@awk '/^test result:/ { p += $$4; f += $$6 } END { printf "all tests: %d passed, %d failed\n", p, f }' $(CARGO_TARGET_DIR)/test.log

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets -- -D warnings

bench: build
	$(CARGO) run --release --example bench_ctr
	$(CARGO) run --release --example bench_encrypted_reads
	$(CARGO) run --release --example bench_cache_regimes
	$(CARGO) run --release --example bench_fuse_fio

clean:
	$(CARGO) clean
