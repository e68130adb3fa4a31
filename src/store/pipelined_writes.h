// Encrypted direct writes that overlap the disk with the writer (see pipelined_writes.cc).
#pragma once

#include <memory>

#include "rocksdb/env_encryption.h"
#include "rocksdb/file_system.h"

namespace tenantfs {

// A file system over `encrypted` (RocksDB's EncryptedFileSystem over `base` with `provider`)
// that writes the files RocksDB opens for direct writes (flush and compaction outputs: SST and
// blob files) itself: same prefix, same cipher, same bytes on disk, but each aligned piece is
// encrypted into a buffer of its own and handed to a writer thread, so that the flush encrypts
// the next piece while the disk takes the last. Everything else goes to `encrypted`.
std::shared_ptr<ROCKSDB_NAMESPACE::FileSystem> NewPipelinedWriteFs(
    std::shared_ptr<ROCKSDB_NAMESPACE::FileSystem> encrypted,
    std::shared_ptr<ROCKSDB_NAMESPACE::FileSystem> base,
    std::shared_ptr<ROCKSDB_NAMESPACE::EncryptionProvider> provider);

}  // namespace tenantfs
