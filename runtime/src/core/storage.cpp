// The caching host allocator (blocks bucketed by size class; freed blocks wait in the cache up to a
// limit; an allocation that fails releases the cache and retries before raising OutOfMemoryError),
// the copies a storage keeps on GPU devices, and the ordering of the calls that use it.
#include "core/storage.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/host_caps.hpp"
#include "devices/gpu_memory.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace {

constexpr size_t kCacheLimit = size_t(1) << 30;

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

// A few freed small blocks per size class kept by each thread, so that a loop of small ops takes
// no lock another thread's ops take. Blocks go back to the shared cache when the thread ends.
constexpr size_t kThreadClasses = 11;  // 64 B ... 64 KiB, the small power-of-two classes
constexpr int kThreadBlocks = 4;
// The class of a block of `capacity` bytes (a size class: 64 << k), -1 beyond the small ones.
int thread_class(size_t capacity) {
  if (capacity > (size_t(64) << (kThreadClasses - 1))) return -1;
  return __builtin_ctzll(capacity) - 6;
}
void host_free_shared(void* p, size_t capacity);
struct ThreadBlocks {
  void* blocks[kThreadClasses][kThreadBlocks] = {};
  int count[kThreadClasses] = {};
  ~ThreadBlocks() {
    for (size_t c = 0; c < kThreadClasses; c++)
      for (int i = 0; i < count[c]; i++) host_free_shared(blocks[c][i], size_t(64) << c);
  }
};
thread_local ThreadBlocks thread_blocks;

void* host_alloc(size_t capacity) {
  if (int k = thread_class(capacity); k >= 0 && thread_blocks.count[k] > 0)
    return thread_blocks.blocks[k][--thread_blocks.count[k]];
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(capacity);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= capacity;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, capacity);
  size_t released = 0;
  if (!p) {
    released = cached_memory_bytes();
    c.release_all();
    p = std::aligned_alloc(64, capacity);
  }
  if (!p)
    throw OutOfMemoryError("cpu: out of memory allocating " + std::to_string(capacity) +
                           " bytes (" + std::to_string(released) +
                           " cached bytes were and have been released)");
  return p;
}

void host_free(void* p, size_t capacity) {
  if (int k = thread_class(capacity); k >= 0 && thread_blocks.count[k] < kThreadBlocks) {
    thread_blocks.blocks[k][thread_blocks.count[k]++] = p;
    return;
  }
  host_free_shared(p, capacity);
}

void host_free_shared(void* p, size_t capacity) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached + capacity <= kCacheLimit) {
      c.free_blocks[capacity].push_back(p);
      c.cached += capacity;
      return;
    }
  }
  std::free(p);
}

}  // namespace

// Powers of two up to 1 MiB, then whole MiB: at most 1/16 waste on large blocks.
size_t detail::size_class(size_t bytes) {
  if (bytes <= 64) return 64;
  if (bytes <= (size_t(1) << 20)) {
    size_t c = 64;
    while (c < bytes) c <<= 1;
    return c;
  }
  size_t mib = size_t(1) << 20;
  return (bytes + mib - 1) / mib * mib;
}

Storage::~Storage() {
  // A storage that never had a GPU copy is known to no device memory (nothing can evict it), so
  // the common host-only case takes no lock.
  if (on_gpus()) {
    {
      // Held while forgetting: an eviction running meanwhile skips this storage (it only tries).
      std::lock_guard<std::mutex> lock(data_mu_);
      for (const Copy& c : copies_) c.mem->forget(this);
    }
    for (const Copy& c : copies_) c.mem->release(c.block);
  }
  if (void* p = ptr.load()) host_free(p, capacity);
  if (charged_to >= 0) detail::uncharge_host_allocation(charged_to, capacity);
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->capacity = detail::size_class(bytes);
  s->charged_to = detail::charge_host_allocation(s->capacity);
  s->ptr = host_alloc(s->capacity);
  return s;
}

Device Storage::home() const {
  if (!on_gpus()) return {};
  std::lock_guard<std::mutex> lock(data_mu_);
  return home_;
}

bool Storage::adopt_home(const Device& d) {
  std::lock_guard<std::mutex> lock(data_mu_);
  if (home_ == d) return true;
  // A queued call may still read its host block.
  if (written_.load(std::memory_order_acquire) || tracked_.load(std::memory_order_acquire))
    return false;
  home_ = d;
  if (void* p = ptr.exchange(nullptr)) host_free(p, capacity);
  host_valid_ = false;
  on_gpus_.store(true, std::memory_order_release);
  return true;
}

Storage::Copy* Storage::copy_on(const detail::DeviceMemory* mem) {
  for (Copy& c : copies_)
    if (c.mem == mem) return &c;
  return nullptr;
}

void* Storage::host_block() {
  if (!ptr.load()) {
    capacity = detail::size_class(bytes);
    ptr = host_alloc(capacity);
  }
  return ptr;
}

