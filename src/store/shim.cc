// tenantfs C++ shim: the only C++ in the crate.
//
// RocksDB's encryption hook is a C++ interface (rocksdb::EncryptionProvider) that the C API does
// not expose, so this file implements it and hands RocksDB an encrypted Env through the C API's
// own `rocksdb_env_t` wrapper. All key handling and all cipher work stays in Rust
// (src/store/ffi.rs): this file only forwards whole buffers, once per read or write call.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "rocksdb/env.h"
#include "rocksdb/env_encryption.h"
#include "rocksdb/status.h"

using ROCKSDB_NAMESPACE::BlockAccessCipherStream;
using ROCKSDB_NAMESPACE::EncryptionProvider;
using ROCKSDB_NAMESPACE::Env;
using ROCKSDB_NAMESPACE::EnvOptions;
using ROCKSDB_NAMESPACE::Slice;
using ROCKSDB_NAMESPACE::Status;

extern "C" {
// Implemented in Rust (src/store/ffi.rs). Return 0 on success.
int tenantfs_prefix_create(const void* key, char* prefix, size_t len);
int tenantfs_stream_open(const void* key, const char* prefix, size_t len,
                         void** cipher_out);
int tenantfs_cipher_apply(const void* cipher, uint64_t offset, char* data,
                          size_t len);
void tenantfs_cipher_free(void* cipher);
void tenantfs_key_free(void* key);
}

namespace {

constexpr size_t kPrefixLength = 4096;  // keeps O_DIRECT alignment of the body

// CTR is its own inverse: encrypt and decrypt are the same keystream XOR, done in Rust over the
// whole buffer at once (not 16 bytes at a time as the base class would).
class RustCipherStream final : public BlockAccessCipherStream {
 public:
  explicit RustCipherStream(void* cipher) : cipher_(cipher) {}
  ~RustCipherStream() override { tenantfs_cipher_free(cipher_); }

  size_t BlockSize() override { return 16; }

  Status Encrypt(uint64_t offset, char* data, size_t size) override {
    return Apply(offset, data, size);
  }
  Status Decrypt(uint64_t offset, char* data, size_t size) override {
    return Apply(offset, data, size);
  }

 protected:
  void AllocateScratch(std::string&) override {}
  Status EncryptBlock(uint64_t, char*, char*) override {
    return Status::NotSupported("tenantfs cipher works on whole buffers");
  }
  Status DecryptBlock(uint64_t, char*, char*) override {
    return Status::NotSupported("tenantfs cipher works on whole buffers");
  }

 private:
  Status Apply(uint64_t offset, char* data, size_t size) {
    if (tenantfs_cipher_apply(cipher_, offset, data, size) != 0) {
      return Status::IOError("tenantfs: cipher failed");
    }
    return Status::OK();
  }
  void* cipher_;
};

// One provider per tenant store; owns (through Rust) that tenant's key.
class TenantEncryptionProvider final : public EncryptionProvider {
 public:
  explicit TenantEncryptionProvider(void* key) : key_(key) {}
  ~TenantEncryptionProvider() override { tenantfs_key_free(key_); }

  const char* Name() const override { return "TenantfsEncryptionProvider"; }
  size_t GetPrefixLength() const override { return kPrefixLength; }

  Status CreateNewPrefix(const std::string& fname, char* prefix,
                         size_t len) const override {
    if (tenantfs_prefix_create(key_, prefix, len) != 0) {
      return Status::IOError("tenantfs: cannot create file key header", fname);
    }
    return Status::OK();
  }

  Status AddCipher(const std::string&, const char*, size_t, bool) override {
    return Status::NotSupported("tenantfs keys are set at construction");
  }

  Status CreateCipherStream(
      const std::string& fname, const EnvOptions&, Slice& prefix,
      std::unique_ptr<BlockAccessCipherStream>* result) override {
    void* cipher = nullptr;
    int rc = tenantfs_stream_open(key_, prefix.data(), prefix.size(), &cipher);
    if (rc != 0 || cipher == nullptr) {
      return Status::Corruption(
          "tenantfs: file key header does not open under this tenant's key "
          "(wrong key, or the file header is damaged)",
          fname);
    }
    result->reset(new RustCipherStream(cipher));
    return Status::OK();
  }

 private:
  void* key_;
};

}  // namespace

// Same layout as the definition in RocksDB's db/c.cc; rust-rocksdb's Env::from_raw takes one of
// these and frees it with rocksdb_env_destroy (which deletes `rep` unless `is_default`).
// tests/store_ffi_layout.rs guards the layout by driving the result through the C API.
struct rocksdb_env_t {
  Env* rep;
  bool is_default;
};

extern "C" {

// Takes ownership of `key` (freed through tenantfs_key_free when RocksDB drops the provider).
rocksdb_env_t* tenantfs_encrypted_env_new(void* key) {
  auto provider = std::make_shared<TenantEncryptionProvider>(key);
  Env* env = ROCKSDB_NAMESPACE::NewEncryptedEnv(Env::Default(), provider);
  if (env == nullptr) {
    return nullptr;
  }
  return new rocksdb_env_t{env, false};
}

// Used by the layout test: the Env* this wrapper holds.
const void* tenantfs_env_rep(const rocksdb_env_t* env) { return env->rep; }

size_t tenantfs_env_wrapper_size() { return sizeof(rocksdb_env_t); }

size_t tenantfs_prefix_length() { return kPrefixLength; }
}
