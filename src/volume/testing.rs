//! A tenant store for the volume's unit tests (and the FUSE operations' ones): one place
//! that builds a data dir, a store host and a tenant; and the crash point their kill -9
//! tests' children stop at.

/// A fresh tenant in a temporary data dir, whose volume tests open (and open again).
pub(crate) struct TestStore {
    /// (None in a child process that opens its parent's store.)
    _tmp: Option<tempfile::TempDir>,
    root: std::path::PathBuf,
    data: crate::data_dir::DataDir,
    host: crate::store::StoreHost,
}

impl TestStore {
    pub(crate) fn new() -> Self {
        Self::with_cache(8 << 20)
    }

    /// [`Self::new`] with a host cache of `cache_bytes`.
    pub(crate) fn with_cache(cache_bytes: usize) -> Self {
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = tmp.path().join("data");
        crate::data_dir::DataDir::init(&root, None).unwrap();
        let store = Self::at(&root, Some(tmp), cache_bytes);
        crate::tenants::create(&store.data, &store.host, "t", None).unwrap();
        store
    }

    /// The store another `TestStore` made at `root` (a test's child process opens its
    /// parent's store this way).
    pub(crate) fn existing(root: &std::path::Path) -> Self {
        Self::at(root, None, 8 << 20)
    }

    fn at(root: &std::path::Path, tmp: Option<tempfile::TempDir>, cache_bytes: usize) -> Self {
        Self {
            _tmp: tmp,
            root: root.to_owned(),
            data: crate::data_dir::DataDir::open(root, None).unwrap(),
            host: crate::store::StoreHost::builder()
                .block_cache_bytes(cache_bytes)
                .build(),
        }
    }

    /// Its data dir.
    pub(crate) fn root(&self) -> &std::path::Path {
        &self.root
    }

    pub(crate) fn open(&self) -> super::Volume {
        super::Volume::open(self.open_tenant()).unwrap()
    }

    pub(crate) fn data_dir(&self) -> &crate::data_dir::DataDir {
        &self.data
    }

    pub(crate) fn store_host(&self) -> &crate::store::StoreHost {
        &self.host
    }

    pub(crate) fn open_tenant(&self) -> crate::tenants::Tenant {
        crate::tenants::open(&self.data, &self.host, "t").unwrap()
    }

    /// The volume again, on the lock of a tenant this process holds, as an idle mount's
    /// store opens again (see `fuse::dormancy`).
    pub(crate) fn open_woken(
        &self,
        lock: crate::tenants::TenantLock,
    ) -> super::Result<super::Volume> {
        let tenant =
            crate::tenants::open_locked(&self.data, &self.host, "t", lock).map_err(|e| {
                super::VolumeError::Unwoken {
                    tenant: "t".into(),
                    detail: e.to_string(),
                    no_space: false,
                }
            })?;
        super::Volume::open_as(tenant, super::Opening::Woken)
    }
}

/// Makes file `name` in the root of `vol` holding `data`, written in 1 MiB pieces (bulk data
/// from 256 KiB on, as a copy writes it).
pub(crate) fn write_file(vol: &super::Volume, name: &[u8], data: &[u8]) {
    let owner = super::Owner { uid: 0, gid: 0 };
    let ino = vol
        .mknod(
            super::ROOT_INO,
            name,
            super::FileKind::File,
            0o644,
            owner,
            0,
        )
        .unwrap()
        .ino;
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        vol.write(ino, (i << 20) as u64, piece).unwrap();
    }
}

/// What file `name` in the root of `vol` holds, if there is one.
pub(crate) fn read_file(vol: &super::Volume, name: &[u8]) -> Option<Vec<u8>> {
    let attr = vol.lookup(super::ROOT_INO, name).ok()?;
    Some(vol.read(attr.ino, 0, attr.size as u32).unwrap())
}

/// `len` deterministic pseudo-random bytes (xorshift from `seed`): file data that neither
/// compresses nor reads as zeros.
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The line a child parked at a crash point prints.
pub(crate) const PARKED: &str = "PARKED";

/// Arms failpoint `name` (the `fail` crate; `make test` turns tenantfs's `failpoints` feature
/// on) in this process: its `nth` hit prints [`PARKED`] on stdout and parks the thread for
/// good, for the parent to kill the process there. (The integration tests' children park the same way,
/// with `tests/it/common/crash_point.rs`.)
pub(crate) fn park_at_failpoint(name: &str, nth: u64) {
    assert!(
        fail::has_failpoints(),
        "crash tests need the crash points: run the tests with `--features failpoints` (make test does)"
    );
    let hits = std::sync::atomic::AtomicU64::new(0);
    fail::cfg_callback(name, move || {
        if hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == nth {
            say(PARKED);
            loop {
                std::thread::park();
            }
        }
    })
    .unwrap();
}

/// Runs test `test` of this binary again as a child with `env` set (to tell it where to
/// park, `park_at_failpoint`), reads its lines that contain `marker` until it parks, kills
/// it there (SIGKILL) and returns those lines: what the child said before it parked.
pub(crate) fn killed_where_parked(test: &str, env: (&str, &str), marker: &str) -> Vec<String> {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env.0, env.1)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // (libtest prints `test name ... ` before the child's first line.)
    let seen: Vec<String> = lines
        .map_while(|l| l.ok())
        .filter(|l| l.contains(marker) || l.contains(PARKED))
        .take_while(|l| !l.contains(PARKED))
        .collect();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    seen
}

/// A line on stdout, flushed, for the parent of a crash test's child to read (the library
/// logs through tracing; this is the child's report to its parent, not a log).
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
