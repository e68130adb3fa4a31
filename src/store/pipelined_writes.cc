// Encrypted direct writes that overlap the disk with the writer.
//
// Used only for files that RocksDB opens with the contract that nothing reads, reopens or
// truncates them while they are open for write (FileOpenContract: flush and compaction
// outputs); other files are written as RocksDB's EncryptedFileSystem writes them.
//
// Why: a memtable flush writes its blob file (the file data of 64 MiB of writes) in 1 MiB
// aligned pieces, and RocksDB's EncryptedWritableFile encrypts each piece into a fresh buffer
// and then waits for its O_DIRECT write before the flush may build the next one: the flush
// thread alternated between the CPU (encrypting, checksumming) and the disk, and a writer that
// filled the next memtable meanwhile stopped until the flush ended. Here each piece is
// encrypted into one of a few reused aligned buffers and written by a thread of the file's
// own, in order, while the flush goes on; the file's size, truncate, sync and close wait for
// the writes handed over before them, and a write that failed is reported by the next call on
// the file (at the latest the sync or close that RocksDB checks before it uses the file).
//
// The bytes on disk are those RocksDB's EncryptedFileSystem writes (the provider's prefix,
// then the body under the provider's cipher at the same offsets): that file system reads them.

#include "pipelined_writes.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using ROCKSDB_NAMESPACE::BlockAccessCipherStream;
using ROCKSDB_NAMESPACE::EncryptionProvider;
using ROCKSDB_NAMESPACE::Env;
using ROCKSDB_NAMESPACE::FileOptions;
using ROCKSDB_NAMESPACE::FileSystem;
using ROCKSDB_NAMESPACE::FileSystemWrapper;
using ROCKSDB_NAMESPACE::FSWritableFile;
using ROCKSDB_NAMESPACE::IODebugContext;
using ROCKSDB_NAMESPACE::IOOptions;
using ROCKSDB_NAMESPACE::IOStatus;
using ROCKSDB_NAMESPACE::Slice;

// Whether a tenant waited on the disk lately; holds a write while a WAL sync runs
// (src/store/foreground.rs).
extern "C" int32_t tenantfs_foreground_io_recent();
extern "C" void tenantfs_hold_for_syncs();

namespace tenantfs {
namespace {

// Files written through the pipeline since the process started (for tests).
std::atomic<uint64_t> pipelined_files{0};

// Pieces handed over and not yet written, per file: the one on the disk and two more. With
// 1 MiB pieces (RocksDB's writable_file_max_buffer_size) a file holds at most 3 MiB.
constexpr size_t kDepth = 3;
// Extent files (`.ext`, see extent_files.cc) are written from a FUSE request that returns once
// its bytes are handed over: 8 pieces of 1 MiB let the disk take one request while the next
// ones are encrypted.
constexpr size_t kExtentDepth = 8;
// The most one write to the disk carries while a tenant waits on the disk (src/store/
// foreground.rs): its 4 KiB read or its sync waits behind the write. Measured on this host's
// virtio disk (fio, host ext4, O_DIRECT): a QD1 reader kept 3.8-4.4k IOPS (p99 690-820 us) of
// its 12.2k beside 1 MiB writes and 9.0-9.5k (p99 230-260 us) beside 256 KiB writes, whose
// writer was faster too (1.60-1.64 GB/s against 1.32-1.52); 128 KiB writes cost the writer a
// third. Alone, a streaming writer through the daemon loses 19% to 256 KiB writes.
constexpr size_t kDiskWrite = 256 << 10;

// An aligned buffer owned by one file.
struct Buffer {
  char* data = nullptr;
  size_t capacity = 0;
};

Buffer AllocateBuffer(size_t size, size_t alignment) {
  Buffer b;
  size_t capacity = (size + alignment - 1) / alignment * alignment;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, capacity) == 0) {
    b.data = static_cast<char*>(p);
    b.capacity = capacity;
  }
  return b;
}

class PipelinedEncryptedFile final : public FSWritableFile {
 public:
  PipelinedEncryptedFile(std::unique_ptr<FSWritableFile> file,
                         std::unique_ptr<BlockAccessCipherStream> stream,
                         size_t prefix_length, size_t depth)
      : file_(std::move(file)),
        stream_(std::move(stream)),
        prefix_(prefix_length),
        depth_(depth),
        alignment_(std::max<size_t>(file_->GetRequiredBufferAlignment(), 4096)) {}

