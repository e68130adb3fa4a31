// tenantfs C++ shim: the only C++ in the crate.
//
// Two C++ interfaces that the C API does not expose are implemented here:
// - rocksdb::EncryptionProvider, handed to RocksDB as an encrypted Env through the C API's own
//   `rocksdb_env_t` wrapper (its direct writes pipelined, see pipelined_writes.cc). All key handling and all cipher work stays in Rust
//   (src/store/ffi.rs): this file only forwards whole buffers, once per read or write call.
// - rocksdb::MemoryAllocator over the Rust slab allocator, installed on an LRU cache (wrapped to
//   count hits, misses and evictions) returned as the C API's `rocksdb_cache_t`, so the block
//   cache's memory goes back to the kernel when blocks are evicted.
// - A store's view of that cache as its blob cache, under keys that name each blob file by its
//   header (src/store/file_ids.rs) instead of by the reading store's session, so that stores
//   sharing a blob file (forks) share its cached values.
// - rocksdb::EventListener that tells Rust when a store stops taking writes and when it takes
//   them again (src/store/health.rs), and DB::Resume, which the C API lacks.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rocksdb/advanced_cache.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/env_encryption.h"
#include "rocksdb/listener.h"
#include "rocksdb/memory_allocator.h"
#include "rocksdb/metadata.h"
#include "rocksdb/options.h"
#include "rocksdb/status.h"

#include "cache/cache_key.h"  // RocksDB's own (not public): how blob cache keys are made
#include "file/filename.h"     // RocksDB's own (not public): SetIdentityFile
#include "pipelined_writes.h"

using ROCKSDB_NAMESPACE::BackgroundErrorReason;
using ROCKSDB_NAMESPACE::BackgroundErrorRecoveryInfo;
using ROCKSDB_NAMESPACE::BlobFileCreationInfo;
using ROCKSDB_NAMESPACE::BlockAccessCipherStream;
using ROCKSDB_NAMESPACE::Cache;
using ROCKSDB_NAMESPACE::CacheWrapper;
using ROCKSDB_NAMESPACE::CompactionJobInfo;
using ROCKSDB_NAMESPACE::EncryptionProvider;
using ROCKSDB_NAMESPACE::DB;
using ROCKSDB_NAMESPACE::Env;
using ROCKSDB_NAMESPACE::EnvOptions;
using ROCKSDB_NAMESPACE::EventListener;
using ROCKSDB_NAMESPACE::Options;
using ROCKSDB_NAMESPACE::LRUCacheOptions;
using ROCKSDB_NAMESPACE::MemoryAllocator;
using ROCKSDB_NAMESPACE::Slice;
using ROCKSDB_NAMESPACE::Status;
using ROCKSDB_NAMESPACE::TableFileCreationInfo;

