//! The boundary between RocksDB (C++ shim, `shim.cc`) and Rust.
//!
//! The shim calls the `extern "C"` functions below: to write a new file header, to open one into
//! a cipher, to apply a cipher to a whole buffer, and to free what it was given. It owns two
//! kinds of Rust objects through raw pointers: the tenant key (one per encrypted Env, freed when
//! RocksDB drops the provider) and one `FileCipher` per open file (freed with the file's stream).
//! Nothing here panics across the boundary: errors become non-zero return codes that the shim
//! turns into RocksDB `Status` values.

use std::ffi::c_void;
use std::os::raw::c_char;

use crate::crypto::{FileCipher, TenantKey};

use super::file_key::{self, PREFIX_LEN};

extern "C" {
    fn tenantfs_encrypted_env_new(key: *mut c_void) -> *mut librocksdb_sys::rocksdb_env_t;
    fn tenantfs_env_rep(env: *const librocksdb_sys::rocksdb_env_t) -> *const c_void;
    fn tenantfs_env_wrapper_size() -> usize;
    fn tenantfs_prefix_length() -> usize;
}

/// Builds a RocksDB Env whose files are all encrypted under `key` (see `file_key`).
pub(crate) fn encrypted_env(key: TenantKey) -> Option<rocksdb::Env> {
    let key = Box::into_raw(Box::new(key)).cast::<c_void>();
    // SAFETY: `key` is a valid, uniquely owned Box<TenantKey> pointer; the shim takes ownership
    // and releases it exactly once through `tenantfs_key_free`, also on its failure path.
    let raw = unsafe { tenantfs_encrypted_env_new(key) };
    if raw.is_null() {
        return None;
    }
    // SAFETY: `raw` is a freshly allocated `rocksdb_env_t` with the layout of RocksDB's c.cc
    // (guarded by tests/store_ffi.rs); ownership passes to the returned Env, which frees it with
    // rocksdb_env_destroy.
    Some(unsafe { rocksdb::Env::from_raw(raw) })
}

/// Sets `use_direct_io_for_compaction_reads`, which RocksDB 11.8's C API has and rust-rocksdb
/// does not wrap.
pub(crate) fn set_direct_io_for_compaction_reads(opts: &mut rocksdb::Options) {
    use rocksdb::AsRawPtr;
    // SAFETY: `opts` is alive and exclusively borrowed for this call; the C API only sets a
    // bool field on the options it points to.
    unsafe {
        librocksdb_sys::rocksdb_options_set_use_direct_io_for_compaction_reads(
            opts.as_raw_ptr(),
            1,
        );
    }
}

/// Facts about the shim that the layout test checks against the C API.
pub(crate) struct ShimLayout {
    pub wrapper_size: usize,
    pub prefix_length: usize,
}

pub(crate) fn shim_layout() -> ShimLayout {
    // SAFETY: both functions only return constants.
    unsafe {
        ShimLayout {
            wrapper_size: tenantfs_env_wrapper_size(),
            prefix_length: tenantfs_prefix_length(),
        }
    }
}

/// The `Env*` inside an env wrapper (for the layout test).
pub(crate) fn env_rep(env: &rocksdb::Env) -> *const c_void {
    use rocksdb::AsRawPtr;
    // SAFETY: the pointer comes from a live Env and is only read by the shim.
    unsafe { tenantfs_env_rep(env.as_raw_ptr()) }
}

#[no_mangle]
extern "C" fn tenantfs_prefix_create(key: *const c_void, prefix: *mut c_char, len: usize) -> i32 {
    if key.is_null() || prefix.is_null() || len != PREFIX_LEN {
        return -1;
    }
    // SAFETY: the shim passes the TenantKey it owns (alive for the provider's lifetime) and a
    // writable buffer of `len` bytes that RocksDB allocated for the prefix.
    let (key, out) = unsafe {
        (
            &*key.cast::<TenantKey>(),
            std::slice::from_raw_parts_mut(prefix.cast::<u8>(), len),
        )
    };
    match file_key::new_prefix(key, out) {
        Ok(_) => 0,
        Err(e) => {
            tracing::error!(error = %e, "cannot create a file key header");
            -1
        }
    }
}

#[no_mangle]
extern "C" fn tenantfs_stream_open(
    key: *const c_void,
    prefix: *const c_char,
    len: usize,
    cipher_out: *mut *mut c_void,
) -> i32 {
    if key.is_null() || prefix.is_null() || cipher_out.is_null() {
        return -1;
    }
    // SAFETY: as in `tenantfs_prefix_create`; `prefix` points to `len` readable bytes that
    // RocksDB read from (or just wrote to) the file, and `cipher_out` to one writable pointer.
    let (key, prefix) = unsafe {
        (
            &*key.cast::<TenantKey>(),
            std::slice::from_raw_parts(prefix.cast::<u8>(), len),
        )
    };
    match file_key::open_prefix(key, prefix) {
        Ok(cipher) => {
            // SAFETY: `cipher_out` is valid for one write (checked non-null above).
            unsafe { *cipher_out = Box::into_raw(Box::new(cipher)).cast() };
            0
        }
        Err(e) => {
            tracing::warn!(error = %e, "a store file's key header did not open");
            -1
        }
    }
}

#[no_mangle]
extern "C" fn tenantfs_cipher_apply(
    cipher: *const c_void,
    offset: u64,
    data: *mut c_char,
    len: usize,
) -> i32 {
    if cipher.is_null() || (data.is_null() && len > 0) {
        return -1;
    }
    if len == 0 {
        return 0;
    }
    // SAFETY: `cipher` is a FileCipher created by `tenantfs_stream_open` and not yet freed (the
    // stream that owns it is alive); `data` is RocksDB's buffer of `len` bytes, exclusively ours
    // for this call.
    let (cipher, data) = unsafe {
        (
            &*cipher.cast::<FileCipher>(),
            std::slice::from_raw_parts_mut(data.cast::<u8>(), len),
        )
    };
    cipher.apply(offset, data);
    0
}

#[no_mangle]
extern "C" fn tenantfs_cipher_free(cipher: *mut c_void) {
    if !cipher.is_null() {
        // SAFETY: created by Box::into_raw in `tenantfs_stream_open`; the shim frees it once.
        drop(unsafe { Box::from_raw(cipher.cast::<FileCipher>()) });
    }
}

#[no_mangle]
extern "C" fn tenantfs_key_free(key: *mut c_void) {
    if !key.is_null() {
        // SAFETY: created by Box::into_raw in `encrypted_env`; the shim frees it once.
        drop(unsafe { Box::from_raw(key.cast::<TenantKey>()) });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn compaction_reads_direct_io_is_set() {
        use rocksdb::AsRawPtr;
        let mut opts = rocksdb::Options::default();
        let get = |o: &rocksdb::Options| {
            // SAFETY: `o` is alive for the call; the getter only reads a bool.
            unsafe {
                librocksdb_sys::rocksdb_options_get_use_direct_io_for_compaction_reads(
                    o.as_raw_ptr(),
                )
            }
        };
        assert_eq!(get(&opts), 0);
        super::set_direct_io_for_compaction_reads(&mut opts);
        assert_eq!(get(&opts), 1);
    }
}
