# tenantfs: `make demo` and `make test` are all a fresh Debian machine needs.
# Both install missing Debian packages first (as root, or through sudo when available).

CARGO_TARGET_DIR ?= /var/tmp/tenantfs-target
export CARGO_TARGET_DIR
CARGO ?= cargo
SHELL := /bin/bash
# clang/libclang-dev: bindgen for librocksdb-sys; fuse3: FUSE mounts; fio: benchmarks;
# util-linux/mount: losetup, fincore, setpriv, fstrim; e2fsprogs: mkfs.ext4/fsck for
# block-device-style volumes; git, python3: used by the mount integration tests;
# qemu-system-x86, busybox-static, cpio, xz-utils: the VM harness (tests/vm/vm.sh), which
# also fetches Debian's cloud kernel package into its cache on first use; qemu-utils
# (qemu-img, qemu-io), libnbd-bin (nbdinfo, nbdcopy), nbd-client (run in the VM): NBD
# clients of the block volume tests; linux-perf: the FUSE request counts of `make bench`;
# mmdebstrap: the systemd guest's root filesystem (tests/vm/systemd-guest.sh).
DEBS := build-essential clang libclang-dev pkg-config fuse3 fio util-linux mount e2fsprogs git python3 \
	qemu-system-x86 busybox-static cpio xz-utils qemu-utils libnbd-bin nbd-client linux-perf strace \
	mmdebstrap

.PHONY: all deps build demo test lint bench asan install clean

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

# What ships (and what the benchmarks run): the binary and the examples, no test features.
BUILD = $(CARGO) build --release --bins --examples

build: deps
	$(BUILD)

demo: build
	bash examples/demo.sh

# One optimised profile for everything: RocksDB's C++ build is shared with `make build`.
# Examples are compiled (and linted) by `make lint`; they hold benchmarks, not tests.
# Only the tests turn on the `failpoints` feature (the kill -9 tests' crash points): `make
# build` builds the binary and the benchmarks without it.
SHIPPED_BIN = $(CARGO_TARGET_DIR)/shipped/tenantfs
# The last line sums every test binary's result.
# 1 MiB FUSE requests from buffers that are not page-aligned need 257 pages; the kernel's cap
# is fs.fuse.max_pages_limit (256 by default). Raised to what the daemon asks for (512).
FUSE_PAGES = p=/proc/sys/fs/fuse/max_pages_limit; if [ -w $$p ] && [ "$$(cat $$p)" -lt 512 ]; then \
	  echo "raising the kernel's FUSE request size cap: echo 512 > $$p"; echo 512 > $$p; fi

test: deps
	@# FUSE over io_uring (Linux >= 6.14): off by default; the mount tests run over it.
	@p=/sys/module/fuse/parameters/enable_uring; if [ -e $$p ] && [ "$$(cat $$p)" != Y ]; then \
	  echo "enabling FUSE over io_uring: echo Y > $$p"; echo Y > $$p || sudo sh -c "echo Y > $$p"; fi
	@$(FUSE_PAGES)
	@# The VM tests' kernel (ublk, nbd, cgroup v2): downloaded once, kept in /var/tmp.
	@bash tests/vm/vm.sh prepare
	@# The systemd guest's root filesystem, from Debian's packages: built once, kept there too.
	@bash tests/vm/systemd-guest.sh prepare
	@# The binary users get, built as `make build` builds it, kept for the test that finds no
	@# failpoint registry in it (the test build below, with the crash points, replaces
	@# release/tenantfs). tee opens its file before cargo makes the target dir: a fresh machine
	@# has none yet.
	@mkdir -p $(CARGO_TARGET_DIR)/shipped
	$(BUILD)
	@cp $(CARGO_TARGET_DIR)/release/tenantfs $(SHIPPED_BIN)
	@set -o pipefail; TENANTFS_SHIPPED_BIN=$(SHIPPED_BIN) \
	  $(CARGO) test --release --features failpoints --lib --bins --tests 2>&1 | tee $(CARGO_TARGET_DIR)/test.log
	@awk '/^test result:/ { p += $$4; f += $$6 } END { printf "all tests: %d passed, %d failed\n", p, f }' $(CARGO_TARGET_DIR)/test.log

lint: deps
	$(CARGO) fmt --check
	@# With the crash points, so the code behind the feature is linted too.
	$(CARGO) clippy --release --all-targets --features failpoints -- -D warnings
	python3 tools/module_cycles.py src
	python3 tools/module_cycles.py tests/it