extern "C" {
// Implemented in Rust (src/store/ffi.rs). Return 0 on success.
int tenantfs_prefix_create(const void* key, const char* name, size_t name_len,
                           char* prefix, size_t len);
int tenantfs_stream_open(const void* key, const char* name, size_t name_len,
                         const char* prefix, size_t len, void** cipher_out);
int tenantfs_cipher_apply(const void* cipher, uint64_t offset, char* data,
                          size_t len);
void tenantfs_cipher_free(void* cipher);
void tenantfs_key_free(void* key);
// The slab allocator (an Arc<AddressedSlabs> the allocator below holds one count of).
void* tenantfs_slab_allocate(const void* slabs, size_t size);
int tenantfs_slab_deallocate(const void* slabs, void* p);  // 1 if it was a slab allocation
size_t tenantfs_slab_usable_size(size_t size);
void tenantfs_slabs_release(const void* slabs);
// A store's health (an Arc<StoreHealth> the listener below holds one count of).
void tenantfs_store_stopped(const void* health, int no_space, const char* detail,
                            size_t len);
void tenantfs_store_resumed(const void* health);
void tenantfs_store_flush_begins(const void* health);
void tenantfs_store_background_io(const void* health, uint64_t bytes, uint64_t elapsed_us);
void tenantfs_health_release(const void* health);
// A store's file ids (an Arc<FileIds> the blob cache below holds one count of): writes the
// 28-byte key of blob file `number`'s bytes at `offset` into `out`; 0 if the file's id is known.
int tenantfs_blob_cache_key(const void* ids, uint64_t number, uint64_t offset, char* out);
void tenantfs_file_ids_release(const void* ids);
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
    if (tenantfs_prefix_create(key_, fname.data(), fname.size(), prefix, len) != 0) {
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
    int rc = tenantfs_stream_open(key_, fname.data(), fname.size(), prefix.data(),
                                  prefix.size(), &cipher);
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

// Block memory from the Rust slab allocator. Deallocate gets no size, so the Rust side finds the
// allocation by address. If the slabs cannot map more memory, malloc keeps RocksDB going (it does
// not check for null) and free takes such blocks back.
class SlabMemoryAllocator final : public MemoryAllocator {
 public:
  explicit SlabMemoryAllocator(const void* slabs) : slabs_(slabs) {}
  ~SlabMemoryAllocator() override { tenantfs_slabs_release(slabs_); }

  const char* Name() const override { return "TenantfsSlabAllocator"; }

  void* Allocate(size_t size) override {
    void* p = tenantfs_slab_allocate(slabs_, size);
    return p != nullptr ? p : std::malloc(size);
  }
  void Deallocate(void* p) override {
    if (tenantfs_slab_deallocate(slabs_, p) == 0) {
      std::free(p);
    }
  }
  // The cache charges blocks by this, so its usage counts what the slots really take.
  size_t UsableSize(void*, size_t allocation_size) const override {
    return tenantfs_slab_usable_size(allocation_size);
  }

 private:
  const void* slabs_;
};

// Misses of every counting cache on this thread: a reader compares it before and after a
// read to learn whether the read went to the disk.
thread_local uint64_t thread_misses = 0;

// A lookup missed: the thread is about to read from the disk, and gives up any lead it
// holds over other tenants' requests first (`serving.rs`).
extern "C" void tenantfs_will_wait();

struct CacheCounters {
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> evictions{0};
};

// The LRU cache with hit and miss counters on Lookup (evictions come from the LRU cache's
// eviction callback). It carries the allocator too: table readers allocate blocks through
// `block_cache->memory_allocator()`, which a plain CacheWrapper would leave null.
class CountingCache final : public CacheWrapper {
 public:
  CountingCache(std::shared_ptr<Cache> target,
                std::shared_ptr<MemoryAllocator> allocator,
                std::shared_ptr<CacheCounters> counters)
      : CacheWrapper(std::move(target)), counters_(std::move(counters)) {
    memory_allocator_ = std::move(allocator);
  }

  const char* Name() const override { return "TenantfsCountingCache"; }

  Handle* Lookup(const Slice& key, const CacheItemHelper* helper,
                 CreateContext* create_context,
                 Priority priority = Priority::LOW,
                 ROCKSDB_NAMESPACE::Statistics* stats = nullptr) override {
    Handle* h =
        target_->Lookup(key, helper, create_context, priority, stats);
    (h != nullptr ? counters_->hits : counters_->misses)
        .fetch_add(1, std::memory_order_relaxed);
    if (h == nullptr) {
      thread_misses += 1;
      tenantfs_will_wait();
    }
    return h;
  }

  // MultiGet looks its blocks up through here: the default defers to Lookup above, so they
  // are counted too (CacheWrapper's would go to the target's Lookup directly).
  void StartAsyncLookup(AsyncLookupHandle& async_handle) override {
    Cache::StartAsyncLookup(async_handle);
  }

  // A lookup of a raw entry (extent bytes): counted as any, but the thread's lead is not
  // given up on a miss. The caller decides whether a disk read follows, and says so itself
  // before it waits (a read the FUSE ring makes for it waits on no thread).
  Handle* RawLookup(const Slice& key) {
    Handle* h = target_->BasicLookup(key, nullptr);
    (h != nullptr ? counters_->hits : counters_->misses)
        .fetch_add(1, std::memory_order_relaxed);
    if (h == nullptr) {
      thread_misses += 1;
    }
    return h;
  }

  const CacheCounters& counters() const { return *counters_; }
  const std::shared_ptr<MemoryAllocator>& allocator() const { return memory_allocator_; }

 private:
  std::shared_ptr<CacheCounters> counters_;
};

uint64_t ReverseBits(uint64_t v) {
  uint64_t r = 0;
  for (int i = 0; i < 64; i++, v >>= 1) {
    r = (r << 1) | (v & 1);
  }
  return r;
}

// A RocksDB cache key as its two words.
struct KeyWords {
  uint64_t a;
  uint64_t b;
  bool operator==(const KeyWords&) const = default;
};

KeyWords WordsOf(const Slice& key) {
  KeyWords w;
  std::memcpy(&w.a, key.data(), 8);
  std::memcpy(&w.b, key.data() + 8, 8);
  return w;
}

// One store's blob cache: the host cache (the CountingCache above) under keys that name a blob
// file by its id (src/store/file_ids.rs). RocksDB keys a blob value by (db id, the opening
// session's id, file number, offset), so the same file read by two stores, or by one store
// before and after a reopen, was cached twice. RocksDB makes that key as two words
// (cache/cache_key.cc): a = f(session) ^ ReverseBits(g(db id, session) ^ file number) and
// b = h(session) ^ offset, so within one session a key is (a0 ^ ReverseBits(number), b0 ^
// offset), where (a0, b0) is file 0's key at offset 0. `Start` takes (a0, b0) from RocksDB's
// own function once the session is known and checks that shape on sample keys; from then on
// each key is turned back into (number, offset) and, if the file's id is known, replaced by
// the file's key. Any other key (before `Start`, a file whose header this store has not opened
// yet, a shape that did not check out) passes unchanged: cached for this session alone.
class BlobCacheKeys final : public CacheWrapper {
 public:
  static constexpr size_t kKeyLength = 28;

  BlobCacheKeys(std::shared_ptr<Cache> target,
                std::shared_ptr<MemoryAllocator> allocator, const void* ids)
      : CacheWrapper(std::move(target)), ids_(ids) {
    // Blob reads allocate their buffers through `memory_allocator()`.
    memory_allocator_ = std::move(allocator);
  }
  ~BlobCacheKeys() override { tenantfs_file_ids_release(ids_); }
  BlobCacheKeys(const BlobCacheKeys&) = delete;
  BlobCacheKeys& operator=(const BlobCacheKeys&) = delete;

  const char* Name() const override { return "TenantfsBlobCacheKeys"; }

  // The store's session is `session` of DB `db_id`: keys are turned into file keys from now
  // on. False (and keys stay the session's) if RocksDB's keys are not of the shape above.
  bool Start(const std::string& db_id, const std::string& session) {
    auto key = [&](uint64_t number, uint64_t offset) {
      using ROCKSDB_NAMESPACE::OffsetableCacheKey;
      return WordsOf(OffsetableCacheKey(db_id, session, number).WithOffset(offset).AsSlice());
    };
    const KeyWords base = key(0, 0);
    // RocksDB swaps a key's words for the one file number whose first word would be 0: that
    // file number must be far beyond any a store reaches (it is random: it is, but for odds of
    // 2^-16), and 0 must not be it.
    if (base.b == 0 || ReverseBits(base.a) < (uint64_t{1} << 48)) {
      return false;
    }
    for (uint64_t number : {uint64_t{1}, uint64_t{2}, uint64_t{4097}, uint64_t{1} << 40}) {
      for (uint64_t offset : {uint64_t{0}, uint64_t{33}, uint64_t{1} << 30}) {
        if (!(key(number, offset) == KeyWords{base.a ^ ReverseBits(number), base.b ^ offset})) {
          return false;
        }
      }
    }
    base_a_ = base.a;
    base_b_ = base.b;
    started_.store(true, std::memory_order_release);
    return true;
  }

  Status Insert(const Slice& key, ObjectPtr value, const CacheItemHelper* helper,
                size_t charge, Handle** handle = nullptr,
                Priority priority = Priority::LOW,
                const Slice& compressed_value = Slice(),
                ROCKSDB_NAMESPACE::CompressionType type =
                    ROCKSDB_NAMESPACE::CompressionType::kNoCompression) override {
    char buf[kKeyLength];
    return target_->Insert(FileKey(key, buf), value, helper, charge, handle, priority,
                           compressed_value, type);
  }

  Handle* Lookup(const Slice& key, const CacheItemHelper* helper,
                 CreateContext* create_context,
                 Priority priority = Priority::LOW,
                 ROCKSDB_NAMESPACE::Statistics* stats = nullptr) override {
    char buf[kKeyLength];
    return target_->Lookup(FileKey(key, buf), helper, create_context, priority, stats);
  }

  // The default defers to Lookup above (CacheWrapper's would pass the key unchanged).
  void StartAsyncLookup(AsyncLookupHandle& async_handle) override {
    Cache::StartAsyncLookup(async_handle);
  }

  void Erase(const Slice& key) override {
    char buf[kKeyLength];
    target_->Erase(FileKey(key, buf));
  }

  // For the test of the key shape: the key the cache is asked for in place of `key`.
  std::string KeyFor(const Slice& key) const {
    char buf[kKeyLength];
    return FileKey(key, buf).ToString();
  }

 private:
  // The file key of `key` (written into `buf`), or `key` itself.
  Slice FileKey(const Slice& key, char* buf) const {
    if (key.size() != 16 || !started_.load(std::memory_order_acquire)) {
      return key;
    }
    const KeyWords w = WordsOf(key);
    const uint64_t number = ReverseBits(w.a ^ base_a_);
    const uint64_t offset = w.b ^ base_b_;
    if (tenantfs_blob_cache_key(ids_, number, offset, buf) != 0) {
      return key;
    }
    return Slice(buf, kKeyLength);
  }

  const void* ids_;
  std::atomic<bool> started_{false};
  uint64_t base_a_ = 0;
  uint64_t base_b_ = 0;
};

// Raw entries for benchmarks and tests of the cache itself (RocksDB's own blocks are inserted
// by its table readers): the bytes in an allocation of exactly their length (so a 4 KiB block
// takes a 4 KiB slot), described by a small RawEntry on the heap.
struct RawEntry {
  char* data;
  size_t len;
};

void DeleteRawEntry(Cache::ObjectPtr obj, MemoryAllocator* allocator) {
  auto* e = static_cast<RawEntry*>(obj);
  if (allocator != nullptr) {
    allocator->Deallocate(e->data);
  } else {
    std::free(e->data);
  }
  delete e;
}

const Cache::CacheItemHelper kRawEntryHelper{
    ROCKSDB_NAMESPACE::CacheEntryRole::kMisc, &DeleteRawEntry};

// Reports a store that stopped taking writes (a background error of hard severity or worse)
// and one that takes them again. For a full disk it also turns RocksDB's own recovery off:
// that one waits until the disk has the whole memtable budget free (64 MiB per store) before
// it retries; tenantfs resumes the store itself once there is room (TenantDb::try_resume).
class HealthListener final : public EventListener {
 public:
  explicit HealthListener(const void* health) : health_(health) {}
  ~HealthListener() override { tenantfs_health_release(health_); }
  HealthListener(const HealthListener&) = delete;
  HealthListener& operator=(const HealthListener&) = delete;

  const char* Name() const override { return "TenantfsHealthListener"; }

  void OnBackgroundError(BackgroundErrorReason reason, Status* error) override {
    // A memtable switch whose new WAL could not be written on a full disk is fatal to
    // RocksDB (kMemTable: it fears WAL bytes lost from the writer's buffer), and no Resume
    // clears a fatal error. tenantfs writes without manual_wal_flush, so every write's WAL
    // record reached the file before the write returned: nothing was buffered, and the old
    // WAL holds all the memtable does. Hard is the true severity: the store stops and Resume
    // flushes it once there is room (tests/direct_io.rs reopens such a store afterwards).
    if (reason == BackgroundErrorReason::kMemTable && error->IsNoSpace() &&
        error->severity() > Status::Severity::kHardError) {
      *error = Status(*error, Status::Severity::kHardError);
    }
    if (error->severity() >= Status::Severity::kHardError) {
      std::string detail = error->ToString();
      // Past hard (fatal, unrecoverable) no Resume helps, whatever the cause.
      int no_space = error->IsNoSpace() &&
                     error->severity() == Status::Severity::kHardError;
      tenantfs_store_stopped(health_, no_space, detail.data(), detail.size());
    }
  }

  // Before a flush writes a memtable out: the extent files its values name are made durable
  // first (src/store/extents/), so no durable value names bytes that are not.
  void OnFlushBegin(DB*, const ROCKSDB_NAMESPACE::FlushJobInfo&) override {
    tenantfs_store_flush_begins(health_);
  }

  // The store's background work, reported as it moves bytes (the tenant is charged for it:
  // src/store/background.rs): every table and blob file a flush or compaction writes, and
  // what a compaction read.
  void OnTableFileCreated(const TableFileCreationInfo& info) override {
    if (info.status.ok()) {
      tenantfs_store_background_io(health_, info.file_size, 0);
    }
  }

  void OnBlobFileCreated(const BlobFileCreationInfo& info) override {
    if (info.status.ok()) {
      tenantfs_store_background_io(health_, info.total_blob_bytes, 0);
    }
  }

  void OnCompactionCompleted(DB*, const CompactionJobInfo& info) override {
    if (info.status.ok()) {
      tenantfs_store_background_io(
          health_, info.stats.total_input_bytes + info.stats.total_blob_bytes_read,
          info.stats.elapsed_micros);
    }
  }

  void OnErrorRecoveryBegin(BackgroundErrorReason, Status error,
                            bool* auto_recovery) override {
    if (error.IsNoSpace() &&
        error.severity() >= Status::Severity::kHardError) {
      *auto_recovery = false;
    }
    error.PermitUncheckedError();
  }

  void OnErrorRecoveryEnd(const BackgroundErrorRecoveryInfo& info) override {
    if (info.new_bg_error.ok()) {
      tenantfs_store_resumed(health_);
    }
  }

 private:
  const void* health_;
};

}  // namespace

// Same layout as in RocksDB's db/c.cc: a store handle and an options handle. Guarded by
// tests/direct_io.rs: a listener added through the options reports a real full disk, and
// Resume through the handle brings the store back.
struct rocksdb_t {
  DB* rep;
};
struct rocksdb_options_t {
  Options rep;
};

// Same layout as in RocksDB's db/c.cc (guarded by tests through the C API's getters).
struct rocksdb_cache_t {
  std::shared_ptr<Cache> rep;
};

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
  auto base = ROCKSDB_NAMESPACE::FileSystem::Default();
  auto encrypted = ROCKSDB_NAMESPACE::NewEncryptedFS(base, provider);
  if (encrypted == nullptr) {
    return nullptr;
  }
  auto fs = tenantfs::NewPipelinedWriteFs(std::move(encrypted), std::move(base), provider);
  std::unique_ptr<Env> env = ROCKSDB_NAMESPACE::NewCompositeEnv(fs);
  return new rocksdb_env_t{env.release(), false};
}