void* Storage::host_current() {
  if (!on_gpus()) return ptr;
  std::lock_guard<std::mutex> lock(data_mu_);
  host_block();
  if (!host_valid_) {
    for (const Copy& c : copies_)
      if (c.valid) {
        c.mem->download(*c.block, ptr, bytes);
        break;
      }
    host_valid_ = true;  // with no valid copy anywhere, nothing was ever written
  }
  return ptr;
}

void Storage::host_written() {
  written_.store(true, std::memory_order_release);
  if (!on_gpus()) return;
  std::lock_guard<std::mutex> lock(data_mu_);
  host_block();
  host_valid_ = true;
  for (Copy& c : copies_) c.valid = false;
}

detail::DeviceBlock& Storage::device_current(detail::DeviceMemory& mem, bool overwrite, bool pin) {
  std::lock_guard<std::mutex> lock(data_mu_);
  on_gpus_.store(true, std::memory_order_release);
  Copy* mine = copy_on(&mem);
  if (!mine) {
    detail::DeviceBlock* block = mem.allocate(bytes, this);
    copies_.push_back({&mem, block, false, 0});
    mine = &copies_.back();
  }
  mem.remember(this);
  if (pin) mine->pins++;
  if (mine->valid || overwrite) return *mine->block;
  if (!host_valid_) {
    // Valid only on another device: through the host (one API's runtime cannot reach another's).
    for (const Copy& c : copies_)
      if (c.valid) {
        host_block();
        c.mem->download(*c.block, ptr, bytes);
        host_valid_ = true;
        break;
      }
  }
  if (host_valid_ && ptr) mem.upload(*mine->block, ptr, bytes);
  mine->valid = true;
  return *mine->block;
}

void Storage::unpin(detail::DeviceMemory& mem) {
  std::lock_guard<std::mutex> lock(data_mu_);
  if (Copy* mine = copy_on(&mem); mine && mine->pins > 0) mine->pins--;
}

size_t Storage::evict(detail::DeviceMemory& mem) {
  std::unique_lock<std::mutex> lock(data_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  // A queued call may be about to use the copy: only a storage no pending call uses goes.
  if (tracked_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> events(mu_);
    if ((writer_ && !writer_->done()) ||
        std::any_of(readers_.begin(), readers_.end(), [](const auto& r) { return !r->done(); }))
      return 0;
  }
  auto it =
      std::find_if(copies_.begin(), copies_.end(), [&](const Copy& c) { return c.mem == &mem; });
  if (it == copies_.end() || it->pins > 0) return 0;
  bool elsewhere = host_valid_;
  for (const Copy& c : copies_) elsewhere = elsewhere || (c.valid && c.mem != &mem);
  if (it->valid && !elsewhere) {
    if (home_.kind != DeviceKind::cpu) return 0;  // a GPU tensor's only copy stays
    host_block();
    mem.download(*it->block, ptr, bytes);
    host_valid_ = true;
  }
  size_t n = it->block->capacity;
  mem.release(it->block);
  copies_.erase(it);
  return n;
}

void Storage::device_failed(detail::DeviceMemory& mem) {
  std::lock_guard<std::mutex> lock(data_mu_);
  Copy* mine = copy_on(&mem);
  if (!mine || !mine->valid) return;
  mine->valid = false;
  bool any = host_valid_;
  for (const Copy& c : copies_) any = any || c.valid;
  if (!any) {  // it was the only copy: keep what the host has (its contents are lost either way)
    host_block();
    host_valid_ = true;
  }
}

void Storage::device_written(detail::DeviceMemory& mem) {
  written_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(data_mu_);
  for (Copy& c : copies_) c.valid = c.mem == &mem;
  host_valid_ = false;
}

size_t Storage::stale_bytes(const detail::DeviceMemory* mem) const {
  if (!on_gpus()) return mem ? bytes : 0;
  std::lock_guard<std::mutex> lock(data_mu_);
  if (!mem) return host_valid_ ? 0 : bytes;
  for (const Copy& c : copies_)
    if (c.mem == mem && c.valid) return 0;
  return bytes;
}

void Storage::add_dependencies(std::vector<detail::Dependency>& deps, bool read, bool write) const {
  std::lock_guard<std::mutex> lock(mu_);
  // A reader inherits the writer's failure even when that is done; an overwrite only waits.
  if (writer_ && (read || !writer_->done())) deps.push_back({writer_, read});
  if (write)
    for (const auto& r : readers_)
      if (!r->done()) deps.push_back({r, false});
}

void Storage::forget_events() {
  std::lock_guard<std::mutex> lock(mu_);
  writer_.reset();
  readers_.clear();
}

void Storage::record(const detail::EventPtr& ev, bool write) {
  if (write) written_.store(true, std::memory_order_release);
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
