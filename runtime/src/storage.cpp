// The caching host allocator. Blocks are bucketed by size class; freed blocks wait in the cache up
// to a limit. An allocation that fails releases the cache and retries before raising
// OutOfMemoryError.
#include "storage.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "opforge/error.hpp"

namespace opforge {
namespace {

constexpr size_t kCacheLimit = size_t(1) << 30;

// Powers of two up to 1 MiB, then whole MiB: at most 1/16 waste on large blocks.
size_t size_class(size_t bytes) {
  if (bytes <= 64) return 64;
  if (bytes <= (size_t(1) << 20)) {
    size_t c = 64;
    while (c < bytes) c <<= 1;
    return c;
  }
  size_t mib = size_t(1) << 20;
  return (bytes + mib - 1) / mib * mib;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  size_t cached = 0;

  void release_all() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) std::free(p);
    free_blocks.clear();
    cached = 0;
  }
};

// Never destroyed: tensors in static storage may be freed after other statics are gone.
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

}  // namespace

Storage::~Storage() {
  if (!ptr) return;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached + capacity <= kCacheLimit) {
      c.free_blocks[capacity].push_back(ptr);
      c.cached += capacity;
      return;
    }
  }
  std::free(ptr);
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->capacity = size_class(bytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(s->capacity);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      s->ptr = it->second.back();
      it->second.pop_back();
      c.cached -= s->capacity;
      return s;
    }
  }
  s->ptr = std::aligned_alloc(64, s->capacity);
  size_t released = 0;
  if (!s->ptr) {
    released = cached_memory_bytes();
    c.release_all();
    s->ptr = std::aligned_alloc(64, s->capacity);
  }
  if (!s->ptr)
    throw OutOfMemoryError("cpu: out of memory allocating " + std::to_string(bytes) + " bytes (" +
                           std::to_string(released) + " cached bytes were and have been released)");
  return s;
}

void Storage::dependencies(std::vector<detail::Dependency>& deps, bool write) const {
  if (!tracked_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  // A reader inherits the writer's failure even when that is done; an overwrite only waits.
  if (writer_ && (!write || !writer_->done())) deps.push_back({writer_, !write});
  if (write)
    for (const auto& r : readers_)
      if (!r->done()) deps.push_back({r, false});
}

void Storage::written_in_place() {
  if (!tracked_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  writer_.reset();
  readers_.clear();
}

void Storage::record(const detail::EventPtr& ev, bool write) {
  std::lock_guard<std::mutex> lock(mu_);
  tracked_.store(true, std::memory_order_release);
  if (write) {
    writer_ = ev;
    readers_.clear();
    return;
  }
  std::erase_if(readers_, [](const detail::EventPtr& r) { return r->done(); });
  readers_.push_back(ev);
}

void Storage::sync() const {
  if (!tracked_.load(std::memory_order_acquire)) return;
  detail::EventPtr writer;
  std::vector<detail::EventPtr> readers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writer = writer_;
    readers = readers_;
  }
  for (const auto& r : readers) r->wait();  // the host may write next: readers must be done
  if (writer)
    if (const std::string& err = writer->wait(); !err.empty()) throw Error(err);
}

void release_cached_memory() { cache().release_all(); }

size_t cached_memory_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().cached;
}

}  // namespace opforge