// Used by the layout test: the Env* this wrapper holds.
const void* tenantfs_env_rep(const rocksdb_env_t* env) { return env->rep; }

size_t tenantfs_env_wrapper_size() { return sizeof(rocksdb_env_t); }

size_t tenantfs_prefix_length() { return kPrefixLength; }

// An LRU cache whose blocks live in slab memory. Takes one count of `slabs` (released when
// RocksDB drops the allocator, after the last block is freed). Free with rocksdb_cache_destroy.
rocksdb_cache_t* tenantfs_lru_cache_new(size_t capacity, int num_shard_bits,
                                        const void* slabs) {
  auto allocator = std::make_shared<SlabMemoryAllocator>(slabs);
  LRUCacheOptions opts;
  opts.capacity = capacity;
  opts.num_shard_bits = num_shard_bits;
  opts.memory_allocator = allocator;
  std::shared_ptr<Cache> lru = opts.MakeSharedCache();
  auto counters = std::make_shared<CacheCounters>();
  lru->SetEvictionCallback([counters](const Slice&, Cache::Handle*, bool) {
    counters->evictions.fetch_add(1, std::memory_order_relaxed);
    return false;  // the cache frees the block as usual
  });
  return new rocksdb_cache_t{
      std::make_shared<CountingCache>(std::move(lru), std::move(allocator),
                                      std::move(counters))};
}

