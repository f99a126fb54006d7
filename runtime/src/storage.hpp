// Host memory behind tensors: 64-byte aligned blocks from a caching allocator, so a loop that
// allocates same-sized outputs reuses memory whose pages are already mapped (a fresh 64 MB block
// costs more in page faults than an elementwise kernel over it).
#pragma once
#include <cstddef>
#include <memory>

namespace opforge {

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;     // requested
  size_t capacity = 0;  // of the block, a size class
  ~Storage();
  static std::shared_ptr<Storage> allocate(size_t bytes);
};

// Returns every cached block to the system.
void release_cached_memory();
// Bytes held in the cache (not in use by any tensor).
size_t cached_memory_bytes();

}  // namespace opforge
