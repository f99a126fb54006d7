// Host memory behind tensors: 64-byte aligned blocks from a caching allocator, so a loop that
// allocates same-sized outputs reuses memory whose pages are already mapped (a fresh 64 MB block
// costs more in page faults than an elementwise kernel over it).
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "device_queue.hpp"

namespace opforge {

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;     // requested
  size_t capacity = 0;  // of the block, a size class
  ~Storage();
  static std::shared_ptr<Storage> allocate(size_t bytes);

  // ---- ordering of asynchronous work (device_queue.hpp) ----
  // Adds to `deps` the events a call must wait for before it reads (or writes) this memory: the
  // last writer (whose failure a read inherits), and for a write also the readers since.
  void dependencies(std::vector<detail::Dependency>& deps, bool write) const;
  // Records a submitted call's event as the last writer or as one more reader.
  void record(const detail::EventPtr& ev, bool write);
  // A call on the caller's thread has overwritten this memory: earlier events no longer matter.
  void written_in_place();
  // Waits for every pending call that uses this memory (before the host reads or writes it);
  // throws the Error of the call that last wrote it, if that failed.
  void sync() const;

 private:
  mutable std::mutex mu_;
  std::atomic<bool> tracked_{false};  // any event recorded yet: until then nothing to lock
  detail::EventPtr writer_;
  std::vector<detail::EventPtr> readers_;
};

// Returns every cached block to the system.
void release_cached_memory();
// Bytes held in the cache (not in use by any tensor).
size_t cached_memory_bytes();

}  // namespace opforge