// Misses of every counting cache on the calling thread since it started.
uint64_t tenantfs_cache_thread_misses() { return thread_misses; }

// hits, misses, evictions of a cache made by tenantfs_lru_cache_new.
void tenantfs_lru_cache_counters(const rocksdb_cache_t* cache, uint64_t* out) {
  const auto& c = static_cast<const CountingCache*>(cache->rep.get())->counters();
  out[0] = c.hits.load(std::memory_order_relaxed);
  out[1] = c.misses.load(std::memory_order_relaxed);
  out[2] = c.evictions.load(std::memory_order_relaxed);
}

// Inserts a copy of data[0..len) under key; returns 0 on success.
int tenantfs_cache_raw_insert(const rocksdb_cache_t* cache, const char* key,
                              size_t key_len, const char* data, size_t len) {
  MemoryAllocator* a = cache->rep->memory_allocator();
  auto* e = new RawEntry{
      static_cast<char*>(a != nullptr ? a->Allocate(len) : std::malloc(len)),
      len};
  std::memcpy(e->data, data, len);
  size_t charge =
      (a != nullptr ? a->UsableSize(e->data, len) : len) + sizeof(RawEntry);
  Status s = cache->rep->Insert(Slice(key, key_len), e, &kRawEntryHelper,
                                charge);
  return s.ok() ? 0 : -1;
}

