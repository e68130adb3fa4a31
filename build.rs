//! Builds the C++ shim (`src/store/shim.cc`) that plugs tenantfs's per-file encryption into
//! RocksDB. It compiles against the exact RocksDB headers that librocksdb-sys bundles, which that
//! crate exports to its direct dependents as `DEP_ROCKSDB_CARGO_MANIFEST_DIR`.

use std::env;
use std::path::PathBuf;

fn main() {
    let rocksdb_src = env::var("DEP_ROCKSDB_CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .expect("librocksdb-sys must be a direct dependency (it exports its source dir)");
    let include = rocksdb_src.join("rocksdb").join("include");
    cc::Build::new()
        .cpp(true)
        .file("src/store/shim.cc")
        .file("src/store/pipelined_writes.cc")
        .file("src/store/extent_files.cc")
        .include(&include)
        .include(rocksdb_src.join("rocksdb"))
        .flag("-std=c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .define("ROCKSDB_PLATFORM_POSIX", None)
        .define("ROCKSDB_LIB_IO_POSIX", None)
        .define("OS_LINUX", None)
        .define("NDEBUG", Some("1"))
        .compile("tenantfs_shim");
    println!("cargo:rerun-if-changed=src/store/shim.cc");
    println!("cargo:rerun-if-changed=src/store/pipelined_writes.cc");
    println!("cargo:rerun-if-changed=src/store/pipelined_writes.h");
    println!("cargo:rerun-if-changed=src/store/extent_files.cc");
    println!("cargo:rerun-if-changed=build.rs");
}
