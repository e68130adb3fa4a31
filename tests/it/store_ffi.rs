//! Guards the assumptions the C++ shim makes about RocksDB's C API.

use rocksdb::AsRawPtr;

/// The shim builds `rocksdb_env_t` itself; its layout must be the one in RocksDB's c.cc, or
/// every C API call through rust-rocksdb's Env would read the wrong pointer.
#[test]
fn env_wrapper_layout_matches_c_api() {
    assert_eq!(
        tenantfs::store::layout::env_wrapper_size(),
        std::mem::size_of::<*const u8>() * 2,
        "rocksdb_env_t is {{ Env* rep; bool is_default; }}"
    );
    let (mut env, rep) = tenantfs::store::layout::encrypted_env_and_rep();
    assert!(!rep.is_null());
    // Drive the wrapper through RocksDB's own C API: set, then read back through c.cc's layout.
    env.set_background_threads(3);
    // SAFETY: `env` owns a live rocksdb_env_t for the whole test; the call only reads it.
    let got = unsafe { librocksdb_sys::rocksdb_env_get_background_threads(env.as_raw_ptr()) };
    assert_eq!(got, 3);
    env.set_background_threads(1);
    // SAFETY: as above.
    let got = unsafe { librocksdb_sys::rocksdb_env_get_background_threads(env.as_raw_ptr()) };
    assert_eq!(got, 1);
}

#[test]
fn header_keeps_direct_io_alignment() {
    assert_eq!(tenantfs::store::layout::prefix_length(), 4096);
    assert_eq!(tenantfs::store::FILE_HEADER_LEN, 4096);
}