// Looks a raw entry up; on a hit returns the handle (release it with
// tenantfs_cache_raw_release) and sets *data and *len to its bytes.
void* tenantfs_cache_raw_lookup(const rocksdb_cache_t* cache, const char* key,
                                size_t key_len, const char** data,
                                size_t* len) {
  auto* counting = static_cast<CountingCache*>(cache->rep.get());
  Cache::Handle* h = counting->RawLookup(Slice(key, key_len));
  if (h == nullptr) {
    return nullptr;
  }
  const auto* e = static_cast<const RawEntry*>(cache->rep->Value(h));
  *data = e->data;
  *len = e->len;
  return h;
}

void tenantfs_cache_raw_release(const rocksdb_cache_t* cache, void* handle) {
  cache->rep->Release(static_cast<Cache::Handle*>(handle));
}

// Drops the entry under key, if any (a reader holding it keeps it until released).
void tenantfs_cache_raw_erase(const rocksdb_cache_t* cache, const char* key,
                             size_t key_len) {
  cache->rep->Erase(Slice(key, key_len));
}

// Adds a health listener to `opts`; takes one count of `health`, released with the listener.
void tenantfs_options_add_health_listener(rocksdb_options_t* opts,
                                          const void* health) {
  opts->rep.listeners.push_back(std::make_shared<HealthListener>(health));
}