bench: build
	@$(FUSE_PAGES)
	$(CARGO) run --release --example bench_ctr
	$(CARGO) run --release --example bench_encrypted_reads
	$(CARGO) run --release --example bench_cache_regimes
	$(CARGO) run --release --example bench_fuse_fio
	$(CARGO) run --release --example bench_fio_suite
	$(CARGO) run --release --example bench_write_amp
	$(CARGO) run --release --example bench_extent_size
	$(CARGO) run --release --example bench_block_cache
	$(CARGO) run --release --example bench_pack_io
	$(CARGO) run --release --example bench_base
	$(CARGO) run --release --example bench_idle_mounts
	$(CARGO) run --release --example bench_nbd
	$(CARGO) run --release --example bench_vm_block
	$(CARGO) run --release --example bench_interference
	$(CARGO) run --release --example bench_interference -- vm 10 3
	$(CARGO) run --release --example bench_background_limit
	$(CARGO) run --release --example bench_weights
	$(CARGO) run --release --example bench_neighbours
	$(CARGO) run --release --example bench_cold_reads
	$(CARGO) run --release --example bench_scan
	$(CARGO) run --release --example bench_tree
	$(CARGO) run --release --example bench_space
	$(CARGO) run --release --example bench_fuse_request
	$(CARGO) run --release --example bench_checkpoint
	$(CARGO) run --release --example bench_fork_cache
	$(CARGO) run --release --example bench_base_tenants

# The library's unit tests and the cache concurrency tests under AddressSanitizer (nightly
# Rust, -Zsanitizer=address; free slab slots are poisoned by the `asan` feature). RocksDB is
# not rebuilt with ASan: the archive `make build` compiled is linked as a prebuilt library,
# so the C++ side is not instrumented. The RSS tests are skipped: ASan's shadow memory and
# quarantine change what RSS measures.
ASAN_TARGET_DIR ?= /var/tmp/tenantfs-asan-target
ASAN_RUSTFLAGS := -Zsanitizer=address -C target-cpu=x86-64-v2 -C target-feature=+pclmulqdq
asan: deps
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	$(CARGO) build --release --lib
	@# The library's unit tests, then the integration tests of the cache (module cache_memory).
	@lib=$$(ls -t $(CARGO_TARGET_DIR)/release/build/librocksdb-sys-*/out/librocksdb.a | head -1); \
	set -o pipefail; : > $(ASAN_TARGET_DIR).log; \
	for target in "--lib --" "--test it -- cache_memory::"; do \
	ROCKSDB_LIB_DIR=$$(dirname $$lib) ROCKSDB_STATIC=1 RUSTFLAGS="$(ASAN_RUSTFLAGS)" \
	ASAN_OPTIONS=detect_leaks=0 CARGO_TARGET_DIR=$(ASAN_TARGET_DIR) \
	$(CARGO) +nightly test --release --target x86_64-unknown-linux-gnu --features asan,failpoints \
	  $$target --skip drops_rss 2>&1 | tee -a $(ASAN_TARGET_DIR).log || exit 1; done
	@! grep -q "ERROR: AddressSanitizer" $(ASAN_TARGET_DIR).log && echo "asan: clean"

# The binary, the mount(8) helper, the systemd unit, the README (the unit's Documentation=)
# and an example config (DESTDIR for staging).
PREFIX ?= /usr/local
install: build
	install -D -m 755 $(CARGO_TARGET_DIR)/release/tenantfs $(DESTDIR)$(PREFIX)/bin/tenantfs
	install -D -m 755 mount/mount.tenantfs $(DESTDIR)/sbin/mount.tenantfs
	install -D -m 644 README.md $(DESTDIR)$(PREFIX)/share/doc/tenantfs/README.md
	sed -e 's|/usr/local/bin/tenantfs|$(PREFIX)/bin/tenantfs|' \
	    -e 's|/usr/local/share/doc/tenantfs|$(PREFIX)/share/doc/tenantfs|' systemd/tenantfs.service > tenantfs.service.tmp
	install -D -m 644 tenantfs.service.tmp $(DESTDIR)/etc/systemd/system/tenantfs.service
	rm -f tenantfs.service.tmp
	install -D -m 644 config/tenantfs.toml $(DESTDIR)/etc/tenantfs/tenantfs.toml.example
	@echo "installed; next: tenantfs init, then systemctl daemon-reload && systemctl enable --now tenantfs"

clean:
	$(CARGO) clean