  ~PipelinedEncryptedFile() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) {
      worker_.join();  // writes what was handed over first: Close may not have been called
    }
    for (Buffer& b : free_) {
      free(b.data);
    }
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions&,
                            IODebugContext*) override {
    if (data.size() == 0) {
      return Error();
    }
    offset += prefix_;
    Buffer buf;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return queue_.size() < depth_; });
      if (!error_.ok()) {
        return error_;
      }
      while (!free_.empty() && buf.data == nullptr) {
        Buffer b = free_.back();
        free_.pop_back();
        if (b.capacity >= data.size()) {
          buf = b;
        } else {
          free(b.data);
        }
      }
    }
    if (buf.data == nullptr) {
      buf = AllocateBuffer(data.size(), alignment_);
      if (buf.data == nullptr) {
        return IOStatus::NoSpace("tenantfs: no memory for a write buffer");
      }
    }
    memcpy(buf.data, data.data(), data.size());
    auto s = stream_->Encrypt(offset, buf.data, data.size());
    if (!s.ok()) {
      std::unique_lock<std::mutex> lock(mu_);
      free_.push_back(buf);
      return IOStatus::IOError(s.ToString());
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_.push_back(Piece{buf, data.size(), offset});
      if (!worker_.joinable()) {
        worker_ = std::thread([this] { Run(); });
      }
    }
    cv_.notify_all();
    return IOStatus::OK();
  }

  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const ROCKSDB_NAMESPACE::DataVerificationInfo&,
                            IODebugContext* dbg) override {
    return PositionedAppend(data, offset, options, dbg);
  }

  // Buffered appends are not how RocksDB writes a direct file; if one comes, it goes after
  // everything handed over, encrypted at the file's end as EncryptedWritableFile does.
  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = Drain();
    if (!s.ok() || data.size() == 0) {
      return s;
    }
    uint64_t offset = file_->GetFileSize(options, dbg);
    Buffer buf = AllocateBuffer(data.size(), alignment_);
    if (buf.data == nullptr) {
      return IOStatus::NoSpace("tenantfs: no memory for a write buffer");
    }
    memcpy(buf.data, data.data(), data.size());
    auto e = stream_->Encrypt(offset, buf.data, data.size());
    s = e.ok() ? file_->Append(Slice(buf.data, data.size()), options, dbg)
               : IOStatus::IOError(e.ToString());
    free(buf.data);
    return s;
  }

  IOStatus Append(const Slice& data, const IOOptions& options,
                  const ROCKSDB_NAMESPACE::DataVerificationInfo&, IODebugContext* dbg) override {
    return Append(data, options, dbg);
  }

  IOStatus Truncate(uint64_t size, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = Drain();
    return s.ok() ? file_->Truncate(size + prefix_, options, dbg) : s;
  }
  IOStatus Close(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = Drain();
    IOStatus c = file_->Close(options, dbg);
    return s.ok() ? c : s;
  }
  // A direct file has no buffered bytes to flush (the posix file's Flush does nothing); this
  // must not wait, or RocksDB's flush after each piece would undo the overlap.
  IOStatus Flush(const IOOptions&, IODebugContext*) override { return Error(); }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = Drain();
    return s.ok() ? file_->Sync(options, dbg) : s;
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = Drain();
    return s.ok() ? file_->Fsync(options, dbg) : s;
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    IOStatus s = Drain();
    return s.ok() ? file_->RangeSync(offset + prefix_, nbytes, options, dbg) : s;
  }
  bool IsSyncThreadSafe() const override { return false; }
  bool use_direct_io() const override { return file_->use_direct_io(); }
  size_t GetRequiredBufferAlignment() const override {
    return file_->GetRequiredBufferAlignment();
  }
  void SetWriteLifeTimeHint(Env::WriteLifeTimeHint hint) override {
    file_->SetWriteLifeTimeHint(hint);
  }
  uint64_t GetFileSize(const IOOptions& options, IODebugContext* dbg) override {
    Drain();
    return file_->GetFileSize(options, dbg) - prefix_;
  }
  void SetPreallocationBlockSize(size_t size) override { file_->SetPreallocationBlockSize(size); }
  void GetPreallocationStatus(size_t* block_size, size_t* last_allocated_block) override {
    file_->GetPreallocationStatus(block_size, last_allocated_block);
  }
  size_t GetUniqueId(char* id, size_t max_size) const override {
    return file_->GetUniqueId(id, max_size);
  }
  IOStatus InvalidateCache(size_t offset, size_t length) override {
    return file_->InvalidateCache(offset + prefix_, length);
  }
  // Preallocation (fallocate) touches no state the writer thread uses; no wait.
  void PrepareWrite(size_t offset, size_t len, const IOOptions& options,
                    IODebugContext* dbg) override {
    file_->PrepareWrite(offset + prefix_, len, options, dbg);
  }
  IOStatus Allocate(uint64_t offset, uint64_t len, const IOOptions& options,
                    IODebugContext* dbg) override {
    return file_->Allocate(offset + prefix_, len, options, dbg);
  }

 private:
  struct Piece {
    Buffer buf;
    size_t size;
    uint64_t offset;  // in the file, prefix included
  };

  // The writer thread: writes the pieces in the order they came (a direct file rewrites its
  // last partial page with the next piece, so order matters), each left queued until written.
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;
      }
      Piece p = queue_.front();
      bool failed = !error_.ok();
      lock.unlock();
      IOStatus s;
      // Nothing is written after a failed write. While a tenant waits on the disk, a piece
      // goes in writes of at most kDiskWrite (aligned: the buffer, the offset and kDiskWrite
      // are), else whole.
      for (size_t at = 0; !failed && at < p.size;) {
        tenantfs_hold_for_syncs();
        size_t n = tenantfs_foreground_io_recent() != 0 ? std::min(kDiskWrite, p.size - at)
                                                        : p.size - at;
        s = file_->PositionedAppend(Slice(p.buf.data + at, n), p.offset + at, IOOptions(), nullptr);
        failed = !s.ok();
        at += n;
      }
      lock.lock();
      queue_.pop_front();
      if (!s.ok() && error_.ok()) {
        error_ = s;
      }
      free_.push_back(p.buf);
      cv_.notify_all();
    }
  }

  // Waits until every piece handed over is written; the first failure, if any.
  IOStatus Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty(); });
    return error_;
  }

  IOStatus Error() {
    std::unique_lock<std::mutex> lock(mu_);
    return error_;
  }

  std::unique_ptr<FSWritableFile> file_;
  std::unique_ptr<BlockAccessCipherStream> stream_;
  const size_t prefix_;
  const size_t depth_;
  const size_t alignment_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;   // handed over, not yet written (the front is being written)
  std::vector<Buffer> free_;  // buffers of written pieces, reused
  IOStatus error_;
  bool stop_ = false;
  std::thread worker_;
};

