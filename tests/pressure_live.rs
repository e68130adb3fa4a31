//! The pressure readers against this machine's live files (cgroup v1 here; v2 is covered by
//! fixtures in src/pressure/signals.rs).

use tenantfs::pressure::signals::{read_host_psi, read_mem_available, CgroupMemory};

#[test]
fn live_signals_read() {
    let psi = read_host_psi().expect("PSI is enabled on this kernel");
    assert!(psi.some.avg10 >= 0.0 && psi.some.avg10 <= 100.0);
    let avail = read_mem_available().unwrap();
    assert!(avail > 0);
    let cg = CgroupMemory::of_self().unwrap().expect("a memory cgroup");
    let state = cg.state().unwrap();
    assert!(state.current > 0, "{cg:?}: {state:?}");
    if let Some(max) = state.max {
        assert!(max >= state.current / 2, "{state:?}");
    }
}

#[test]
fn v1_cgroup_limit_is_seen() {
    // A real memory-capped v1 cgroup: its files report the limit we set.
    let root = std::path::Path::new("/sys/fs/cgroup/memory");
    if !root.join("memory.limit_in_bytes").exists() {
        eprintln!("no cgroup v1 memory controller here; skipped");
        return;
    }
    let dir = root.join(format!("tenantfs-test-{}", std::process::id()));
    std::fs::create_dir(&dir).unwrap();
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _c = Cleanup(dir.clone());
    std::fs::write(dir.join("memory.limit_in_bytes"), "268435456").unwrap();
    let state = CgroupMemory::V1(dir.clone()).state().unwrap();
    assert_eq!(state.max, Some(256 << 20));
    assert_eq!(state.current, 0, "no task in the new cgroup");
}