// DB::Resume: NULL when the store takes writes, else the error (free it with free()).
char* tenantfs_db_resume(rocksdb_t* db) {
  Status s = db->rep->Resume();
  return s.ok() ? nullptr : strdup(s.ToString().c_str());
}

// Writes the store's IDENTITY file again, through its Env (so under the ring's writing key),
// as RocksDB writes it at creation: a temporary file synced, renamed over it, the directory
// synced. RocksDB never writes it again by itself. Returns the error (free it with free()).
char* tenantfs_db_rewrite_identity(rocksdb_t* db) {
  DB* d = db->rep;
  std::string id;
  Status s = d->GetDbIdentity(id);
  if (s.ok()) {
    s = ROCKSDB_NAMESPACE::SetIdentityFile(ROCKSDB_NAMESPACE::WriteOptions(), d->GetEnv(),
                                           d->GetName(),
                                           ROCKSDB_NAMESPACE::Temperature::kUnknown, id);
  }
  return s.ok() ? nullptr : strdup(s.ToString().c_str());
}

// Writes the store's OPTIONS file again, twice (RocksDB keeps the newest two): none written
// under an older key is left. RocksDB writes it only when an option changes: the LOG's stats
// period goes one second up and back (tenantfs sets it nowhere else; a dump of stats to the
// LOG is all it does).
char* tenantfs_db_rewrite_options(rocksdb_t* db) {
  DB* d = db->rep;
  const unsigned int period = d->GetDBOptions().stats_dump_period_sec;
  for (unsigned int value : {period + 1, period}) {
    Status s = d->SetDBOptions({{"stats_dump_period_sec", std::to_string(value)}});
    if (!s.ok()) return strdup(s.ToString().c_str());
  }
  return nullptr;
}