class PipelinedWriteFs final : public FileSystemWrapper {
 public:
  PipelinedWriteFs(std::shared_ptr<FileSystem> encrypted, std::shared_ptr<FileSystem> base,
                   std::shared_ptr<EncryptionProvider> provider)
      : FileSystemWrapper(std::move(encrypted)),
        base_(std::move(base)),
        provider_(std::move(provider)) {}

  const char* Name() const override { return "TenantfsPipelinedWriteFs"; }

  // A file at the filesystem's link limit (EMLINK: 65,000 links on ext4, which a base's
  // template reaches when every tenant of the base, their snapshots and forks link it)
  // cannot be linked again: "not supported" makes RocksDB's checkpoint copy it, and the
  // files after it, instead (through this file system: decrypted, sealed again).
  IOStatus LinkFile(const std::string& src, const std::string& dst, const IOOptions& options,
                    IODebugContext* dbg) override {
    IOStatus s = target()->LinkFile(src, dst, options, dbg);
    if (!s.ok() && s.ToString().find(std::strerror(EMLINK)) != std::string::npos) {
      return IOStatus::NotSupported("at the link limit, copied instead: " + src);
    }
    return s;
  }

  IOStatus NewWritableFile(const std::string& fname, const FileOptions& options,
                           std::unique_ptr<FSWritableFile>* result,
                           IODebugContext* dbg) override {
    if (!Pipelined(options)) {
      return target()->NewWritableFile(fname, options, result, dbg);
    }
    std::unique_ptr<FSWritableFile> file;
    IOStatus s = base_->NewWritableFile(fname, options, &file, dbg);
    if (!s.ok()) {
      return s;
    }
    return Wrap(fname, options, std::move(file), result, dbg);
  }

