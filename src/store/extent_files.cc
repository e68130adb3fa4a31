// Extent files: bulk file data that a tenant store writes beside RocksDB (src/store/extents/).
//
// Why C++: an extent file must be encrypted exactly as the store's own files are (the
// provider's 4 KiB prefix, then the body under the file's cipher), and the store's Env
// (shim.cc: RocksDB's EncryptedFileSystem under the pipelined writer) already does that. So an
// extent file is written through that Env's file system as a flush writes a blob file
// (aligned pieces encrypted into buffers of their own and written in order by the file's own
// thread, see pipelined_writes.cc). The plaintext scan, the key hierarchy and the cipher are
// those of every store file. Reads are in Rust (extent_io.rs), which opens the same header.
//
// The writer's appends are asynchronous: `wait` returns once every append is in the file (or
// the first failure), `sync` also makes it durable. A reader reads only what a `wait` returned
// for, so it never races the writer thread.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"

using ROCKSDB_NAMESPACE::Env;
using ROCKSDB_NAMESPACE::FileOptions;
using ROCKSDB_NAMESPACE::FileSystem;
using ROCKSDB_NAMESPACE::FSWritableFile;
using ROCKSDB_NAMESPACE::IOOptions;
using ROCKSDB_NAMESPACE::IOStatus;
using ROCKSDB_NAMESPACE::Slice;

// Same layout as in RocksDB's db/c.cc (see shim.cc).
struct rocksdb_env_t {
  Env* rep;
  bool is_default;
};

namespace {

// Pieces handed to the writer thread (measured on this VM's disk, O_DIRECT at one write in
// flight into allocated space: 1 MiB 1,939 MiB/s, 256 KiB 1,273).
constexpr size_t kPiece = 1 << 20;

std::shared_ptr<FileSystem> FileSystemOf(const rocksdb_env_t* env) {
  return env != nullptr ? env->rep->GetFileSystem() : FileSystem::Default();
}

// Sets *err to a malloc'd copy of `s`'s message (the caller frees it); returns -1.
int Fail(const IOStatus& s, char** err) {
  *err = strdup(s.ToString().c_str());
  return -1;
}

// Space is reserved ahead of the appends (fallocate) in steps that double with the file, from
// the append's own size up to the writer's `max_step` (at most this much, and the opener's
// share of its file system): a small tenant's file holds little more than its bytes (a 128
// MiB file system must not lose 64 MiB to one 1 MiB write), and what is reserved ahead of the
// bytes stays small beside the host's free-space reserve.
constexpr uint64_t kReserve = 64 << 20;

struct ExtentWriter {
  std::unique_ptr<FSWritableFile> file;
  uint64_t offset = 0;    // bytes appended (after the prefix, which the file system adds)
  uint64_t reserved = 0;  // bytes of the body with disk space reserved
  uint64_t max_step = kReserve;
};

}  // namespace

extern "C" {

// Creates the extent file at `path` (which must not exist) for appends, or, with `reuse` (not
// null), renames the extent file at `reuse` to `path` and writes it from its start under a new
// prefix (a new file key): its blocks are overwritten, not freed and allocated again (on a
// file system mounted with `discard`, freeing a large file stalls writes for a while). Null
// and *err set on failure. `direct`: write with O_DIRECT (and so through the pipelined
// writer).
void* tenantfs_extent_writer_open(const rocksdb_env_t* env, const char* path, const char* reuse,
                                  int direct, uint64_t max_step, char** err) {
  FileOptions options;
  options.use_direct_writes = direct != 0;
  // Reserved space counts in the file's size, so the writes into it do not extend the file
  // (an extending O_DIRECT write holds the inode's lock for its whole I/O and updates the
  // size each time); close trims the file to what was appended.
  options.fallocate_with_keep_size = false;
  // The pipelined writer takes files that nobody reads while they are open for write; an
  // extent file is read only where `wait` said it was written (see the top of this file).
  using ROCKSDB_NAMESPACE::FileOpenContract;
  options.open_contract =
      FileOpenContract::kNoReopenForWrite | FileOpenContract::kNoReadersWhileOpenForWrite;
  auto w = std::make_unique<ExtentWriter>();
  w->max_step = std::max<uint64_t>(1, std::min(kReserve, max_step));
  auto fs = FileSystemOf(env);
  IOStatus s = reuse != nullptr ? fs->ReuseWritableFile(path, reuse, options, &w->file, nullptr)
                                : fs->NewWritableFile(path, options, &w->file, nullptr);
  if (!s.ok()) {
    Fail(s, err);
    return nullptr;
  }
  return w.release();
}

// Appends data[0..len): with O_DIRECT, len is a multiple of 4 KiB. Returns 0, or -1 and *err
// (a failure may also show only at the next wait or sync). The disk space is reserved first,
// so a full disk fails the append here, before anything names its bytes; the writer thread's
// own writes then go into reserved space.
int tenantfs_extent_writer_append(void* writer, const char* data, size_t len, char** err) {
  auto* w = static_cast<ExtentWriter*>(writer);
  IOOptions io;
  if (w->offset + len > w->reserved) {
    uint64_t step = std::max<uint64_t>(len, std::min<uint64_t>(w->max_step, w->reserved));
    IOStatus s = w->file->Allocate(w->reserved, step, io, nullptr);
    if (s.ok()) {
      w->reserved += step;
    }
    if (w->offset + len > w->reserved) {  // near a full disk: just this append's bytes
      s = w->file->Allocate(w->offset, len, io, nullptr);
      if (!s.ok()) {
        return Fail(s, err);
      }
      w->reserved = w->offset + len;
    }
  }
  for (size_t done = 0; done < len;) {
    size_t n = std::min(kPiece, len - done);
    Slice piece(data + done, n);
    IOStatus s = w->file->use_direct_io()
                     ? w->file->PositionedAppend(piece, w->offset, io, nullptr)
                     : w->file->Append(piece, io, nullptr);
    if (!s.ok()) {
      return Fail(s, err);
    }
    w->offset += n;
    done += n;
  }
  return 0;
}

// Waits until every append is in the file; 0, or -1 and *err with the first failure.
int tenantfs_extent_writer_wait(void* writer, char** err) {
  auto* w = static_cast<ExtentWriter*>(writer);
  IOOptions io;
  w->file->GetFileSize(io, nullptr);  // waits for the writer thread
  IOStatus s = w->file->Flush(io, nullptr);  // the first failure, without waiting again
  return s.ok() ? 0 : Fail(s, err);
}

// Waits for every append and makes the file durable (fdatasync).
int tenantfs_extent_writer_sync(void* writer, char** err) {
  auto* w = static_cast<ExtentWriter*>(writer);
  IOStatus s = w->file->Sync(IOOptions(), nullptr);
  return s.ok() ? 0 : Fail(s, err);
}

// Waits for every append, trims the file to them (space reserved ahead, or the old bytes of a
// reused file, go), closes it and frees the writer (also on failure).
int tenantfs_extent_writer_close(void* writer, char** err) {
  std::unique_ptr<ExtentWriter> w(static_cast<ExtentWriter*>(writer));
  IOStatus t = w->file->Truncate(w->offset, IOOptions(), nullptr);
  IOStatus s = w->file->Close(IOOptions(), nullptr);
  if (!t.ok()) {
    return Fail(t, err);
  }
  return s.ok() ? 0 : Fail(s, err);
}

}