// The store's max_manifest_file_size now (a key rotation lowers it until a flush completes).
uint64_t tenantfs_db_max_manifest_file_size(rocksdb_t* db) {
  return db->rep->GetDBOptions().max_manifest_file_size;
}

// The number of the MANIFEST the store appends to now; 0 if it cannot be told.
uint64_t tenantfs_db_manifest_number(rocksdb_t* db) {
  std::vector<std::string> files;
  uint64_t size = 0;
  if (!db->rep->GetLiveFiles(files, &size, /*flush_memtable=*/false).ok()) return 0;
  for (const std::string& f : files) {
    if (f.rfind("/MANIFEST-", 0) == 0) return strtoull(f.c_str() + 10, nullptr, 10);
  }
  return 0;
}

// Deletes blob files that no version of the store references: the partial output of a flush
// or compaction killed before it finished. RocksDB 11.8 keeps any blob file without a footer
// on purge (it could be an in-flight direct-write file), so these would stay forever. Background
// work is paused meanwhile, so no running job can own an unreferenced file. Returns the number
// of files deleted and adds their bytes to *bytes; -1 when the store could not be listed (the
// error in *err, free it with free()).
int tenantfs_db_delete_orphan_blob_files(rocksdb_t* db, uint64_t* bytes, char** err) {
  DB* d = db->rep;
  Status s = d->PauseBackgroundWork();
  if (!s.ok()) {
    *err = strdup(s.ToString().c_str());
    return -1;
  }
  std::vector<ROCKSDB_NAMESPACE::ColumnFamilyMetaData> metas;
  d->GetAllColumnFamilyMetaData(&metas);
  std::set<uint64_t> live;
  for (const auto& m : metas) {
    for (const auto& b : m.blob_files) {
      live.insert(b.blob_file_number);
    }
  }
  const std::string dir = d->GetName();
  std::vector<std::string> names;
  s = d->GetEnv()->GetChildren(dir, &names);
  int deleted = 0;
  if (s.ok()) {
    for (const auto& name : names) {
      const size_t dot = name.find(".blob");
      if (dot == std::string::npos || dot + 5 != name.size() || dot == 0 ||
          name.find_first_not_of("0123456789") != dot) {
        continue;
      }
      const uint64_t number = std::strtoull(name.c_str(), nullptr, 10);
      if (live.count(number) != 0) {
        continue;
      }
      const std::string path = dir + "/" + name;
      uint64_t size = 0;
      if (d->GetEnv()->GetFileSize(path, &size).ok() && d->GetEnv()->DeleteFile(path).ok()) {
        *bytes += size;
        deleted++;
      }
    }
  }
  Status resumed = d->ContinueBackgroundWork();
  if (!s.ok() || !resumed.ok()) {
    *err = strdup((s.ok() ? resumed : s).ToString().c_str());
    return -1;
  }
  return deleted;
}