  // `old_fname` renamed to `fname` and written from its start (its old bytes are not
  // truncated away, so the file system frees and discards nothing): what extent files
  // recycle (extent_files.cc). Pipelined on the same terms as a new file.
  IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                             const FileOptions& options,
                             std::unique_ptr<FSWritableFile>* result,
                             IODebugContext* dbg) override {
    if (!Pipelined(options)) {
      return target()->ReuseWritableFile(fname, old_fname, options, result, dbg);
    }
    std::unique_ptr<FSWritableFile> file;
    IOStatus s = base_->ReuseWritableFile(fname, old_fname, options, &file, dbg);
    if (!s.ok()) {
      return s;
    }
    return Wrap(fname, options, std::move(file), result, dbg);
  }

 private:
  // Only files RocksDB promises not to read, reopen or truncate while they are open for
  // write (flush and compaction outputs, blob files built by them, SST file writers; and
  // extent files, read only where they were waited for): a piece handed to the writer
  // thread is not yet in the file. Anything else (WAL, MANIFEST, blob direct-write files,
  // which RocksDB reads while writing) goes to `encrypted` as before.
  static bool Pipelined(const FileOptions& options) {
    using ROCKSDB_NAMESPACE::FileOpenContract;
    const auto contract =
        FileOpenContract::kNoReopenForWrite | FileOpenContract::kNoReadersWhileOpenForWrite;
    return options.use_direct_writes && !options.use_mmap_writes &&
           ROCKSDB_NAMESPACE::HasFileOpenContract(options.open_contract, contract);
  }

  // Writes the prefix into `file` (opened by `base_`) and puts the pipeline over it.
  IOStatus Wrap(const std::string& fname, const FileOptions& options,
                std::unique_ptr<FSWritableFile> file, std::unique_ptr<FSWritableFile>* result,
                IODebugContext* dbg) {
    // The prefix, as EncryptedFileSystem writes it: made by the provider, the file's first
    // bytes, in plaintext (it holds the file's key sealed under the tenant key).
    size_t length = provider_->GetPrefixLength();
    size_t alignment = std::max<size_t>(file->GetRequiredBufferAlignment(), 4096);
    Buffer prefix = AllocateBuffer(length, alignment);
    if (prefix.data == nullptr) {
      return IOStatus::NoSpace("tenantfs: no memory for a file header");
    }
    IOStatus io = IOStatus::OK();
    auto made = provider_->CreateNewPrefix(fname, prefix.data, length);
    if (!made.ok()) {
      io = IOStatus::IOError(made.ToString());
    } else {
      io = file->Append(Slice(prefix.data, length), options.io_options, dbg);
    }
    std::unique_ptr<BlockAccessCipherStream> stream;
    if (io.ok()) {
      Slice header(prefix.data, length);
      auto opened = provider_->CreateCipherStream(fname, options, header, &stream);
      if (!opened.ok()) {
        io = IOStatus::IOError(opened.ToString());
      }
    }
    free(prefix.data);
    if (!io.ok()) {
      return io;
    }
    bool extent = fname.size() > 4 && fname.compare(fname.size() - 4, 4, ".ext") == 0;
    result->reset(new PipelinedEncryptedFile(std::move(file), std::move(stream), length,
                                             extent ? kExtentDepth : kDepth));
    pipelined_files.fetch_add(1, std::memory_order_relaxed);
    return IOStatus::OK();
  }

  std::shared_ptr<FileSystem> base_;
  std::shared_ptr<EncryptionProvider> provider_;
};

}  // namespace

std::shared_ptr<FileSystem> NewPipelinedWriteFs(std::shared_ptr<FileSystem> encrypted,
                                                std::shared_ptr<FileSystem> base,
                                                std::shared_ptr<EncryptionProvider> provider) {
  return std::make_shared<PipelinedWriteFs>(std::move(encrypted), std::move(base),
                                            std::move(provider));
}

}  // namespace tenantfs

extern "C" uint64_t tenantfs_pipelined_files() {
  return tenantfs::pipelined_files.load(std::memory_order_relaxed);
}