// `cache` as a BlobCacheKeys, with the DB id and session of `db` (null if it is not one, or
// the DB does not say them).
static BlobCacheKeys* BlobCacheKeysOf(const rocksdb_cache_t* cache, rocksdb_t* db,
                                      std::string* id, std::string* session) {
  auto* keys = dynamic_cast<BlobCacheKeys*>(cache->rep.get());
  if (keys == nullptr || !db->rep->GetDbIdentity(*id).ok() ||
      !db->rep->GetDbSessionId(*session).ok()) {
    return nullptr;
  }
  return keys;
}

// A store's blob cache over `host` (a cache tenantfs_lru_cache_new made), keyed by the files'
// ids in `ids`: takes that count of `ids` (released when RocksDB drops the cache), or returns
// null (the count stays the caller's) if `host` is not such a cache. Free the handle with
// rocksdb_cache_destroy once the store's options hold it.
rocksdb_cache_t* tenantfs_blob_cache_new(const rocksdb_cache_t* host, const void* ids) {
  auto* counting = dynamic_cast<CountingCache*>(host->rep.get());
  if (counting == nullptr) {
    return nullptr;
  }
  return new rocksdb_cache_t{
      std::make_shared<BlobCacheKeys>(host->rep, counting->allocator(), ids)};
}

// Starts `cache`'s file keys for the session of `db` (opened with it as its blob cache): 1 if
// they are, 0 if RocksDB's keys are not of the shape BlobCacheKeys knows (values are then
// cached for this session alone).
int tenantfs_blob_cache_start(const rocksdb_cache_t* cache, rocksdb_t* db) {
  std::string id;
  std::string session;
  auto* keys = BlobCacheKeysOf(cache, db, &id, &session);
  if (keys == nullptr) {
    return 0;
  }
  return keys->Start(id, session) ? 1 : 0;
}

// For the test of the key shape: writes into `out` (28 bytes) the key `cache` asks the host
// cache for in place of RocksDB's key of blob file `number` at `offset` in `db`'s session;
// returns its length (16: unchanged, RocksDB's own key).
size_t tenantfs_blob_cache_key_for(const rocksdb_cache_t* cache, rocksdb_t* db,
                                   uint64_t number, uint64_t offset, char* out) {
  std::string id;
  std::string session;
  auto* keys = BlobCacheKeysOf(cache, db, &id, &session);
  if (keys == nullptr) {
    return 0;
  }
  using ROCKSDB_NAMESPACE::OffsetableCacheKey;
  const auto rocks = OffsetableCacheKey(id, session, number).WithOffset(offset);
  const std::string key = keys->KeyFor(rocks.AsSlice());
  std::memcpy(out, key.data(), std::min(key.size(), size_t{BlobCacheKeys::kKeyLength}));
  return key.size();
}

// Used by the layout test: whether the cache's blocks are allocated by the slab allocator.
int tenantfs_cache_uses_slabs(const rocksdb_cache_t* cache) {
  auto* a = cache->rep->memory_allocator();
  return a != nullptr && std::strcmp(a->Name(), "TenantfsSlabAllocator") == 0;
}
}
